"""Cgroups that tests create: every agent a test starts puts its tasks' cgroups under
`TEST_CGROUPS_ROOT`, one name per test session, and `remove_tree` kills whatever is
left in that tree and removes it (the session fixture in `tests/conftest.py` does at
the end, the isolation tests' fixtures after each test)."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from mesolite.agent._cgroups import parse_mounts
from mesolite.agent._task_wrapper import kill_cgroup
from mesolite.agent.isolation import IsolationConfig

TEST_CGROUPS_ROOT = f"mesolite-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
DEFAULT_CGROUPS_ROOT = IsolationConfig().cgroups_root
# Agents in tests: cgroups where the machine has them, under the session's root.
TEST_ISOLATION = IsolationConfig(cgroups_root=TEST_CGROUPS_ROOT)


def hierarchy_mounts() -> list[Path]:
    """Every cgroup mount of this machine (v1 hierarchies and the v2 one)."""
    try:
        v2, v1 = parse_mounts(Path("/proc/self/mounts").read_text())
    except OSError:
        return []
    return sorted({*v1.values(), *([v2] if v2 else [])})


def remove_tree(root: str) -> int:
    """Kill every process in the cgroups under `root` and remove them; returns how
    many cgroups there were. Deepest first, in every hierarchy."""
    removed = 0
    for mount in hierarchy_mounts():
        top = mount / root
        if not top.is_dir():
            continue
        for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
            path = Path(directory)
            kill_cgroup([path], timeout=5.0)
            with contextlib.suppress(OSError):
                path.rmdir()
                removed += 1
    return removed


def leftover(root: str) -> list[Path]:
    """Cgroup directories under `root` in any hierarchy (none once cleaned up)."""
    return [
        Path(d)
        for mount in hierarchy_mounts()
        if (mount / root).is_dir()
        for d, _, _ in os.walk(mount / root)
    ]
