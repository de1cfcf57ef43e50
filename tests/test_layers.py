"""The layering contract names every module of the shared base (pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
TOP = {"cli", "lab", "__init__"}


def test_the_contract_covers_every_base_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["name"] == "The base imports nothing from the top"
    ]
    base = {
        f"mesolite.{p.stem}"
        for p in (ROOT / "mesolite").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem not in TOP
    }
    assert set(contract["source_modules"]) == base
