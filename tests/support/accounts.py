"""Throwaway Unix accounts, for tests that need real, distinct, unprivileged users (a
framework's user, `FrameworkInfo.user`): this machine, like CI, has only system
accounts (daemon, bin, nobody...), and one user per team is the point.

`throwaway_accounts(n)` makes `n` system accounts, each with a group of its own and
no home or login shell (``useradd --system --no-create-home --user-group --shell
<nologin> mesolite-t-<random>``), and deletes them (``userdel``) when the block ends,
however it ends. It skips the test, saying why, when it cannot: not root, no
``useradd``/``userdel``. The `unix_users` fixture (`tests/conftest.py`) gives two.

Nothing here removes an account it did not make: tests of other sessions may be using
theirs. An account left by a session that was SIGKILLed keeps its `mesolite-t-`
prefix, so it can be found (``getent passwd | grep ^mesolite-t-``) and removed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import structlog

log = structlog.get_logger(__name__)

PREFIX = "mesolite-t-"
# useradd and userdel take a lock on /etc/passwd; another session may hold it a moment.
_LOCKED = 10  # their exit status for "cannot lock /etc/passwd"
_ATTEMPTS = 20
_RETRY_AFTER = 0.1


def _nologin() -> str:
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        if os.path.exists(shell):
            return shell
    return "/bin/false"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv`, again while the account files are locked by someone else."""
    for _ in range(_ATTEMPTS):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != _LOCKED:
            return done
        time.sleep(_RETRY_AFTER)  # a lock held by another process: nothing to wait on
    return done


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _delete(name: str) -> None:
    done = _run(["userdel", name])
    if done.returncode != 0 and _exists(name):
        # Say, a process of the account is still alive: remove the account all the same.
        done = _run(["userdel", "--force", name])
    if _exists(name):
        log.error("a test account could not be deleted", user=name, stderr=done.stderr.strip())


@contextlib.contextmanager
def throwaway_accounts(count: int) -> Iterator[list[str]]:
    """`count` new unprivileged accounts (names), deleted when the block ends."""
    if os.geteuid() != 0:
        pytest.skip("making throwaway Unix accounts needs root")
    missing = [tool for tool in ("useradd", "userdel") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"making throwaway Unix accounts needs {' and '.join(missing)}")
    made: list[str] = []
    try:
        for _ in range(count):
            name = f"{PREFIX}{secrets.token_hex(4)}"
            done = _run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--user-group",
                    "--shell",
                    _nologin(),
                    name,
                ]
            )
            if done.returncode != 0:
                raise RuntimeError(f"useradd {name} failed: {done.stderr.strip()}")
            made.append(name)
        yield made
    finally:
        for name in made:
            _delete(name)
