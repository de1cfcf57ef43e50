"""The master's servicers driven in-process: `Connect` streams without a network.

    streams = ServicerStreams(SchedulerService(master), AgentGatewayService(master))
    fw = streams.framework(subscribe_call)   # SchedulerService.Connect, fed by the test
    fw.send(call)
    await streams.settle()                   # until the master has handled all of it
    fw.events, fw.ended, fw.code             # what it answered; how the stream ended

The servicers run their real code, as under grpc.aio: the stream's first call read
by the handler, the rest by its reader task, the answers yielded by its generator.
Only the network and the (de)serialisation are left out: the context is a fake whose
`abort` raises, as grpc's does. A handler that raises anything else is a crash,
kept in `crash` with its traceback.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc

from mesolite.v1 import agent_pb2, scheduler_pb2

Req = TypeVar("Req")
Ev = TypeVar("Ev")

# Loop turns `settle` allows before it says the master never went quiet.
MAX_TURNS = 10_000
# Turns with nothing new that count as quiet: a message the reader handled reaches
# the stream's generator in the next turn, and its answer the test in the same one.
QUIET_TURNS = 3


class Aborted(Exception):
    """What `FakeContext.abort` raises: the handler ended the call with a status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeContext:
    """The parts of `grpc.aio.ServicerContext` a servicer uses. `principal`: the common
    name of the client's certificate, as mutual TLS gives it (None: no certificate)."""

    def __init__(self, principal: str | None = None, peer: str = "ipv4:127.0.0.1:40000") -> None:
        self._principal = principal
        self._peer = peer

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        raise Aborted(code, details)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        if self._principal is None:
            return {}
        return {"x509_common_name": [self._principal.encode()]}

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


class Requests(Generic[Req]):
    """The client's half of a stream: what the test sends, as the handler reads it."""

    def __init__(self) -> None:
        self._items: deque[Req | Exception] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._closed = False
        self.waiting = False  # the handler asked for the next message and has none

    def __aiter__(self) -> Requests[Req]:
        return self

    async def __anext__(self) -> Req:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self.waiting = True
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self.waiting = False
        item = self._items.popleft()
        if isinstance(item, Exception):
            raise item
        return item

    @property
    def pending(self) -> int:
        return len(self._items)

    def push(self, item: Req | Exception) -> None:
        """The next message; an exception is raised to the reader in its place (as grpc
        raises DecodeError for bytes that are not a message)."""
        self._items.append(item)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)


Connect = Callable[[AsyncIterator[Req], Any], AsyncIterator[Ev]]


class Stream(Generic[Req, Ev]):
    """One `Connect` call, run as a task; its answers kept in order."""

    def __init__(
        self, connect: Connect[Req, Ev], first: Req | Exception, principal: str | None = None
    ) -> None:
        self.requests: Requests[Req] = Requests()
        self.requests.push(first)
        self.events: list[Ev] = []
        self.ended = False
        self.code: grpc.StatusCode | None = None  # None: open, or ended without a status
        self.details = ""
        self.crash: str | None = None  # the traceback of an unexpected exception
        self.task = asyncio.create_task(self._run(connect, FakeContext(principal)))

    async def _run(self, connect: Connect[Req, Ev], context: FakeContext) -> None:
        try:
            async for event in connect(self.requests, context):
                self.events.append(event)
        except Aborted as e:
            self.code, self.details = e.code, e.details
        except asyncio.CancelledError:
            pass  # the client hung up
        except Exception:
            self.crash = traceback.format_exc()
        finally:
            self.ended = True

    def send(self, request: Req | Exception) -> None:
        self.requests.push(request)

    def close(self) -> None:
        """Half-close: the client sends nothing more."""
        self.requests.close()

    def cancel(self) -> None:
        """Hang up, as a client that goes away (grpc cancels the handler)."""
        self.task.cancel()

    @property
    def quiet(self) -> bool:
        return self.ended or (self.requests.waiting and not self.requests.pending)


FrameworkStream = Stream[scheduler_pb2.Call, scheduler_pb2.Event]
AgentStream = Stream[agent_pb2.AgentCall, agent_pb2.AgentEvent]


class ServicerStreams:
    """Every stream opened on a pair of servicers."""

    def __init__(self, scheduler: Any, agents: Any) -> None:
        self._scheduler = scheduler
        self._agents = agents
        self.streams: list[Stream[Any, Any]] = []

    def framework(
        self, first: scheduler_pb2.Call | Exception, principal: str | None = None
    ) -> FrameworkStream:
        stream: FrameworkStream = Stream(self._scheduler.Connect, first, principal)
        self.streams.append(stream)
        return stream

    def agent(
        self, first: agent_pb2.AgentCall | Exception, principal: str | None = None
    ) -> AgentStream:
        stream: AgentStream = Stream(self._agents.Connect, first, principal)
        self.streams.append(stream)
        return stream

    async def settle(self) -> None:
        """Run the loop until every stream waits for its client or has ended, and no
        answer is still on its way."""
        quiet = 0
        seen = -1
        for _ in range(MAX_TURNS):
            await asyncio.sleep(0)
            answered = sum(len(s.events) for s in self.streams)
            if all(s.quiet for s in self.streams) and answered == seen:
                quiet += 1
                if quiet >= QUIET_TURNS:
                    return
            else:
                quiet = 0
            seen = answered
        raise AssertionError(f"the servicers did not settle in {MAX_TURNS} loop turns")

    def crashes(self) -> list[str]:
        return [s.crash for s in self.streams if s.crash]

    def open(self) -> list[Stream[Any, Any]]:
        return [s for s in self.streams if not s.ended]

    async def aclose(self) -> None:
        """Hang up every stream still open and wait until each has ended."""
        for stream in self.open():
            stream.cancel()
        await asyncio.gather(*(s.task for s in self.streams), return_exceptions=True)
