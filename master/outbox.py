"""A bounded queue of messages for one connected peer, drained by its stream writer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_CAPACITY = 10_000


class Outbox(Generic[T]):
    """Messages for one peer. `send` never blocks the master.

    A peer that stops reading fills its outbox; the master then closes it
    (`overflowed` is set) rather than buffering without bound.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._queue: asyncio.Queue[T | None] = asyncio.Queue(capacity + 1)
        self._capacity = capacity
        self.closed = False
        self.overflowed = False
        self.close_reason = ""

    def send(self, message: T) -> None:
        if self.closed:
            return
        if self._queue.qsize() >= self._capacity:
            self.overflowed = True
            self.close("the peer is not reading its messages")
            return
        self._queue.put_nowait(message)

    def close(self, reason: str = "") -> None:
        """Stop after the messages already queued have been written."""
        if not self.closed:
            self.closed = True
            self.close_reason = reason
            self._queue.put_nowait(None)

    async def drain(self) -> AsyncIterator[T]:
        while True:
            message = await self._queue.get()
            if message is None:
                return
            yield message
