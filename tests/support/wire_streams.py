"""Raw client streams to a real master over gRPC, for tests that send it anything.

    streams = WireStreams(channel)
    fw = streams.framework(subscribe_call)    # Scheduler.Connect; anything may follow
    agent = streams.agent(register_call)      # AgentGateway.Connect, a raw agent
    junk = streams.raw("/mesolite.v1.Scheduler/Connect", b"\\xff")   # bytes, not messages
    fw.send(call)
    await streams.settle()    # the master has handled everything sent so far
    fw.events, fw.ended, fw.code

Every stream's answers are read by a task of its own, and how the stream ended (its
gRPC status) is kept. `settle` sends each open stream a call the master must answer
(`barrier`) and waits for the answer, or for the stream's end: it tells when the
master has handled what came before, without sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from mesolite.v1 import agent_pb2, scheduler_pb2
from tests.support.calls import running
from tests.waiting import within

Req = TypeVar("Req")
Ev = TypeVar("Ev")

SCHEDULER = "/mesolite.v1.Scheduler/Connect"
AGENT_GATEWAY = "/mesolite.v1.AgentGateway/Connect"
# How grpcio's client reports a stream the server ended while the client wrote to it
# (the server's own status is lost): a race of the client's, not an error of the server.
CLIENT_RACE = (grpc.StatusCode.INTERNAL, "Internal error from Core")
# Ids no client can use (a space is not allowed), so only a barrier is answered so.
_BARRIER = "barrier {}"


class WireStream(Generic[Req, Ev]):
    """One Connect call: what the test sends, what the master answered, how it ended."""

    def __init__(
        self,
        method: Callable[[AsyncIterator[Req]], grpc.aio.StreamStreamCall[Req, Ev]],
        first: Req,
        barrier: Callable[[str], tuple[Req, Callable[[Ev], bool]]] | None,
    ) -> None:
        self._queue: asyncio.Queue[Req | None] = asyncio.Queue()
        self._queue.put_nowait(first)
        self.sent: list[Req] = [first]  # what the test sent, for reports
        self._barrier = barrier
        self.events: list[Ev] = []
        self.ended = False
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self._changed = asyncio.Event()
        self._call = method(self._requests())
        self._reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[Req]:
        while (request := await self._queue.get()) is not None:
            yield request

    async def _read(self) -> None:
        try:
            async for event in self._call:
                self.events.append(event)
                self._changed.set()
            self.code = await self._call.code()
        except grpc.aio.AioRpcError as e:
            self.code, self.details = e.code(), e.details() or ""
        except asyncio.CancelledError:
            self.code = grpc.StatusCode.CANCELLED
        finally:
            self.ended = True
            self._changed.set()

    def send(self, request: Req) -> None:
        self.sent.append(request)
        self._queue.put_nowait(request)

    def close(self) -> None:
        """Half-close: the client sends nothing more."""
        self._queue.put_nowait(None)

    def cancel(self) -> None:
        """Hang up."""
        self._call.cancel()

    async def answered(self, found: Callable[[Ev], bool], timeout: float) -> bool:
        """Wait until an answer satisfies `found` (True) or the stream ends (False)."""

        async def wait() -> bool:
            seen = 0
            while True:
                if any(found(e) for e in self.events[seen:]):
                    return True
                seen = len(self.events)
                if self.ended:
                    return False
                self._changed.clear()
                await self._changed.wait()

        return await within(wait(), timeout, "an answer from the master")

    async def sync(self, tag: str, timeout: float) -> None:
        """Send a barrier; return once it is answered or the stream has ended.

        Not before the first message is answered (the master answers it or ends the
        stream): a write racing the end of a stream makes grpcio's client report
        INTERNAL instead of the status the server sent (`CLIENT_RACE`)."""
        if self._barrier is None:
            return
        await self.answered(lambda e: True, timeout)
        if self.ended:
            return
        request, answers = self._barrier(tag)
        self.send(request)
        await self.answered(answers, timeout)

    async def finish(self) -> None:
        """Hang up if still open, and wait for the stream's end. The requests end too:
        grpc's task sending them would otherwise wait for the next one for ever."""
        self.close()
        if not self.ended:
            self.cancel()
        await within(asyncio.shield(self._reader), 20, "a stream to end")


def _framework_barrier(tag: str) -> tuple[scheduler_pb2.Call, Callable[[Any], bool]]:
    # A kill of a task that cannot exist: answered with an ERROR echoing the call id.
    call = scheduler_pb2.Call(call_id=tag, kill=scheduler_pb2.Call.Kill(task_id=tag))
    return call, lambda e: e.WhichOneof("event") == "error" and e.error.call_id == tag


def _agent_barrier(tag: str) -> tuple[agent_pb2.AgentCall, Callable[[Any], bool]]:
    # An update of a framework that cannot exist: the master acknowledges it itself.
    call = running(tag, tag, tag)
    return call, lambda e: e.WhichOneof("event") == "acknowledge" and e.acknowledge.update_id == tag


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


Decode = Callable[[bytes], Any]
_RAW_BARRIERS: dict[str, tuple[Callable[[str], tuple[Any, Callable[[Any], bool]]], Decode]] = {
    SCHEDULER: (_framework_barrier, scheduler_pb2.Event.FromString),
    AGENT_GATEWAY: (_agent_barrier, agent_pb2.AgentEvent.FromString),
}
FrameworkWireStream = WireStream[scheduler_pb2.Call, scheduler_pb2.Event]
AgentWireStream = WireStream[agent_pb2.AgentCall, agent_pb2.AgentEvent]


class WireStreams:
    """Every stream opened on one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._tags = itertools.count(1)
        self.streams: list[WireStream[Any, Any]] = []

    def framework(
        self, first: scheduler_pb2.Call, principal: str | None = None
    ) -> FrameworkWireStream:
        assert principal is None, "these streams are anonymous"
        return self._typed(SCHEDULER, first, scheduler_pb2.Event.FromString, _framework_barrier)

    def agent(self, first: agent_pb2.AgentCall, principal: str | None = None) -> AgentWireStream:
        assert principal is None, "these streams are anonymous"
        return self._typed(AGENT_GATEWAY, first, agent_pb2.AgentEvent.FromString, _agent_barrier)

    def _typed(
        self,
        path: str,
        first: Req,
        decode: Callable[[bytes], Ev],
        barrier: Callable[[str], tuple[Req, Callable[[Ev], bool]]],
    ) -> WireStream[Req, Ev]:
        method = self._channel.stream_stream(
            path, request_serializer=_serialize, response_deserializer=decode
        )
        stream = WireStream(method, first, barrier)
        self.streams.append(stream)
        return stream

    def raw(self, path: str, first: bytes) -> WireStream[bytes, bytes]:
        """A stream of bytes, sent as they are: messages or not (its barrier is sent as
        bytes too, for the two services; other paths have none)."""
        typed = _RAW_BARRIERS.get(path)

        def raw_barrier(tag: str) -> tuple[bytes, Callable[[bytes], bool]]:
            assert typed is not None
            barrier, decode = typed
            request, answers = barrier(tag)
            return request.SerializeToString(), lambda b: answers(decode(b))

        stream: WireStream[bytes, bytes] = WireStream(
            self._channel.stream_stream(path), first, raw_barrier if typed else None
        )
        self.streams.append(stream)
        return stream

    def open(self) -> list[WireStream[Any, Any]]:
        return [s for s in self.streams if not s.ended]

    async def settle(self, timeout: float = 20.0) -> None:
        """Every open stream's barrier answered (or the stream ended)."""
        await asyncio.gather(
            *(s.sync(_BARRIER.format(next(self._tags)), timeout) for s in self.open())
        )

    async def aclose(self) -> None:
        await asyncio.gather(*(s.finish() for s in self.streams))
