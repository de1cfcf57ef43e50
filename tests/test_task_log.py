"""The agent's task log (`agent/_task_log.py`): the last line of a task is its
checkpoint, a torn line is dropped, durable lines are fsynced before they count as
written (in groups), and compaction keeps exactly the tasks the runner still needs."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent._task_log import (
    TASK_LOG_FILE,
    TaskLog,
    TaskLogWriter,
    encode,
    read_checkpoints,
)

pytestmark = pytest.mark.unit


def record(task_id: str, state: str = "TASK_STARTING", **fields: Any) -> dict[str, Any]:
    return {"framework_id": "fw", "task": {"task_id": task_id}, "state": state, **fields}


class Syncs:
    """Every fsync of the log file, with what the file held then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.contents: list[bytes] = []

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(self.path):
            self.contents.append(self.path.read_bytes())


@pytest.fixture
def syncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Syncs]:
    spy = Syncs(tmp_path / TASK_LOG_FILE)
    real = os.fsync

    def fsync(fd: int) -> None:
        spy(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield spy


def test_the_last_line_of_a_task_is_its_checkpoint(tmp_path: Path) -> None:
    log = TaskLog(tmp_path / TASK_LOG_FILE)
    log.append([encode(record("a")), encode(record("b"))], True)
    log.append([encode(record("a", "TASK_RUNNING", pid=7))], False)
    log.close()
    found = read_checkpoints(tmp_path)
    assert found[("fw", "a")]["state"] == "TASK_RUNNING"
    assert found[("fw", "a")]["pid"] == 7
    assert found[("fw", "b")]["state"] == "TASK_STARTING"
    assert (tmp_path / TASK_LOG_FILE).stat().st_mode & 0o777 == 0o600


def test_a_torn_last_line_is_dropped_and_the_file_rewritten(tmp_path: Path) -> None:
    path = tmp_path / TASK_LOG_FILE
    whole = encode(record("a", "TASK_RUNNING"))
    path.write_bytes(encode(record("a")) + encode(record("b")) + whole[: len(whole) // 2])
    log = TaskLog(path)
    latest = log.load()
    assert json.loads(latest[("fw", "a")])["state"] == "TASK_STARTING"
    # Rewritten: the next line does not glue onto the torn one.
    log.append([encode(record("c"))], True)
    log.close()
    assert set(read_checkpoints(tmp_path)) == {("fw", "a"), ("fw", "b"), ("fw", "c")}
    assert log.lines == 3


def test_a_last_line_without_its_newline_is_not_glued_to(tmp_path: Path) -> None:
    path = tmp_path / TASK_LOG_FILE
    path.write_bytes(encode(record("a")).rstrip(b"\n"))  # cut just before the newline
    log = TaskLog(path)
    log.load()
    log.append([encode(record("b"))], True)
    log.close()
    assert set(read_checkpoints(tmp_path)) == {("fw", "a"), ("fw", "b")}


async def test_a_durable_checkpoint_is_fsynced_before_it_counts_as_written(
    tmp_path: Path, syncs: Syncs
) -> None:
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: set())
    line = encode(record("a"))
    assert await writer.write(record("a"), durable=True)
    assert syncs.contents and line in syncs.contents[-1]
    before = len(syncs.contents)
    assert await writer.write(record("a", "TASK_RUNNING"), durable=False)
    assert len(syncs.contents) == before  # a pid is of no use after a crash: no fsync
    writer.close()


async def test_checkpoints_submitted_together_share_one_fsync(tmp_path: Path, syncs: Syncs) -> None:
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: set())
    assert await writer.write(record("first"))  # the file exists: no more directory fsyncs
    before = len(syncs.contents)
    futures = [writer.write(record(f"t{i}")) for i in range(50)]
    assert all(await asyncio.gather(*futures))
    # The first in a write of its own, the 49 queued meanwhile in one more.
    assert len(syncs.contents) - before <= 2
    assert all(encode(record(f"t{i}")) in syncs.contents[-1] for i in range(50))
    writer.close()


async def test_writes_land_in_submission_order(tmp_path: Path) -> None:
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: set())
    states = ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"]
    futures = [writer.write(record("a", s), durable=s != "TASK_RUNNING") for s in states]
    await asyncio.gather(*futures)
    writer.close()
    assert read_checkpoints(tmp_path)[("fw", "a")]["state"] == "TASK_FINISHED"


async def test_compaction_keeps_the_tasks_still_needed_and_drops_the_rest(
    tmp_path: Path,
) -> None:
    live = {("fw", "live")}
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: live, compact_at=8)
    await writer.write(record("live"))
    for i in range(10):
        await writer.write(record(f"acked{i}", "TASK_FINISHED"))
    await writer.write(record("live", "TASK_RUNNING", pid=9))
    writer.close()
    lines = (tmp_path / TASK_LOG_FILE).read_bytes().splitlines()
    assert len(lines) < 8
    found = read_checkpoints(tmp_path)
    assert found[("fw", "live")]["pid"] == 9
    assert ("fw", "acked0") not in found


async def test_no_compaction_while_a_recovery_has_not_said_what_it_keeps(
    tmp_path: Path,
) -> None:
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: set(), compact_at=4)
    writer.may_compact = False
    for i in range(10):
        await writer.write(record(f"t{i}"))
    writer.close()
    assert len(read_checkpoints(tmp_path)) == 10


async def test_a_writer_on_an_existing_file_keeps_what_it_holds(tmp_path: Path) -> None:
    """A runner that never recovered (no `load`) still reads the file before its first
    write, so a compaction cannot drop a task the file holds that it must keep."""
    path = tmp_path / TASK_LOG_FILE
    path.write_bytes(b"".join(encode(record(f"old{i}")) for i in range(6)))
    keep = {("fw", f"old{i}") for i in range(6)}
    writer = TaskLogWriter(TaskLog(path), lambda: keep, compact_at=4)
    for i in range(8):
        await writer.write(record(f"old{i % 6}", "TASK_RUNNING"))
    writer.close()
    assert set(read_checkpoints(tmp_path)) == keep


async def test_a_failed_write_resolves_false_and_the_next_rewrites_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = TaskLog(tmp_path / TASK_LOG_FILE)
    writer = TaskLogWriter(log, lambda: {("fw", "a"), ("fw", "b")})
    assert await writer.write(record("a"))
    real = os.write
    calls = {"n": 0}

    def torn_write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real(fd, bytes(data)[:10])  # part of a line, then the disk fails
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", torn_write)
    assert not await writer.write(record("b"))
    assert await writer.write(record("b", "TASK_RUNNING"))
    writer.close()
    found = read_checkpoints(tmp_path)
    assert set(found) == {("fw", "a"), ("fw", "b")}
    assert found[("fw", "b")]["state"] == "TASK_RUNNING"


async def test_a_log_that_cannot_be_read_or_written_fails_the_write_not_the_writer(
    tmp_path: Path,
) -> None:
    (tmp_path / TASK_LOG_FILE).mkdir()  # neither readable nor writable as a file
    writer = TaskLogWriter(TaskLog(tmp_path / TASK_LOG_FILE), lambda: set())
    assert await writer.write(record("a")) is False
    (tmp_path / TASK_LOG_FILE).rmdir()
    assert await writer.write(record("a", "TASK_RUNNING")) is True
    writer.close()
    assert read_checkpoints(tmp_path)[("fw", "a")]["state"] == "TASK_RUNNING"
