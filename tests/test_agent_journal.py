"""The status update journal: replay, torn records, compaction, and its writer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from mesolite.agent._journal import Ack, JournalWriter, PendingUpdate, UpdateJournal
from mesolite.model import StatusSource, TaskState, TaskStatus


def update(task_id: str, update_id: str, state: TaskState = TaskState.RUNNING) -> PendingUpdate:
    status = TaskStatus(
        task_id,
        "fw",
        "agent-1",
        state,
        message="m",
        exit_code=3 if state is TaskState.FAILED else None,
        timestamp=12.5,
        update_id=update_id,
        source=StatusSource.AGENT,
    )
    return PendingUpdate(status, run_id=f"run-{task_id}")


def ack(task_id: str, update_id: str) -> Ack:
    return Ack("fw", task_id, update_id)


def ids(updates: list[PendingUpdate]) -> list[str]:
    return [u.status.update_id for u in updates]


def test_replay_gives_unacknowledged_updates_in_order(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = UpdateJournal(path)
    journal.append([update("t1", "a"), update("t2", "b")])
    journal.append([update("t1", "c", TaskState.FAILED), ack("t1", "a")])

    replayed = UpdateJournal(path).load()
    assert ids(replayed) == ["b", "c"]
    assert replayed[1] == update("t1", "c", TaskState.FAILED)  # every field survives


def test_a_torn_last_record_is_dropped_and_the_file_repaired(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    UpdateJournal(path).append([update("t1", "a")])
    with path.open("a") as f:
        f.write('{"op": "update", "run_id": "r", "sta')  # SIGKILL in the middle of a write

    journal = UpdateJournal(path)
    assert ids(journal.load()) == ["a"]
    journal.append([update("t1", "b")])
    assert ids(UpdateJournal(path).load()) == ["a", "b"]


def test_a_damaged_record_in_the_middle_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    UpdateJournal(path).append([update("t1", "a")])
    with path.open("a") as f:
        f.write('{"op": "update", "status": {"state": "NOT_A_STATE"}}\n')
    UpdateJournal(path).append([update("t2", "b")])
    assert ids(UpdateJournal(path).load()) == ["a", "b"]


def test_compaction_keeps_only_pending_updates(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = UpdateJournal(path, compact_at=10)
    journal.append([update("keep", "k")])
    for n in range(20):
        journal.append([update("t", f"u{n}"), ack("t", f"u{n}")])
    lines = path.read_text().splitlines()
    assert len(lines) <= 10
    assert ids(UpdateJournal(path).load()) == ["k"]
    assert [json.loads(line)["op"] for line in lines].count("update") >= 1


def test_reset_forgets_everything(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = UpdateJournal(path)
    journal.append([update("t1", "a")])
    journal.reset()
    assert UpdateJournal(path).load() == []


def test_a_missing_journal_is_empty(tmp_path: Path) -> None:
    assert UpdateJournal(tmp_path / "none.jsonl").load() == []


async def test_writer_hands_on_updates_in_order_once_durable(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    durable: list[str] = []

    def on_durable(u: PendingUpdate) -> None:
        # Durable means: on disk before it is handed on.
        assert u.status.update_id in ids(UpdateJournal(path).load())
        durable.append(u.status.update_id)

    writer = JournalWriter(UpdateJournal(path), on_durable)
    runner = asyncio.create_task(writer.run())
    try:
        futures = [writer.submit(update("t1", f"u{n}")) for n in range(5)]
        assert writer.backlog == 5
        await asyncio.gather(*futures)
        assert durable == [f"u{n}" for n in range(5)]
        assert writer.backlog == 0

        writer.submit(ack("t1", "u0"))
        await writer.flush()
        assert ids(UpdateJournal(path).load()) == ["u1", "u2", "u3", "u4"]

        writer.submit(update("t2", "late"))
        await writer.reset()  # written first, then dropped with the rest
        assert durable[-1] == "late"
        assert UpdateJournal(path).load() == []
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_writer_goes_on_when_the_disk_fails(tmp_path: Path) -> None:
    durable: list[str] = []
    # A directory that does not exist: every append fails.
    journal = UpdateJournal(tmp_path / "missing" / "journal.jsonl")
    writer = JournalWriter(journal, lambda u: durable.append(u.status.update_id))
    runner = asyncio.create_task(writer.run())
    try:
        await writer.submit(update("t1", "a"))
        assert durable == ["a"]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_stopped_writer_lets_its_waiters_go(tmp_path: Path) -> None:
    writer = JournalWriter(UpdateJournal(tmp_path / "j.jsonl"), lambda u: None)
    runner = asyncio.create_task(writer.run())
    await asyncio.sleep(0)  # a yield: the writer now waits for records
    future = writer.submit(update("t1", "a"))
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert future.cancelled()  # so nobody waits forever on a writer that is gone
