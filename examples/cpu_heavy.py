"""The batch framework with CPU-heavy tasks, <2 CPUs, 512 MB> each: one side of the DRF
paper's example. Every flag of `batch_framework.py` still applies.

    python examples/cpu_heavy.py --master 127.0.0.1:5050 --tasks 20
"""

import sys
from pathlib import Path

if not __package__:  # run as a script: make the `examples` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.batch import BatchSpec, main

PRESET = BatchSpec(name="cpu-heavy", cpus=2.0, mem=512.0)

if __name__ == "__main__":
    sys.exit(main(defaults=PRESET))
