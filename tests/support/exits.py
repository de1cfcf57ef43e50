"""How a task run's command ended, as the agent's records say: the wrapper's `exit.json`
(wrapper launches), or the supervisor's exit log (commands it spawned itself,
`agent/_exit_log.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mesolite.agent import _exit_log
from tests.support.checkpoints import checkpoint_at

EXIT_FILE = "exit.json"


def exit_record(records: Path) -> dict[str, Any] | None:
    """The end of the run whose records directory is `records` (`<work>/meta/FW/TASK`),
    None if none is recorded for its current run."""
    exit_file = records / EXIT_FILE
    if exit_file.exists():
        record: dict[str, Any] = json.loads(exit_file.read_text())
        return record
    try:
        checkpoint = checkpoint_at(records)
    except FileNotFoundError:
        return None
    if checkpoint.get("launcher") != "spawn":
        return None
    log = _exit_log.read(records.parent.parent.parent / "supervisor")
    spawned = log.spawned.get(checkpoint["run_id"])
    return log.end_of(*spawned) if spawned is not None else None
