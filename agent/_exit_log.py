"""The supervisor's exit log: which commands it spawned, and how each ended, in one
append-only file.

    <work_dir>/supervisor/exits.jsonl     (0600; exits.1.jsonl: the generation before)

One JSON object per line:

    {"op": "spawned", "run": R, "records": DIR, "pid": P, "start_time": T}
    {"op": "exited", "pid": P, "start_time": T, "exit_code": N | "signal": N | "error": "...",
     "finished": <unix time>}

The supervisor (`agent/_supervisor.py`) spawns a task's command itself, so it is the
one process that learns the command's exit status, and it writes it here before it
tells the agent. Writes are grouped: everything one turn of its loop has to say goes
in one write, with one fsync if an end is among it (group commit), so an end the
agent heard of is on disk, whatever dies next. A "spawned" line names a live process
and is written (not fsynced) before the agent hears the pid: an agent that died before
it checkpointed the pid finds it here. If the supervisor itself dies, its keeper (the
process it was forked from, their subreaper) inherits the commands and writes their
ends here instead. An "exited" line is in the shape of a wrapper's ``exit.json``
(`agent/_task_wrapper.py`): `returncode_of` reads both.

A crash in the middle of an append leaves a torn last line, which `read` skips. After
`ROTATE_LINES` lines the file becomes ``exits.1.jsonl`` (replacing the one before) and
a new one starts: a line is needed only until the agent has checkpointed the task's
end, which it does as soon as it hears of it, so two generations (at least
`ROTATE_LINES` spawns) cover every task that can still be running or unreported.

Standard library only: the supervisor imports it without the agent's package.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXITS_NAME = "exits.jsonl"
PREVIOUS_NAME = "exits.1.jsonl"
ROTATE_LINES = 100_000
_MODE = 0o600


def exit_record(pid: int, start_time: int | None, wait_status: int) -> dict[str, Any]:
    """The "exited" line for a command reaped with `wait_status`."""
    record: dict[str, Any] = {"op": "exited", "pid": pid, "start_time": start_time}
    if os.WIFSIGNALED(wait_status):
        record["signal"] = os.WTERMSIG(wait_status)
    else:
        record["exit_code"] = os.waitstatus_to_exitcode(wait_status)
    record["finished"] = time.time()
    return record


def error_record(pid: int, start_time: int | None, error: str) -> dict[str, Any]:
    """The "exited" line for a command that could not be started (confined)."""
    return {
        "op": "exited",
        "pid": pid,
        "start_time": start_time,
        "error": error,
        "finished": time.time(),
    }


class ExitLogWriter:
    """Appends to the log in `directory`, a batch of lines at a time. Blocking."""

    def __init__(self, directory: Path, *, rotate_lines: int = ROTATE_LINES) -> None:
        self._directory = directory
        self._rotate_lines = rotate_lines
        self._pending: list[bytes] = []
        self._durable = False  # whether a pending line must be fsynced
        self._fd = self._open()
        with open(directory / EXITS_NAME, "rb") as f:
            self._lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))

    def add(self, record: dict[str, Any], *, durable: bool) -> None:
        """Queue a line for the next `commit`; `durable`: it must be fsynced there."""
        self._pending.append(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        self._durable = self._durable or durable

    def commit(self) -> None:
        """Write every queued line in one append; fsync once if one of them must be."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        lines, durable = len(self._pending), self._durable
        self._pending, self._durable = [], False
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        if durable:
            os.fsync(self._fd)
        self._lines += lines
        if self._lines >= self._rotate_lines:
            self._rotate()

    def close(self) -> None:
        os.close(self._fd)

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        return os.open(self._directory / EXITS_NAME, flags, _MODE)

    def _rotate(self) -> None:
        os.fsync(self._fd)
        os.replace(self._directory / EXITS_NAME, self._directory / PREVIOUS_NAME)
        os.close(self._fd)
        self._fd = self._open()
        self._lines = 0
        fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class ExitLog:
    """What the log says: the spawned commands by task run, their ends by process."""

    spawned: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> pid, start
    exits: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    def end_of(self, pid: int, start_time: int) -> dict[str, Any] | None:
        return self.exits.get((pid, start_time))


def read(directory: Path) -> ExitLog:
    """Both generations of the log in `directory` (none: an empty log). Blocking."""
    log = ExitLog()
    for name in (PREVIOUS_NAME, EXITS_NAME):
        with contextlib.suppress(FileNotFoundError):
            for line in (directory / name).read_bytes().splitlines():
                try:
                    record = json.loads(line)
                    pid, start_time = record["pid"], record["start_time"]
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line, or not one of ours
                if not isinstance(pid, int) or not isinstance(start_time, int):
                    continue
                if record.get("op") == "spawned" and isinstance(record.get("run"), str):
                    log.spawned[record["run"]] = (pid, start_time)
                elif record.get("op") == "exited":
                    log.exits[(pid, start_time)] = record
    return log


__all__ = [
    "EXITS_NAME",
    "PREVIOUS_NAME",
    "ExitLog",
    "ExitLogWriter",
    "error_record",
    "exit_record",
    "read",
]
