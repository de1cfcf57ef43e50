"""Files written whole or not at all: the one atomic-write helper.

A write goes to a temporary file beside the target, is fsynced, renamed over
the target, and the directory is fsynced, so a crash (even a SIGKILL or a
power loss after the call returns) leaves either the old file or the new one,
never a torn one. Used by the agent's checkpoints, the task wrapper's records
and the SDK's id file. Standard library only: the task wrapper imports it at
every task start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data`, creating its directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def write_json_atomically(path: Path, record: dict[str, Any], mode: int = 0o644) -> None:
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    write_atomically(path, data, mode)


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
