"""Run a batch of identical tasks on a mesolite cluster.

    python examples/batch_framework.py --master 127.0.0.1:5050 --name batch \\
        --cpus 1 --mem 256 --duration 5 --tasks 20

`--tasks 0` keeps the cluster busy until interrupted. The framework itself is
`examples.batch.BatchFramework`.
"""

import sys
from pathlib import Path

if not __package__:  # run as a script: make the `examples` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.batch import main

if __name__ == "__main__":
    sys.exit(main())
