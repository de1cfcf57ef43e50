"""The `mesolite` command: run a master or an agent, a local demo, or look at a master
(`mesolite state|agents|frameworks|roles|tasks`, rendered by mesolite/views.py).

    _args.py    the subcommands and their options
    _main.py    `main`, and running a master, an agent, the demo, an experiment
    _views.py   the view commands: fetch /state, print a view, --watch
    _certs.py   `mesolite certs init|issue|token`: a cluster's certificates
"""

from __future__ import annotations

from mesolite.cli._args import build_parser
from mesolite.cli._main import main

__all__ = ["build_parser", "main"]
