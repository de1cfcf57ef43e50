"""Identifiers a framework makes up for its tasks, and a memory of ids already seen."""

from __future__ import annotations

import uuid
from collections import OrderedDict


def new_task_id(prefix: str = "task") -> str:
    """A task id unique across runs and failovers, e.g. ``"task-3f9c2a41b0de"``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class RecentIds:
    """The last `capacity` ids added: enough to recognise a redelivered status update
    without keeping every update id a long-running framework has ever seen."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, item: object) -> bool:
        return item in self._ids

    def add(self, item: str) -> None:
        self._ids[item] = None
        self._ids.move_to_end(item)
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
