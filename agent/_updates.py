"""Reliable, ordered delivery of status updates: the agent side of Mesos' status
update manager, without I/O or a clock of its own (callers pass `now`).

Each task has its own stream of updates. Only the head of a stream is in
flight; it is re-sent with backoff until the master relays the framework's
acknowledgement, and only then does the next update of that task go out. So a
framework sees each task's updates in order, at least once.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mesolite.backoff import Backoff
from mesolite.model import TaskState, TaskStatus

_Key = tuple[str, str]  # (framework_id, task_id)


@dataclass
class _Stream:
    updates: deque[TaskStatus] = field(default_factory=deque)
    sends: int = 0  # how often the head has been sent
    next_send: float = 0.0  # when the head is due (again)


class StatusUpdates:
    """Pending status updates, one ordered stream per task."""

    def __init__(self, retry: Backoff, random_fraction: Callable[[], float] = random.random):
        self._retry = retry
        self._random = random_fraction
        self._streams: dict[_Key, _Stream] = {}

    def __len__(self) -> int:
        return sum(len(s.updates) for s in self._streams.values())

    def pending(self) -> list[TaskStatus]:
        return [u for s in self._streams.values() for u in s.updates]

    def add(self, status: TaskStatus) -> None:
        """Queue `status` behind the task's earlier updates."""
        key = (status.framework_id, status.task_id)
        stream = self._streams.setdefault(key, _Stream())
        stream.updates.append(status)

    def acknowledge(self, framework_id: str, task_id: str, update_id: str) -> TaskStatus | None:
        """Drop the acknowledged head and make the task's next update due now.

        Returns the acknowledged update, or None when `update_id` is not the
        head of that task's stream (a duplicate or stale acknowledgement).
        """
        stream = self._streams.get((framework_id, task_id))
        if stream is None or stream.updates[0].update_id != update_id:
            return None
        acked = stream.updates.popleft()
        if stream.updates:
            stream.sends = 0
            stream.next_send = 0.0
        else:
            del self._streams[(framework_id, task_id)]
        return acked

    def take_due(self, now: float) -> list[TaskStatus]:
        """The heads due at `now`, each scheduled for its next retry."""
        due = []
        for stream in self._streams.values():
            if stream.next_send <= now:
                due.append(stream.updates[0])
                stream.next_send = now + self._retry.delay(stream.sends, self._random)
                stream.sends += 1
        return due

    def latest_state(self, status: TaskStatus) -> TaskState:
        """The state of the newest update queued for `status`'s task."""
        stream = self._streams.get((status.framework_id, status.task_id))
        return stream.updates[-1].state if stream and stream.updates else status.state

    def next_due(self) -> float | None:
        """When `take_due` next has something to return; None if nothing is pending."""
        return min((s.next_send for s in self._streams.values()), default=None)

    def resend_all(self) -> None:
        """Make every head due now with a fresh backoff, e.g. after re-registering."""
        for stream in self._streams.values():
            stream.sends = 0
            stream.next_send = 0.0

    def clear(self) -> None:
        self._streams.clear()
