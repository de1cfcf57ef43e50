"""One writer per gRPC stream: a bounded queue of messages that the stream's only writer
drains in order (grpc.aio allows one write in flight per call).

Every end of every stream uses it: the master's servicers (one per connected framework
or agent, drained by the response generator), and the agent's and the SDK's streams to
the master (drained by `write_to`, which writes to the call and then half-closes it).

What differs between them is what a sender does when the queue is full:

* `send` never waits: a full queue closes the stream (`overflowed`). The master's core
  is synchronous, and a peer that stops reading must not make it buffer without bound.
* `await put(...)` waits for room: a client's own calls are not dropped while its
  stream is alive.

`close` ends the stream once what is already queued is written; whatever is sent after
it is dropped, and so is a `put` still waiting for room (it returns at once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Generic, Protocol, TypeVar

import structlog

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

_log = structlog.get_logger(__name__)

# The most messages `write_to` hands `group` at once.
_GROUPED = 1_000

# A batch message (several messages in one, for a peer that reads them) stays below
# this: far below any receiver's limit (grpc's default is 4 MiB; the master's too).
BATCH_BYTES = 1 << 20


class _Sized(Protocol):
    def ByteSize(self) -> int: ...


W = TypeVar("W", bound=_Sized)


def in_batches(
    messages: Iterable[W],
    wrap: Callable[[list[W]], W],
    alone: Callable[[W], bool] = lambda message: False,
    limit_bytes: int = BATCH_BYTES,
) -> Iterator[W]:
    """`messages` in order, runs of them wrapped into one batch message by `wrap`, each
    batch at most `limit_bytes` (a message bigger than that alone goes alone); a message
    for which `alone` holds is never in a batch."""
    run: list[W] = []
    size = 0
    for message in messages:
        n = 0 if alone(message) else message.ByteSize()
        if run and (not n or size + n > limit_bytes):
            yield run[0] if len(run) == 1 else wrap(run)
            run, size = [], 0
        if not n:
            yield message
            continue
        run.append(message)
        size += n
    if run:
        yield run[0] if len(run) == 1 else wrap(run)


async def _singly(messages: AsyncIterator[T]) -> AsyncIterator[list[T]]:
    async for message in messages:
        yield [message]


class WritableCall(Protocol[T_contra]):
    """The writing half of a client-side grpc.aio stream."""

    async def write(self, message: T_contra) -> None: ...

    async def done_writing(self) -> None: ...


class StreamWriter(Generic[T]):
    """Messages for one stream, at most `capacity` of them waiting to be written."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a stream writer needs room for a message, got {capacity}")
        self._capacity = capacity
        self._messages: deque[T] = deque()
        self._readable = asyncio.Event()  # a message, or the close, for the writer
        self._room = asyncio.Event()  # for senders waiting in `put`
        self.closed = False
        self.overflowed = False
        self.close_reason = ""

    def __len__(self) -> int:
        return len(self._messages)

    def send(self, message: T) -> None:
        """Queue `message` without waiting; a full queue closes the stream instead."""
        if self.closed:
            return
        if len(self._messages) >= self._capacity:
            self.overflowed = True
            self.close("the peer is not reading its messages")
            return
        self._queue(message)

    async def put(self, message: T) -> None:
        """Queue `message`, waiting for room; dropped if the stream closes first."""
        while not self.closed and len(self._messages) >= self._capacity:
            self._room.clear()
            await self._room.wait()
        if not self.closed:
            self._queue(message)

    def close(self, reason: str = "") -> None:
        """End the stream after the messages already queued have been written."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._readable.set()
        self._room.set()

    async def drain(self) -> AsyncIterator[T]:
        """The messages in order, until the stream is closed and they are all out.
        For the stream's one writer."""
        while await self._readable_or_done():
            message = self._messages.popleft()
            self._room.set()
            yield message

    async def drain_batches(self, limit: int, linger: float = 0.0) -> AsyncIterator[list[T]]:
        """Like `drain`, but everything queued at once (at most `limit` messages) in one
        list: a writer that can put several messages in one write does fewer writes
        the busier it is.

        `linger` (seconds): when busy, that is when a message comes less than `linger`
        after the last batch was taken, wait until `linger` has passed since then (or
        `limit` messages wait, or the stream closes) before taking the next one, so that
        a busy stream sends one fuller batch per `linger` rather than many small ones.
        An idle stream's message goes at once."""
        if limit < 1:
            raise ValueError(f"a batch needs room for a message, got {limit}")
        loop = asyncio.get_running_loop()
        last = -linger
        while await self._readable_or_done():
            if linger > 0:
                await self._linger(last + linger, limit)
                last = loop.time()
            messages = self._messages
            if len(messages) <= limit:
                batch = list(messages)
                messages.clear()
            else:
                batch = [messages.popleft() for _ in range(limit)]
            self._room.set()
            yield batch

    async def _linger(self, until: float, limit: int) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed and len(self._messages) < limit:
            remaining = until - loop.time()
            if remaining <= 0:
                return
            self._readable.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._readable.wait()

    async def write_to(
        self,
        call: WritableCall[T],
        group: Callable[[list[T]], list[T]] | None = None,
        linger: float = 0.0,
    ) -> None:
        """Be a client stream's one writer: write the messages to `call` in order, then
        half-close it, so that the other side sees this side leave, not a broken stream.
        With `group`, whatever waits is taken at once and written as `group` makes it
        (several messages in one batch message, say, where the other side reads them).

        A failed write means the stream can carry nothing more: the messages after it
        are discarded (so that no `put` waits on a queue nobody empties) and the stream
        is not half-closed. The call's reader learns from its status how it ended.
        `linger`: see `drain_batches` (with `group` only).
        """
        failed = False
        batches = self.drain_batches(_GROUPED, linger) if group else _singly(self.drain())
        async for messages in batches:
            if failed:
                continue
            try:
                for message in group(messages) if group else messages:
                    await call.write(message)
            except Exception as e:  # whatever it was, this stream can carry no more
                _log.debug("stream write failed", error=repr(e))
                failed = True
        if not failed:
            with contextlib.suppress(Exception):
                await call.done_writing()

    async def _readable_or_done(self) -> bool:
        """Wait for a message to write (True) or for the end of the stream (False)."""
        while not self._messages:
            if self.closed:
                return False
            self._readable.clear()
            await self._readable.wait()
        return True

    def _queue(self, message: T) -> None:
        self._messages.append(message)
        self._readable.set()
