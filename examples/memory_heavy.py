"""The batch framework with memory-heavy tasks, <0.5 CPU, 4096 MB> each: the other side
of the DRF paper's example. Every flag of `batch_framework.py` still applies.

    python examples/memory_heavy.py --master 127.0.0.1:5050 --tasks 20
"""

import sys
from pathlib import Path

if not __package__:  # run as a script: make the `examples` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.batch import BatchSpec, main

PRESET = BatchSpec(name="memory-heavy", cpus=0.5, mem=4096.0)

if __name__ == "__main__":
    sys.exit(main(defaults=PRESET))
