"""Small JSON checkpoints in the agent's work dir, and the agent's identity among them.

Every checkpoint is written whole or not at all (temporary file, fsync, rename,
fsync of the directory), so a SIGKILL at any moment leaves either the previous
version or the new one. Blocking file I/O: call these through `asyncio.to_thread`.

    <work_dir>/agent.json   {"agent_id": "...", "saved": <unix time>}   (0600)

The work dir itself is 0711 (`secure_work_dir`): tasks, which may run as other
users, pass through it to their sandboxes but cannot list it, and the agent's
files in it are 0600.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from mesolite.files import fsync_directory, write_json_atomically

log = structlog.get_logger(__name__)

AGENT_FILE = "agent.json"
WORK_DIR_MODE = 0o711
PRIVATE_MODE = 0o600

__all__ = [
    "AGENT_FILE",
    "forget_agent_id",
    "load_agent_id",
    "read_json",
    "save_agent_id",
    "secure_work_dir",
    "write_json_atomically",
]


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None when the file does not exist.

    Raises ValueError when the file holds something else.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return record


def load_agent_id(work_dir: Path) -> str | None:
    """The id this agent was registered under, or None when it is new."""
    path = work_dir / AGENT_FILE
    try:
        record = read_json(path)
    except (OSError, ValueError) as e:
        # Unreadable identity: registering as new is the safe way out.
        log.warning("ignoring unreadable agent checkpoint", path=str(path), error=str(e))
        return None
    agent_id = record.get("agent_id") if record else None
    return agent_id if isinstance(agent_id, str) and agent_id else None


def save_agent_id(work_dir: Path, agent_id: str) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    record = {"agent_id": agent_id, "saved": time.time()}
    write_json_atomically(work_dir / AGENT_FILE, record, PRIVATE_MODE)


def secure_work_dir(work_dir: Path, private: Iterable[str]) -> None:
    """Create the work dir if needed, 0711, and make the files named in `private` (if
    there, say from an older agent) 0600. A work dir the agent may not chmod (someone
    else's) is left as it is, with a warning."""
    work_dir.mkdir(mode=WORK_DIR_MODE, parents=True, exist_ok=True)
    try:
        os.chmod(work_dir, WORK_DIR_MODE)
    except OSError as e:
        log.warning("cannot close the work dir to tasks", path=str(work_dir), error=str(e))
    for name in private:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(work_dir / name, PRIVATE_MODE)


def forget_agent_id(work_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(work_dir / AGENT_FILE)
        fsync_directory(work_dir)
