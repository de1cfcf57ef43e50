"""Small JSON checkpoints in the agent's work dir, and the agent's identity among them.

Every checkpoint is written whole or not at all (temporary file, fsync, rename,
fsync of the directory), so a SIGKILL at any moment leaves either the previous
version or the new one. Blocking file I/O: call these through `asyncio.to_thread`.

    <work_dir>/agent.json   {"agent_id": "...", "saved": <unix time>}
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import structlog

from mesolite.files import fsync_directory, write_json_atomically

log = structlog.get_logger(__name__)

AGENT_FILE = "agent.json"

__all__ = [
    "AGENT_FILE",
    "forget_agent_id",
    "load_agent_id",
    "read_json",
    "save_agent_id",
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
    write_json_atomically(work_dir / AGENT_FILE, {"agent_id": agent_id, "saved": time.time()})


def forget_agent_id(work_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(work_dir / AGENT_FILE)
        fsync_directory(work_dir)
