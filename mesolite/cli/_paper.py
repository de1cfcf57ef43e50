"""`mesolite experiment properties|paper-example`: the DRF paper's analysis, reproduced
(`mesolite/lab/property_table.py`, `mesolite/lab/paper_example.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

COMMANDS = ("properties", "paper-example")


def add_paper_commands(experiments: Any) -> None:
    """Register the commands under `mesolite experiment` (an argparse subparsers object)."""
    p = experiments.add_parser(
        "properties",
        help="the DRF paper's table of fairness properties for asset fairness, CEEI and DRF, "
        "each property searched for a counterexample by hypothesis",
    )
    p.add_argument(
        "--examples", type=int, default=1000, help="random instances per search (default 1000)"
    )
    p.add_argument("--out", type=Path, default=Path("docs/drf-properties.md"), metavar="FILE")
    e = experiments.add_parser(
        "paper-example",
        help="the paper's example (<9 CPUs, 18 GB>) under asset fairness, CEEI and DRF, drawn",
    )
    e.add_argument("--out", type=Path, default=Path("docs/drf-paper-example.png"), metavar="FILE")


def run_paper_command(args: argparse.Namespace) -> int:
    try:
        import hypothesis  # noqa: F401
        import matplotlib  # noqa: F401
        import scipy  # noqa: F401
    except ImportError as e:
        print(
            f"mesolite experiment {args.experiment} needs {e.name}: pip install 'mesolite[lab]'",
            file=sys.stderr,
        )
        return 2
    if args.experiment == "properties":
        from mesolite.lab import property_table

        return property_table.run(args.out, args.examples)
    from mesolite.lab import paper_example

    return paper_example.run(args.out)
