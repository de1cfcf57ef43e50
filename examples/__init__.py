"""Example frameworks. Run them as scripts (`python examples/batch_framework.py --help`);
from the repository root their classes import as `examples.batch`."""
