"""Fakes for the master core's effects (`master/effects.py`): virtual time and peers.

timers = FakeTimers()
master = Master(config, timers=timers, clock=timers, registry=Registry(None))
timers.advance(5.0)      # fires what was due, in order, at its own time
"""

from __future__ import annotations

from typing import Generic, TypeVar

from mesolite.lab.sim.virtual_time import VirtualTimers

T = TypeVar("T")
M = TypeVar("M")


# The simulator's virtual time, under the name the tests have always used.
FakeTimers = VirtualTimers


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
