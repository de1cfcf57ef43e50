"""`python -m mesolite.cli`, as the `mesolite` command."""

import sys

from mesolite.cli import main

if __name__ == "__main__":
    sys.exit(main())
