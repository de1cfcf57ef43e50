"""One `Scheduler.Connect` stream: calls go out through its one writer (a `StreamWriter`,
`mesolite/stream_writer.py`), events come in through reads that give up when the master
falls silent or the framework is stopping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc
import grpc.aio

from mesolite.framework_sdk._errors import NotConnected
from mesolite.stream_writer import StreamWriter, in_batches
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc

QUEUE_SIZE = 1024


def _batch(calls: list[scheduler_pb2.Call]) -> scheduler_pb2.Call:
    return scheduler_pb2.Call(batch=scheduler_pb2.Call.Batch(calls=calls))


class StreamLost(NotConnected):
    """The stream ended without an error status: the master closed it or fell silent."""


class Stream:
    def __init__(self, stub: scheduler_pb2_grpc.SchedulerAsyncStub) -> None:
        self._call: Any = stub.Connect()
        self._calls: StreamWriter[scheduler_pb2.Call] = StreamWriter(QUEUE_SIZE)
        # Once the master says it reads batches (Subscribed.batches), calls waiting
        # together go out as one message: fewer messages for the master to read.
        self.batches = False
        self._writer = asyncio.create_task(
            self._calls.write_to(self._call, self._grouped), name="mesolite-stream-writer"
        )
        self._read: asyncio.Future[Any] | None = None
        self._read_since = 0.0  # when the read in flight started (time.monotonic)

    def _grouped(self, calls: list[scheduler_pb2.Call]) -> list[scheduler_pb2.Call]:
        if not self.batches or len(calls) == 1:
            return calls
        return list(in_batches(calls, _batch))

    async def send(self, call: scheduler_pb2.Call) -> None:
        if self._calls.closed:
            raise NotConnected("the stream to the master is closing")
        await self._calls.put(call)

    async def next_event(
        self, silence: float | None, stop: asyncio.Event, wake_at: float | None = None
    ) -> scheduler_pb2.Event | None:
        """The next event, or None once `stop` is set or `time.monotonic()` has reached
        `wake_at` (the read goes on: the next call returns what it reads).

        Raises `StreamLost` when the master ends the stream or sends nothing for `silence`
        seconds, and `grpc.aio.AioRpcError` when the stream ends with an error status.
        A failed write is not reported here: the stream's status reaches the reads too,
        and only they can tell a rejection apart from a transient failure. (A write that
        fails inside gRPC core as the connection breaks leaves the status INTERNAL, not
        UNAVAILABLE: `_framework._TRANSIENT` counts both.)
        """
        now = time.monotonic()
        if self._read is None:
            self._read = asyncio.ensure_future(self._call.read())
            self._read_since = now
        timeout = None if silence is None else max(0.0, self._read_since + silence - now)
        if wake_at is not None:
            until_wake = max(0.0, wake_at - now)
            timeout = until_wake if timeout is None else min(timeout, until_wake)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {self._read, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        if self._read not in done:
            if stop.is_set():
                return None
            if wake_at is not None and time.monotonic() >= wake_at:
                return None
            raise StreamLost(f"no event from the master for {silence:g}s")
        read, self._read = self._read, None
        event = read.result()
        if event is grpc.aio.EOF:
            raise StreamLost("the master ended the stream")
        assert isinstance(event, scheduler_pb2.Event)
        return event

    async def close(self, grace: float = 0.0) -> None:
        """Close the stream. With a grace period, first send what is queued, half-close,
        and give the master that long to end the stream, so that a last call (a teardown,
        an acknowledgement) is read before the stream is cancelled."""
        # A sender still waiting for room returns: its call is lost with the stream, as
        # any call in flight on a broken connection is.
        self._calls.close()
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.wait({self._writer})
                    await self._drain()
        self._writer.cancel()
        pending: list[asyncio.Future[Any]] = [self._writer]
        if self._read is not None:
            self._read.cancel()
            pending.append(self._read)
        self._call.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _drain(self) -> None:
        """Discard events until the master ends the stream, however it ends it."""
        while True:
            if self._read is None:
                self._read = asyncio.ensure_future(self._call.read())
            try:
                event = await self._read
            except grpc.aio.AioRpcError:
                self._read = None
                return
            self._read = None
            if event is grpc.aio.EOF:
                return
