"""The `mesolite` command: run a master or an agent, a local demo, look at a master
(`mesolite state|agents|frameworks|roles|tasks|jobs|services`, rendered by
mesolite/views.py), act on it (`mesolite teardown|kill`), or run a job or a service on
one (`mesolite run FILE`).

    _args.py    the subcommands and their options
    _main.py    `main`, and running a master, an agent, the demo, an experiment
    _views.py   the view commands: fetch /state, print a view, --watch
    _operator.py  `mesolite teardown|kill`: the master's operator API
    _master_http.py  the HTTP requests both make, and their errors
    _certs.py   `mesolite certs init|issue|token`: a cluster's certificates
    _workloads.py  `mesolite run FILE`, `mesolite stop NAME`: the built-in jobs and services
"""

from __future__ import annotations

import os

# grpcio logs every failed TLS handshake at INFO: anyone who can reach a port could
# grow the log without bound (an outside review measured 4.5 MB/s). Set before grpc
# is first imported: `mesolite` and `python -m mesolite.cli` import this package first.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from mesolite.cli._args import build_parser
from mesolite.cli._main import main

__all__ = ["build_parser", "main"]
