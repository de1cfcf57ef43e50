"""The agent's checkpoints of its task runs, in one append-only file.

    <work_dir>/tasks.jsonl     (0600: a task's environment is in it)

One JSON object per line, each a task run's whole checkpoint as of that moment (what
`checkpoint_record` in `agent/_task_records.py` gives: the task, its run id, its
records directory, its pid and start time, its container, its state, ``killing``
and, once it ended, how). A task's checkpoint is its last line: a later state of
the same run, or a later run of the same task id, supersedes what came before.

Why one file: a file per task (``task.json``, written whole: temporary file, fsync,
rename, fsync of the directory) cost every run three file creations, three renames
and four fsyncs, and that kernel time was the largest part of the agent's CPU per
task. Here a checkpoint is one line appended, and `TaskLogWriter` commits in groups:
everything submitted while one write is under way goes into the next, in one
`write` and, if any of it must be durable, one fsync for all. Nothing needs a
directory fsync but the file's creation.

A crash in the middle of an append leaves a torn last line, which `load` skips;
the file is then rewritten, so that the next line does not glue onto the torn
one (a failed write while the agent runs does the same at the next commit). Once
the file holds more than `COMPACT_AT` lines, and twice as many as the last
compaction left, the writer rewrites it atomically (temporary file, fsync,
rename, directory fsync) with the last line of each task the runner still needs
(`keep`: active, or ended with its end not yet acknowledged), so the file stays
small. Checkpoints of agents from before this file (``task.json`` in the records
directories) are read by the task runner's recovery, which moves them here.

Blocking I/O is `TaskLog`'s; `TaskLogWriter` is its only writer, on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable, Set
from pathlib import Path
from typing import Any

import structlog

from mesolite.agent._task_records import TaskRun, TaskTransition, checkpoint_record, off_loop
from mesolite.files import fsync_directory

log = structlog.get_logger(__name__)

TASK_LOG_FILE = "tasks.jsonl"
PRIVATE_MODE = 0o600  # the agent's alone: it holds the tasks' environments
COMPACT_AT = 4096  # lines; and only once they are twice what the last compaction left

TaskKey = tuple[str, str]  # (framework id, task id)


def record_key(record: Any) -> TaskKey:
    """The task a checkpoint belongs to; raises KeyError or TypeError."""
    framework_id, task_id = record["framework_id"], record["task"]["task_id"]
    if not isinstance(framework_id, str) or not isinstance(task_id, str):
        raise TypeError("a checkpoint names its framework and task by strings")
    return framework_id, task_id


def encode(record: dict[str, Any]) -> bytes:
    """One line of the file (compact: the C encoder, not the pure-Python one)."""
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def parse(data: bytes) -> tuple[dict[TaskKey, bytes], int, bool]:
    """The last line of each task in `data`, how many good lines there were, and
    whether any line was torn or damaged (or the last one lacks its newline)."""
    latest: dict[TaskKey, bytes] = {}
    good, damaged = 0, bool(data) and not data.endswith(b"\n")
    for line in data.splitlines():
        try:
            key = record_key(json.loads(line))
        except (ValueError, KeyError, TypeError):
            damaged = True
            continue
        latest[key] = line + b"\n"
        good += 1
    return latest, good, damaged


def read_checkpoints(work_dir: Path) -> dict[TaskKey, dict[str, Any]]:
    """Every task's checkpoint in the file under `work_dir` (none: no file). Blocking."""
    try:
        data = (Path(work_dir) / TASK_LOG_FILE).read_bytes()
    except FileNotFoundError:
        return {}
    return {key: json.loads(line) for key, line in parse(data)[0].items()}


class TaskLog:
    """The file: appends, rewrites, and reading it back. Blocking; one writer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # in the file
        self.damaged = False  # the next commit must rewrite the file whole
        self._fd: int | None = None

    def load(self) -> dict[TaskKey, bytes]:
        """The last line of each task in the file; rewrites a damaged file."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        latest, self.lines, damaged = parse(data)
        if damaged:
            log.warning("dropping a torn or damaged task checkpoint", path=str(self.path))
            self.rewrite(latest.values())
        return latest

    def append(self, lines: list[bytes], durable: bool) -> None:
        """Append `lines` in one write; fsync them if `durable`."""
        fd = self._open()
        data = memoryview(b"".join(lines))
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            self.damaged = True  # maybe a part of a line: rewrite at the next commit
            raise
        if durable:
            os.fsync(fd)
        self.lines += len(lines)

    def rewrite(self, lines: Iterable[bytes]) -> None:
        """Replace the file with `lines`, atomically and durably."""
        lines = list(lines)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_MODE)
        try:
            data = memoryview(b"".join(lines))
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        self.close()
        self.lines, self.damaged = len(lines), False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.path, flags, PRIVATE_MODE)
            if created:
                fsync_directory(self.path.parent)
        return self._fd


class TaskLogWriter:
    """The file's only writer, on the event loop, committing in groups.

    `write` queues a checkpoint and returns a future that resolves (True) once it is
    written, and fsynced if `durable`; False if writing failed (logged: the task goes
    on, only a restarted agent would know less) or the writer was cancelled. The
    records are taken as they are when submitted and written in submission order, so
    an older view of a run never lands after a newer one. `keep` names the tasks whose
    checkpoints a compaction keeps.
    """

    def __init__(
        self, log: TaskLog, keep: Callable[[], Set[TaskKey]], *, compact_at: int = COMPACT_AT
    ) -> None:
        self._log = log
        self._keep = keep
        self._compact_at = compact_at
        self._latest: dict[TaskKey, bytes] = {}  # each task's last line, as submitted
        self._compacted = 0  # lines the last compaction left (or the file had at load)
        self._loaded = False
        self._queue: list[tuple[bytes, bool, asyncio.Future[bool]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.may_compact = True  # False while a recovery has not yet said what it keeps

    async def load(self) -> dict[TaskKey, dict[str, Any]]:
        """Every task's checkpoint in the file (call before any write: recovery)."""
        await self._load()
        return {key: json.loads(line) for key, line in self._latest.items()}

    def write(self, record: dict[str, Any], *, durable: bool = True) -> asyncio.Future[bool]:
        line = encode(record)
        self._latest[record_key(record)] = line
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._queue.append((line, durable, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="mesolite-task-log")
        return future

    async def checkpoint(
        self, t: TaskRun, final: TaskTransition | None = None, *, durable: bool = True
    ) -> bool:
        """Write the run's checkpoint as of now (with `final`, as ended). Not `durable`:
        written but not fsynced, for what only matters while the task's processes live
        (its pid), which a crash of the machine ends too."""
        return await self.write(checkpoint_record(t, final), durable=durable)

    async def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        while self._flusher is not None:
            await asyncio.wait({self._flusher})

    def close(self) -> None:
        self._log.close()

    async def _load(self) -> None:
        if not self._loaded:
            loaded = await off_loop(self._log.load)
            self._loaded = True
            self._compacted = len(loaded)
            # Lines submitted before are newer than the file's.
            self._latest = {**loaded, **self._latest}

    async def _flush(self) -> None:
        batch: list[tuple[bytes, bool, asyncio.Future[bool]]] = []
        try:
            try:
                await self._load()
            except OSError as e:  # unreadable: appended to all the same (and read again)
                log.warning("could not read the task checkpoints", error=str(e))
            while self._queue:
                batch, self._queue = self._queue, []
                lines = [line for line, _, _ in batch]
                durable = any(d for _, d, _ in batch)
                # Taken now, with this batch's lines and none submitted after it.
                rewrite = self._compaction(len(lines))
                try:
                    if rewrite is not None:
                        await off_loop(self._log.rewrite, rewrite)
                    else:
                        await off_loop(self._log.append, lines, durable)
                    ok = True
                except OSError as e:
                    log.warning("could not write task checkpoints", count=len(batch), error=str(e))
                    ok = False
                for _, _, future in batch:
                    if not future.done():
                        future.set_result(ok)
                batch = []
        finally:
            # Cancelled (the loop is closing): what was not written is not.
            self._flusher = None
            for _, _, future in batch + self._queue:
                if not future.done():
                    future.set_result(False)
            self._queue = []

    def _compaction(self, adding: int) -> list[bytes] | None:
        """The lines to rewrite the file with, if it is due (or damaged); else None."""
        if not self.may_compact:
            return list(self._latest.values()) if self._log.damaged else None
        lines = self._log.lines + adding
        if not self._log.damaged and lines <= max(self._compact_at, 2 * self._compacted):
            return None
        keep = self._keep()
        self._latest = {key: line for key, line in self._latest.items() if key in keep}
        self._compacted = len(self._latest)
        return list(self._latest.values())


__all__ = [
    "COMPACT_AT",
    "TASK_LOG_FILE",
    "TaskLog",
    "TaskLogWriter",
    "read_checkpoints",
    "record_key",
]
