"""The layering contract names every module of the shared base (pyproject.toml)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

import agent
import framework_sdk
import master
import mesolite

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


def test_no_two_public_classes_share_a_name() -> None:
    """Names say which layer they belong to: one `Framework`, one `Agent`, ..."""
    where: dict[str, set[str]] = defaultdict(set)
    for package in (mesolite, master, agent, framework_sdk):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith("mesolite.v1"):
                continue  # generated code
            module = importlib.import_module(info.name)
            for name, value in inspect.getmembers(module, inspect.isclass):
                if value.__module__ == info.name and not name.startswith("_"):
                    where[name].add(info.name)
    assert {name: sorted(m) for name, m in where.items() if len(m) > 1} == {}
