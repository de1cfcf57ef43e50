"""Load the master with simulated agents and frameworks: `mesolite bench`, as a script.

    python scripts/bench_master.py throughput --agents 50 --frameworks 4
    python scripts/bench_master.py agents --agents 10000
    python scripts/bench_master.py throughput --compare before=../main --compare after=.

See `mesolite/lab/bench/__init__.py` for what it measures and how. A benchmark, not a
test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesolite.lab.bench import main

if __name__ == "__main__":
    sys.exit(main())
