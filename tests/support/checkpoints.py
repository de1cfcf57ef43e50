"""A task's checkpoint as the agent keeps it: its last line in the agent's task log
(`agent/_task_log.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mesolite.agent._task_log import TASK_LOG_FILE, encode, read_checkpoints


def checkpoint_at(records: Path) -> dict[str, Any]:
    """The checkpoint of the task whose records directory is `records`
    (``<work>/meta/FW/TASK``); raises FileNotFoundError if the agent has none."""
    work_dir = records.parent.parent.parent
    record = read_checkpoints(work_dir).get((records.parent.name, records.name))
    if record is None:
        raise FileNotFoundError(f"no checkpoint of {records.parent.name}/{records.name}")
    return record


def all_checkpoints(work_dir: Path) -> list[dict[str, Any]]:
    """Every task's checkpoint in the agent's work dir."""
    return list(read_checkpoints(work_dir).values())


def overwrite_checkpoint(records: Path, record: dict[str, Any]) -> None:
    """Make `record` the checkpoint of the task whose records directory is `records`,
    as the agent would have written it (a line appended to its task log)."""
    with open(records.parent.parent.parent / TASK_LOG_FILE, "ab") as f:
        f.write(encode(record))
