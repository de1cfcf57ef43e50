"""Status update ordering and retries, and backoff: pure, no I/O."""

from __future__ import annotations

import pytest

from mesolite.agent import Backoff
from mesolite.agent._updates import StatusUpdates
from mesolite.model import TaskState, TaskStatus

RETRY = Backoff(initial=1.0, maximum=4.0, jitter=0.0)


def status(task_id: str, update_id: str, state: TaskState = TaskState.RUNNING) -> TaskStatus:
    return TaskStatus(task_id, "fw", "agent-1", state, update_id=update_id)


def ids(statuses: list[TaskStatus]) -> list[str]:
    return [s.update_id for s in statuses]


def test_only_the_head_of_each_task_is_sent_until_acknowledged() -> None:
    updates = StatusUpdates(RETRY)
    updates.add(status("t1", "a"))
    updates.add(status("t1", "b"))
    updates.add(status("t2", "c"))

    assert ids(updates.take_due(0.0)) == ["a", "c"]
    assert updates.take_due(0.5) == []
    assert updates.acknowledge("fw", "t1", "a") is not None
    assert ids(updates.take_due(0.5)) == ["b"]
    assert len(updates) == 2


def test_unacknowledged_head_is_retried_with_growing_capped_delays() -> None:
    updates = StatusUpdates(RETRY)
    updates.add(status("t1", "a"))
    sent_at: list[float] = []
    now = 0.0
    while len(sent_at) < 5:
        if updates.take_due(now):
            sent_at.append(now)
        next_due = updates.next_due()
        assert next_due is not None
        now = next_due
    assert sent_at == [0.0, 1.0, 3.0, 7.0, 11.0]


def test_stale_acknowledgements_are_ignored() -> None:
    updates = StatusUpdates(RETRY)
    updates.add(status("t1", "a"))
    updates.add(status("t1", "b"))
    assert updates.acknowledge("fw", "t1", "b") is None  # not the head
    assert updates.acknowledge("fw", "t9", "a") is None
    assert updates.acknowledge("fw", "t1", "a") is not None
    assert updates.acknowledge("fw", "t1", "a") is None  # duplicate
    assert ids(updates.pending()) == ["b"]


def test_resend_all_makes_every_head_due_now() -> None:
    updates = StatusUpdates(RETRY)
    updates.add(status("t1", "a"))
    updates.take_due(0.0)
    updates.resend_all()
    assert ids(updates.take_due(0.0)) == ["a"]
    updates.acknowledge("fw", "t1", "a")
    assert updates.next_due() is None


def test_backoff_jitter_stays_within_bounds() -> None:
    backoff = Backoff(initial=1.0, maximum=10.0, jitter=0.5)
    assert backoff.delay(0, lambda: 0.0) == 1.0
    assert backoff.delay(0, lambda: 1.0) == 0.5
    assert backoff.delay(3, lambda: 0.0) == 8.0
    assert backoff.delay(10_000, lambda: 0.0) == 10.0


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0)
    with pytest.raises(ValueError):
        Backoff(initial=2, maximum=1)


def test_each_head_goes_out_with_the_newest_state_queued_behind_it() -> None:
    updates = StatusUpdates(RETRY)
    updates.add(status("t1", "a", TaskState.RUNNING))
    updates.add(status("t2", "c", TaskState.RUNNING))
    updates.add(status("t1", "b", TaskState.FINISHED))
    latest = {u.task_id: updates.latest_state(u) for u in updates.take_due(0.0)}
    assert latest == {"t1": TaskState.FINISHED, "t2": TaskState.RUNNING}
