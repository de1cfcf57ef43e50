"""One `Scheduler.Connect` stream: calls go out through a single writer task draining a
bounded queue (grpc.aio allows one write in flight per call), events come in through
reads that give up when the master falls silent or the framework is stopping."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import grpc.aio
import structlog

from mesolite.framework_sdk._errors import NotConnected
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc

_log = structlog.get_logger(__name__)

QUEUE_SIZE = 1024


class StreamLost(NotConnected):
    """The stream ended without an error status: the master closed it or fell silent."""


class Stream:
    def __init__(self, stub: scheduler_pb2_grpc.SchedulerAsyncStub) -> None:
        self._call: Any = stub.Connect()
        # None asks the writer to half-close the stream once everything before it is sent.
        self._queue: asyncio.Queue[scheduler_pb2.Call | None] = asyncio.Queue(QUEUE_SIZE)
        self._writer = asyncio.create_task(self._write_loop(), name="mesolite-stream-writer")
        self._read: asyncio.Future[Any] | None = None
        self._write_failed = False
        self._closing = False

    async def send(self, call: scheduler_pb2.Call) -> None:
        if self._closing:
            raise NotConnected("the stream to the master is closing")
        await self._queue.put(call)

    async def _write_loop(self) -> None:
        while (call := await self._queue.get()) is not None:
            if self._write_failed:
                continue  # keep draining, so that no sender waits on a queue nobody empties
            try:
                await self._call.write(call)
            except Exception as e:  # whatever it was, this stream can carry no more calls
                _log.debug("stream write failed", error=repr(e))
                self._write_failed = True
        if not self._write_failed:
            with contextlib.suppress(Exception):
                await self._call.done_writing()

    async def next_event(
        self, silence: float | None, stop: asyncio.Event
    ) -> scheduler_pb2.Event | None:
        """The next event, or None once `stop` is set.

        Raises `StreamLost` when the master ends the stream or sends nothing for `silence`
        seconds, and `grpc.aio.AioRpcError` when the stream ends with an error status.
        A failed write is not reported here: the stream's status reaches the reads too,
        and only they can tell a rejection apart from a transient failure. (A write that
        fails inside gRPC core as the connection breaks leaves the status INTERNAL, not
        UNAVAILABLE: `_framework._TRANSIENT` counts both.)
        """
        if self._read is None:
            self._read = asyncio.ensure_future(self._call.read())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {self._read, stopping}, timeout=silence, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopping.cancel()
        if self._read not in done:
            if stop.is_set():
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
        self._closing = True
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._queue.put(None)
                    await asyncio.wait({self._writer})
                    await self._drain()
        self._writer.cancel()
        pending: list[asyncio.Future[Any]] = [self._writer]
        if self._read is not None:
            self._read.cancel()
            pending.append(self._read)
        self._call.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        # Wake any sender still waiting for room: its call is lost with the stream, as
        # any call in flight on a broken connection is.
        while not self._queue.empty():
            self._queue.get_nowait()

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
