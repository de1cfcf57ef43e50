"""The layering contract names every module of the shared base (pyproject.toml)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

import mesolite

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
# The top (CLI, lab, workloads) and the middle (master, agent, SDK); the rest is the base.
NOT_BASE = {"cli", "lab", "workloads", "master", "agent", "framework_sdk", "__init__"}


def test_the_contract_covers_every_base_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["name"] == "The base imports nothing above it"
    ]
    base = {
        f"mesolite.{p.stem}"
        for p in (ROOT / "mesolite").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem not in NOT_BASE
    }
    assert set(contract["source_modules"]) == base


def test_no_two_public_classes_share_a_name() -> None:
    """Names say which layer they belong to: one `Framework`, one `Agent`, ..."""
    where: dict[str, set[str]] = defaultdict(set)
    for info in pkgutil.walk_packages(mesolite.__path__, "mesolite."):
        if info.name.startswith("mesolite.v1"):
            continue  # generated code
        module = importlib.import_module(info.name)
        for name, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == info.name and not name.startswith("_"):
                where[name].add(info.name)
    assert {name: sorted(m) for name, m in where.items() if len(m) > 1} == {}


def test_code_imports_the_middle_only_through_mesolite() -> None:
    """`master/`, `agent/` and `framework_sdk/` are installed as `mesolite.master`, ...
    (symlinks under `mesolite/`). Imported by their bare names from a checkout they
    would load a second copy of every module, so nothing may."""
    bare = {"master", "agent", "framework_sdk"}
    found = []
    for folder in ("mesolite", "master", "agent", "framework_sdk", "examples", "tests", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found += [f"{where} {name}" for name in names if name.split(".")[0] in bare]
    assert found == []
