"""The agent's durable record of the status updates nobody has acknowledged yet.

    <work_dir>/status_updates.jsonl

One JSON object per line; each update is appended, and fsynced, before it is
first sent, and each acknowledgement is appended when it arrives:

    {"op": "update", "run_id": "<the task run>", "status": {<TaskStatus fields>}}
    {"op": "ack", "framework_id": "...", "task_id": "...", "update_id": "..."}

Replaying the file from the top gives the pending updates in the order they
were made, so a restarted agent re-sends them per task in order and with their
original update ids (the framework SDK shows an update id once). A crash in the
middle of an append leaves a torn last line, which replay drops: that update
was never sent. Once records outnumber pending updates by far, the file is
rewritten atomically with only the pending ones, so it stays small.

Why this and not SQLite or a file per task: the pending set is small and only
ever appended to or replayed whole, so an append-only log is the whole of what
is needed, costs one write and one fsync per batch of updates (the writer below
commits everything queued at once), and can be read with `cat`. A file per
task stream would be Mesos' layout, but updates for launches refused before a
sandbox exists (invalid ids) would need a second home.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from mesolite.files import fsync_directory
from mesolite.model import StatusSource, TaskState, TaskStatus

log = structlog.get_logger(__name__)

JOURNAL_FILE = "status_updates.jsonl"
PRIVATE_MODE = 0o600  # the agent's alone: tasks run as other users on the same machine
_COMPACT_AT = 256  # records; and whenever they are more than twice the pending updates


@dataclass(frozen=True, slots=True)
class PendingUpdate:
    """An update as journaled: the status and the task run it belongs to ("" for none)."""

    status: TaskStatus
    run_id: str = ""


@dataclass(frozen=True, slots=True)
class Ack:
    framework_id: str
    task_id: str
    update_id: str


Record = PendingUpdate | Ack


class UpdateJournal:
    """The journal file and, in memory, the pending updates it holds. Blocking I/O."""

    def __init__(self, path: Path, *, compact_at: int = _COMPACT_AT) -> None:
        self.path = path
        self._compact_at = compact_at
        self._pending: dict[str, PendingUpdate] = {}  # by update id, in journal order
        self._records = 0  # lines in the file

    @property
    def pending(self) -> list[PendingUpdate]:
        return list(self._pending.values())

    def load(self) -> list[PendingUpdate]:
        """Replay the file; returns the pending updates in the order they were made."""
        self._pending.clear()
        self._records = 0
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        damaged = False
        for number, line in enumerate(lines, 1):
            try:
                record = _record_from_json(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                damaged = True
                if number == len(lines):
                    log.warning("dropping a torn last journal record", path=str(self.path))
                else:
                    log.error(
                        "skipping a damaged journal record",
                        path=str(self.path),
                        line=number,
                        error=str(e),
                    )
                continue
            self._apply(record)
            self._records += 1
        if damaged:
            # Appending after a torn line would glue the next record to it.
            self.compact()
        return self.pending

    def append(self, records: Sequence[Record]) -> None:
        """Append `records` and fsync them; compacts when the file has grown stale."""
        if not records:
            return
        created = not self.path.exists()
        data = b"".join(json.dumps(_record_to_json(r)).encode() + b"\n" for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_MODE)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_directory(self.path.parent)
        for record in records:
            self._apply(record)
        self._records += len(records)
        if self._records > max(self._compact_at, 2 * len(self._pending)):
            self.compact()

    def compact(self) -> None:
        """Rewrite the file with only the pending updates."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        pending = self.pending
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
        with open(fd, "wb") as f:
            for update in pending:
                f.write(json.dumps(_record_to_json(update)).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_directory(self.path.parent)
        self._records = len(pending)

    def reset(self) -> None:
        """Forget every pending update (the master no longer knows their tasks)."""
        self._pending.clear()
        self.compact()

    def _apply(self, record: Record) -> None:
        if isinstance(record, PendingUpdate):
            self._pending[record.status.update_id] = record
        else:
            self._pending.pop(record.update_id, None)


class JournalWriter:
    """The journal's only writer, a task on the event loop.

    Records submitted are appended in submission order, in batches: everything
    queued while one batch is being written goes into the next, with one fsync.
    After a batch is durable, `on_durable` is called for each of its updates, in
    order, and then their futures are resolved. If the disk fails, the error is
    logged and the updates go on undurably: late is better than never.
    """

    def __init__(self, journal: UpdateJournal, on_durable: Callable[[PendingUpdate], None]) -> None:
        self._journal = journal
        self._on_durable = on_durable
        self._queue: asyncio.Queue[tuple[_Item, asyncio.Future[None]]] = asyncio.Queue()
        self._backlog = 0

    @property
    def backlog(self) -> int:
        """Updates submitted but not yet handed to `on_durable`."""
        return self._backlog

    def submit(self, record: Record) -> asyncio.Future[None]:
        """Queue `record`; the future resolves once it is on disk (or writing failed)."""
        if isinstance(record, PendingUpdate):
            self._backlog += 1
        return self._put(record)

    async def reset(self) -> None:
        """Once everything submitted before is written, empty the journal."""
        await self._put(_RESET)

    async def flush(self) -> None:
        """Wait until everything submitted so far has been written."""
        await self._put(_BARRIER)

    async def run(self) -> None:
        batch: list[tuple[_Item, asyncio.Future[None]]] = []
        try:
            while True:
                batch = [await self._queue.get()]
                while not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                await self._write(batch)
                batch = []
        finally:
            # Nobody will write these any more; let their waiters go.
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for _, future in batch:
                future.cancel()

    def _put(self, item: _Item) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return future

    async def _write(self, batch: list[tuple[_Item, asyncio.Future[None]]]) -> None:
        segment: list[tuple[_Item, asyncio.Future[None]]] = []
        for item, future in batch:
            if item is _RESET:
                # What came before the reset is written and handed on first.
                await self._commit(segment)
                segment = []
                await self._run_io(self._journal.reset)
            segment.append((item, future))
        await self._commit(segment)

    async def _commit(self, segment: list[tuple[_Item, asyncio.Future[None]]]) -> None:
        records = [item for item, _ in segment if not isinstance(item, _Marker)]
        if records:
            await self._run_io(lambda: self._journal.append(records))
        for item, future in segment:
            if isinstance(item, PendingUpdate):
                self._backlog -= 1
                try:
                    self._on_durable(item)
                except Exception:
                    log.exception("handing on a journaled update failed")
            if not future.done():
                future.set_result(None)

    async def _run_io(self, io: Callable[[], None]) -> None:
        try:
            await asyncio.to_thread(io)
        except Exception as e:
            log.error("could not write the status update journal", error=str(e))


class _Marker:
    pass


_RESET = _Marker()
_BARRIER = _Marker()
_Item = Record | _Marker


def _record_to_json(record: Record) -> dict[str, Any]:
    if isinstance(record, Ack):
        return {
            "op": "ack",
            "framework_id": record.framework_id,
            "task_id": record.task_id,
            "update_id": record.update_id,
        }
    s = record.status
    return {
        "op": "update",
        "run_id": record.run_id,
        "status": {
            "task_id": s.task_id,
            "framework_id": s.framework_id,
            "agent_id": s.agent_id,
            "state": s.state.value,
            "message": s.message,
            "exit_code": s.exit_code,
            "timestamp": s.timestamp,
            "update_id": s.update_id,
            "source": s.source.value,
            "reason": s.reason,
        },
    }


def _record_from_json(data: Any) -> Record:
    if not isinstance(data, dict):
        raise TypeError("a journal record must be a JSON object")
    if data["op"] == "ack":
        return Ack(_str(data["framework_id"]), _str(data["task_id"]), _str(data["update_id"]))
    if data["op"] != "update":
        raise ValueError(f"unknown journal record {data['op']!r}")
    s = data["status"]
    exit_code = s["exit_code"]
    if exit_code is not None and not isinstance(exit_code, int):
        raise TypeError("exit_code must be an integer or null")
    status = TaskStatus(
        task_id=_str(s["task_id"]),
        framework_id=_str(s["framework_id"]),
        agent_id=_str(s["agent_id"]),
        state=TaskState(s["state"]),
        message=_str(s["message"]),
        exit_code=exit_code,
        timestamp=float(s["timestamp"]),
        update_id=_str(s["update_id"]),
        source=StatusSource(s["source"]),
        reason=_str(s.get("reason", "")),  # journals from before reasons have none
    )
    if not status.update_id:
        raise ValueError("a journaled update needs its update id")
    return PendingUpdate(status, _str(data.get("run_id", "")))


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value
