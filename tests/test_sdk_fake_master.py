"""A scriptable stand-in for the master's Scheduler service, for the framework SDK tests.

It is a real grpc.aio server on 127.0.0.1, port 0. It answers a subscription with
SUBSCRIBED (reusing the framework id it is given), an implicit reconciliation with
RECONCILED at once (it knows no tasks; `answer_reconciliations = False` leaves them
unanswered, for `reconciled()` to answer), records every call it receives, sends
whatever events a test hands it, and ends streams as a test asks: cleanly, with a gRPC
status, or after a teardown as the real master does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio

from mesolite import convert
from mesolite.framework_sdk import Framework
from mesolite.grpc_utils import bind, create_server
from mesolite.model import Offer, TaskStatus
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.waiting import wait_for_condition, within

Event = scheduler_pb2.Event


class FakeMaster(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.address = ""
        self.calls: list[scheduler_pb2.Call] = []  # every call received, over all streams
        self.reject: list[tuple[grpc.StatusCode, str]] = []  # end the next subscriptions so
        self.heartbeat_interval = 0.0
        self.framework_id = "fw-1"  # given to a framework that subscribes without one
        self.streams_opened = 0
        self.answer_reconciliations = True
        self._outbox: asyncio.Queue[Event | tuple[grpc.StatusCode, str] | None] | None = None

    # -- the service -------------------------------------------------------------------------

    # grpc.aio also serves a coroutine that writes through the context; the generated
    # stub only knows the iterator form.
    async def Connect(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        first = await context.read()
        self.calls.append(first)
        assert first.HasField("subscribe"), first
        if self.reject:
            await context.abort(*self.reject.pop(0))
        self.streams_opened += 1
        outbox: asyncio.Queue[Event | tuple[grpc.StatusCode, str] | None] = asyncio.Queue()
        self._outbox = outbox
        reader = asyncio.create_task(self._read_calls(context, outbox))
        try:
            framework_id = first.subscribe.framework_info.framework_id or self.framework_id
            await context.write(
                Event(
                    subscribed=Event.Subscribed(
                        framework_id=framework_id,
                        heartbeat_interval_seconds=self.heartbeat_interval,
                    )
                )
            )
            while (item := await outbox.get()) is not None:
                if isinstance(item, tuple):
                    await context.abort(*item)
                await context.write(item)
        finally:
            if self._outbox is outbox:
                self._outbox = None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read_calls(self, context: Any, outbox: asyncio.Queue[Any]) -> None:
        while (call := await context.read()) is not grpc.aio.EOF:
            self.calls.append(call)
            if call.HasField("teardown"):
                outbox.put_nowait(None)
            elif self.answer_reconciliations and _implicit_reconciliation(call):
                outbox.put_nowait(_reconciled(call.call_id))
        outbox.put_nowait(None)  # the framework half-closed: end the stream, as the master does

    # -- what tests use ----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._outbox is not None

    def calls_of(self, kind: str) -> list[Any]:
        """The payloads of the calls of one kind, e.g. `calls_of("accept")`."""
        return [getattr(c, kind) for c in self.calls if c.WhichOneof("call") == kind]

    def kinds(self) -> list[str]:
        return [str(c.WhichOneof("call")) for c in self.calls]

    def send(self, event: Event) -> None:
        assert self._outbox is not None, "no framework is connected"
        self._outbox.put_nowait(event)

    def send_offers(self, *offers: Offer) -> None:
        self.send(Event(offers=Event.Offers(offers=[convert.offer_to_proto(o) for o in offers])))

    def send_update(self, status: TaskStatus) -> None:
        self.send(Event(update=Event.Update(status=convert.status_to_proto(status))))

    def reconciled(self, call_id: str, tasks: int = 0) -> None:
        """Confirm the implicit reconciliation `call_id`."""
        self.send(_reconciled(call_id, tasks))

    def end_stream(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        """End the current stream: cleanly, or with the status `code`."""
        assert self._outbox is not None, "no framework is connected"
        self._outbox.put_nowait(None if code is None else (code, details))
        self._outbox = None


def _implicit_reconciliation(call: scheduler_pb2.Call) -> bool:
    return call.HasField("reconcile") and not call.reconcile.task_ids


def _reconciled(call_id: str, tasks: int = 0) -> Event:
    return Event(reconciled=Event.Reconciled(call_id=call_id, tasks=tasks))


@contextlib.asynccontextmanager
async def fake_master(address: str = "127.0.0.1:0") -> AsyncIterator[FakeMaster]:
    """A fake master serving on `address` (any free port by default)."""
    master = FakeMaster()
    server = create_server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(master, server)
    host, _, port = address.rpartition(":")
    master.address = f"{host}:{bind(server, host, int(port))}"
    await server.start()
    try:
        yield master
    finally:
        await server.stop(0)


@contextlib.asynccontextmanager
async def running(
    framework: Framework,
    master: FakeMaster,
    raises: type[BaseException] | None = None,
) -> AsyncIterator[asyncio.Task[None]]:
    """Run `framework` against `master` in the background, subscribed; stop it on exit.

    On exit `run()` must have ended by itself or end on `stop()`, and whatever it
    raised is raised here, so a test cannot pass over a crash. A test that
    expects `run()` to fail says so with `raises`: then it must fail that way.
    """
    task = asyncio.create_task(framework.run(master.address))
    try:
        await wait_for_condition(lambda: framework.connected or task.done(), what="SUBSCRIBED")
        yield task
    finally:
        await within(framework.stop(), what="stop()")
        try:
            await within(asyncio.wait({task}), what="run() to end after stop()")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    error = task.exception()
    if raises is None:
        if error is not None:
            raise error
    elif not isinstance(error, raises):
        raise AssertionError(f"run() should have raised {raises.__name__}, not {error!r}")
