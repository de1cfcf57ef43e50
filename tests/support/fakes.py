"""Fakes for the master core's effects (`master/effects.py`): virtual time and peers.

timers = FakeTimers()
master = Master(config, timers=timers, clock=timers, registry=Registry(None))
timers.advance(5.0)      # fires what was due, in order, at its own time
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
M = TypeVar("M")


@dataclass(order=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimers:
    """Timers in virtual time; the object is also the clock they count in."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._due: list[_Timer] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        timer = _Timer(self.now + max(0.0, delay), next(self._seq), callback, args)
        heapq.heappush(self._due, timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward, firing each timer due by then at its own time, in order."""
        end = self.now + seconds
        while self._due and self._due[0].when <= end:
            timer = heapq.heappop(self._due)
            if timer.cancelled:
                continue
            self.now = max(self.now, timer.when)
            timer.callback(*timer.args)
        self.now = end

    def pending(self) -> int:
        return sum(1 for t in self._due if not t.cancelled)


class RecordingPeer(Generic[T]):
    """A connected agent or framework that keeps what the master sent it."""

    def __init__(self) -> None:
        self.messages: list[T] = []
        self.closed = False
        self.close_reason = ""

    def send(self, message: T) -> None:
        if not self.closed:
            self.messages.append(message)

    def close(self, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason

    def of(self, kind: type[M]) -> list[M]:
        """The messages of one kind, in order."""
        return [m for m in self.messages if isinstance(m, kind)]

    def take(self, kind: type[M]) -> list[M]:
        """The messages of one kind, removed from the record."""
        found = self.of(kind)
        self.messages = [m for m in self.messages if not isinstance(m, kind)]
        return found
