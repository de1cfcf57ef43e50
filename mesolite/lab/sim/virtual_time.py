"""Timers in virtual time: what lets the master's core run a day of cluster in seconds.

    timers = VirtualTimers()
    master = Master(config, timers=timers, clock=timers, registry=Registry(None))
    timers.advance(5.0)      # fires what was due, in order, each at its own time

The object is both the `Timers` (`master/effects.py`) and the clock they count in.
`after_each`, if given, runs after every callback fired: the simulator delivers the
messages a callback queued before the next one fires.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True)
class VirtualTimer:
    when: float
    seq: int
    callback: Callable[..., Any] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class VirtualTimers:
    """Timers in virtual time; the object is also the clock they count in."""

    def __init__(self, start: float = 1000.0, after_each: Callable[[], None] | None = None) -> None:
        self.now = start
        self._due: list[VirtualTimer] = []
        self._seq = itertools.count()
        self._after_each = after_each

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> VirtualTimer:
        timer = VirtualTimer(self.now + max(0.0, delay), next(self._seq), callback, args)
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
            if self._after_each is not None:
                self._after_each()
        self.now = end

    def next_due(self) -> float | None:
        """When the next live timer fires (None: none is set)."""
        while self._due and self._due[0].cancelled:
            heapq.heappop(self._due)
        return self._due[0].when if self._due else None

    def pending(self) -> int:
        return sum(1 for t in self._due if not t.cancelled)
