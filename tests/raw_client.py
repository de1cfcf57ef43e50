"""A framework speaking raw protobuf to the master, for tests of the master's boundary.

The SDK refuses much bad input on the client side (it will not even build
Resources with a NaN); this client sends whatever a test writes, so the tests
show what the master itself accepts and rejects.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from types import TracebackType

import grpc.aio

from mesolite import grpc_utils
from mesolite.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.waiting import within

Call = scheduler_pb2.Call
Event = scheduler_pb2.Event


def resources(**amounts: float) -> common_pb2.Resources:
    return common_pb2.Resources(scalars=amounts)


class RawFramework:
    def __init__(
        self,
        master: str,
        name: str = "raw",
        role: str = "*",
        framework_id: str = "",
        failover_timeout: float = 0.0,
    ) -> None:
        self._master = master
        self._info = scheduler_pb2.FrameworkInfo(
            name=name,
            role=role,
            framework_id=framework_id,
            failover_timeout_seconds=failover_timeout,
        )
        self._calls: asyncio.Queue[Call | None] = asyncio.Queue()
        self._ids = itertools.count(1)
        self._channel: grpc.aio.Channel | None = None
        self._stream: grpc.aio.StreamStreamCall[Call, Event] | None = None
        self.framework_id = ""

    async def _requests(self) -> AsyncIterator[Call]:
        while (call := await self._calls.get()) is not None:
            yield call

    async def __aenter__(self) -> RawFramework:
        self._channel = grpc_utils.create_channel(self._master)
        stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._stream = stub.Connect(self._requests())
        self.send(Call(subscribe=Call.Subscribe(framework_info=self._info)))
        event = await self.next_event("subscribed")
        self.framework_id = event.subscribed.framework_id
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        self._calls.put_nowait(None)
        if self._stream is not None:
            self._stream.cancel()
        if self._channel is not None:
            await self._channel.close()

    def send(self, call: Call) -> str:
        call.call_id = call.call_id or f"c{next(self._ids)}"
        self._calls.put_nowait(call)
        return call.call_id

    async def next_event(self, kind: str, timeout: float = 20.0) -> Event:
        """The next event of `kind`, skipping heartbeats and other kinds."""
        assert self._stream is not None

        async def read() -> Event:
            assert self._stream is not None
            while True:
                event = await self._stream.read()
                if event is grpc.aio.EOF:
                    raise AssertionError(f"stream ended while waiting for {kind}")
                if event.WhichOneof("event") == kind:
                    assert isinstance(event, Event)
                    return event

        return await within(read(), timeout, f"a {kind} event")

    def acknowledge(self, status: common_pb2.TaskStatus) -> None:
        if status.update_id:
            ack = Call.Acknowledge(
                agent_id=status.agent_id, task_id=status.task_id, update_id=status.update_id
            )
            self.send(Call(acknowledge=ack))

    async def next_update(self, timeout: float = 20.0) -> common_pb2.TaskStatus:
        """The next status update, acknowledged as the SDK would."""
        status = (await self.next_event("update", timeout)).update.status
        self.acknowledge(status)
        return status

    async def error_for(self, call: Call) -> str:
        """Send a call that must be rejected; return the master's error message."""
        call_id = self.send(call)
        event = await self.next_event("error")
        assert event.error.call_id == call_id
        return event.error.message
