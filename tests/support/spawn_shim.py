"""The supervisor's two ways through to a spawned command, as fixtures: the C exec
helper (`agent/spawn_shim.c`, compiled here from the source as it is now, so a bug
planted in it is what the tests run) and the ``/bin/sh`` shim with setpriv.

A test that takes `shim` runs once per way; the supervisors it starts inherit
``MESOLITE_SPAWN_SHIM`` (`agent/_supervisor.py`), so request `shim` before any
fixture that starts one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mesolite.agent import _supervisor

SOURCE = Path(__file__).absolute().parents[2] / "agent" / "spawn_shim.c"
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")  # as the Makefile's


def build(directory: Path) -> str:
    """The helper compiled into `directory`; skips where there is no C compiler (fails
    under CI, which has one)."""
    compiler = shutil.which("cc")
    if compiler is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler (cc): the C exec helper cannot be tested")
        pytest.skip("no C compiler (cc)")
    binary = directory / "spawn_shim"
    subprocess.run([compiler, *CFLAGS, "-o", str(binary), str(SOURCE)], check=True, timeout=60)
    return str(binary)


@pytest.fixture(scope="session")
def shim_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build(tmp_path_factory.mktemp("spawn-shim"))


@pytest.fixture(params=["c", "sh"])
def shim(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The helper's path ("c") or "" (the sh shim); what supervisors started now use."""
    if request.param == "sh":
        monkeypatch.setenv(_supervisor.SHIM_ENV, "sh")
        return ""
    binary: str = request.getfixturevalue("shim_binary")
    monkeypatch.setenv(_supervisor.SHIM_ENV, binary)
    return binary
