"""Load one of the project's scripts (`scripts/NAME.py`) as a module, for a test of its
functions: the scripts are run by path, not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"


def load_script(name: str) -> ModuleType:
    """`scripts/<name>.py` as a fresh module (not left in `sys.modules`)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module
