"""The framework SDK against a fake master: subscription, offers and calls, status
updates, reconnection and fatal rejections."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
import structlog.testing

from mesolite.framework_sdk import (
    ConnectionConfig,
    Framework,
    FrameworkRejected,
    MesoliteError,
    NotConnected,
    Offer,
    Resources,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from mesolite.v1 import scheduler_pb2
from tests.test_sdk_fake_master import FakeMaster, fake_master, running
from tests.waiting import wait_for_condition, within

Event = scheduler_pb2.Event
FAST = ConnectionConfig(reconnect_initial=0.01, reconnect_max=0.05, stop_grace=1.0)


class Recorder(Framework):
    """Records every callback as (name, args...); on_update can be held on an event."""

    def __init__(self, connection: ConnectionConfig = FAST, **kwargs: Any) -> None:
        super().__init__(name="recorder", connection=connection, **kwargs)
        self.events: list[tuple[Any, ...]] = []
        self.hold_updates: asyncio.Event | None = None

    def seen(self, name: str) -> list[tuple[Any, ...]]:
        return [e[1:] for e in self.events if e[0] == name]

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self.events.append(("subscribed", framework_id, resubscribed))

    async def on_offers(self, offers: list[Offer]) -> None:
        self.events.append(("offers", offers))

    async def on_rescind(self, offer_id: str) -> None:
        self.events.append(("rescind", offer_id))

    async def on_update(self, status: TaskStatus) -> None:
        self.events.append(("update", status))
        if self.hold_updates is not None:
            await self.hold_updates.wait()

    async def on_agent_lost(self, agent_id: str) -> None:
        self.events.append(("agent_lost", agent_id))

    async def on_error(self, message: str, call_id: str) -> None:
        self.events.append(("error", message, call_id))

    async def on_disconnected(self) -> None:
        self.events.append(("disconnected",))


def offer(offer_id: str, agent_id: str = "a1", **amounts: float) -> Offer:
    return Offer(
        offer_id=offer_id,
        framework_id="fw-1",
        agent_id=agent_id,
        hostname=f"host-{agent_id}",
        resources=Resources(amounts or {"cpus": 4, "mem": 4096}),
    )


def status(task_id: str, state: TaskState, update_id: str = "", **kw: Any) -> TaskStatus:
    return TaskStatus(
        task_id=task_id, framework_id="fw-1", agent_id="a1", state=state, update_id=update_id, **kw
    )


async def wait_for_calls(master: FakeMaster, kind: str, count: int = 1) -> list[Any]:
    await wait_for_condition(lambda: len(master.calls_of(kind)) >= count, what=f"{count} {kind}")
    return master.calls_of(kind)


async def test_subscribe_reports_the_framework_id() -> None:
    framework = Recorder(role="analytics", failover_timeout=30.0)
    async with fake_master() as master, running(framework, master):
        await wait_for_condition(lambda: bool(framework.seen("subscribed")), what="on_subscribed")
        assert framework.seen("subscribed") == [("fw-1", False)]
        assert framework.framework_id == "fw-1"
        info = master.calls_of("subscribe")[0].framework_info
        assert (info.name, info.role, info.failover_timeout_seconds) == (
            "recorder",
            "analytics",
            30,
        )
        assert info.framework_id == ""
        # Calls arrive in order, so once this revive is in nothing came before it but the
        # subscription: a first subscription has nothing to reconcile.
        await framework.revive()
        await wait_for_calls(master, "revive")
        assert master.kinds() == ["subscribe", "revive"]


async def test_offers_reach_on_offers_and_launch_sends_an_accept() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        first, second = offer("o1", "a1"), offer("o2", "a2", cpus=1, mem=512)
        master.send_offers(first, second)
        await wait_for_condition(lambda: bool(framework.seen("offers")), what="on_offers")
        assert framework.seen("offers") == [([first, second],)]
        assert set(framework.outstanding_offers) == {"o1", "o2"}

        task = TaskSpec(task_id="t1", command="sleep 1", resources=Resources(cpus=1, mem=128))
        call_id = await framework.launch(first, [task], refuse_seconds=0)

        (accept,) = await wait_for_calls(master, "accept")
        assert master.calls[-1].call_id == call_id
        assert list(accept.offer_ids) == ["o1"]
        (sent,) = accept.tasks
        assert (sent.task_id, sent.command, sent.agent_id) == ("t1", "sleep 1", "a1")
        assert dict(sent.resources.scalars) == {"cpus": 1.0, "mem": 128.0}
        assert accept.filters.HasField("refuse_seconds") and accept.filters.refuse_seconds == 0
        assert set(framework.outstanding_offers) == {"o2"}


async def test_launch_checks_offers_and_resources_before_sending() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        big = TaskSpec(task_id="t1", command="true", resources=Resources(cpus=8))
        with pytest.raises(ValueError, match="need"):
            await framework.launch(offer("o1"), [big])
        small = TaskSpec(task_id="t2", command="true", resources=Resources(cpus=1))
        with pytest.raises(ValueError, match="one agent"):
            await framework.launch([offer("o1", "a1"), offer("o2", "a2")], [small])
        elsewhere = TaskSpec(
            task_id="t3", command="true", resources=Resources(cpus=1), agent_id="a9"
        )
        with pytest.raises(ValueError, match="names agent"):
            await framework.launch(offer("o1", "a1"), [elsewhere])
        await framework.revive()
        await wait_for_calls(master, "revive")
        assert master.kinds() == ["subscribe", "revive"]


async def test_decline_sends_the_refuse_filter_only_when_given() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        await framework.decline(offer("o1"), refuse_seconds=7.5)
        await framework.decline([offer("o2"), offer("o3")])
        first, second = await wait_for_calls(master, "decline", 2)
        assert list(first.offer_ids) == ["o1"] and first.filters.refuse_seconds == 7.5
        assert list(second.offer_ids) == ["o2", "o3"]
        assert not second.filters.HasField("refuse_seconds")  # the master's 5 s default


async def test_rescinded_offers_are_forgotten() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        master.send_offers(offer("o1"), offer("o2"))
        master.send(Event(rescind=Event.Rescind(offer_id="o1")))
        await wait_for_condition(lambda: bool(framework.seen("rescind")), what="on_rescind")
        assert framework.seen("rescind") == [("o1",)]
        assert set(framework.outstanding_offers) == {"o2"}


async def test_errors_and_agent_failures_reach_their_callbacks() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        call_id = await framework.kill("t1")
        master.send(Event(error=Event.Error(message="unknown task t1", call_id=call_id)))
        master.send(Event(heartbeat=Event.Heartbeat()))
        master.send(Event(failure=Event.Failure(agent_id="a1")))
        await wait_for_condition(lambda: bool(framework.seen("agent_lost")), what="on_agent_lost")
        assert framework.seen("error") == [("unknown task t1", call_id)]
        assert framework.seen("agent_lost") == [("a1",)]


async def test_updates_are_shown_once_and_acknowledged_after_the_callback() -> None:
    framework = Recorder()
    framework.hold_updates = asyncio.Event()
    async with fake_master() as master, running(framework, master):
        running_update = status("t1", TaskState.RUNNING, update_id="u1")
        master.send_update(running_update)
        await wait_for_condition(lambda: bool(framework.seen("update")), what="on_update")
        assert framework.seen("update") == [(running_update,)]
        # The callback has not returned, so nothing can be acknowledged yet.
        assert master.calls_of("acknowledge") == []
        framework.hold_updates.set()
        (ack,) = await wait_for_calls(master, "acknowledge")
        assert (ack.agent_id, ack.task_id, ack.update_id) == ("a1", "t1", "u1")

        # The master sends u1 again (as if our acknowledgement were lost): acknowledged
        # again, not shown again. A reconciliation answer has no update id: shown, not acked.
        finished = status("t1", TaskState.FINISHED, update_id="u2", exit_code=0)
        reconciled = status("t1", TaskState.FINISHED, exit_code=0)
        master.send_update(running_update)
        master.send_update(reconciled)
        master.send_update(finished)
        acks = await wait_for_calls(master, "acknowledge", 3)
        assert [a.update_id for a in acks] == ["u1", "u1", "u2"]
        assert framework.seen("update") == [(running_update,), (reconciled,), (finished,)]
        assert framework.seen("update")[2][0].exit_code == 0


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (None, ""),
        (grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)"),
        # How a SIGKILLed master can look when a call was being written at that moment:
        # the write fails inside gRPC core, which sets the call's status to INTERNAL,
        # and the read then reports that instead of UNAVAILABLE (fault injection, seed
        # 178: a framework took it as fatal and never came back).
        (grpc.StatusCode.INTERNAL, "Internal error from Core"),
        # Some gRPC versions report a broken stream as UNKNOWN (grpc/grpc#34076).
        (grpc.StatusCode.UNKNOWN, "Stream removed"),
    ],
)
async def test_reconnects_resubscribes_and_reconciles(
    code: grpc.StatusCode | None, details: str
) -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master):
        master.send_offers(offer("o1"))
        await wait_for_condition(lambda: bool(framework.seen("offers")), what="on_offers")
        master.end_stream(code, details)

        resubscribe, reconcile = await within(_resubscription(master), what="resubscription")
        assert resubscribe.framework_info.framework_id == "fw-1"
        assert list(reconcile.task_ids) == []  # all tasks
        await wait_for_condition(
            lambda: len(framework.seen("subscribed")) == 2, what="resubscribed"
        )
        assert framework.seen("subscribed") == [("fw-1", False), ("fw-1", True)]
        assert framework.seen("disconnected") == [()]
        assert framework.outstanding_offers == {}  # offers died with the connection


async def _resubscription(master: FakeMaster) -> tuple[Any, Any]:
    """The second subscribe and the call right after it, which must be a reconcile."""
    await wait_for_calls(master, "reconcile")
    kinds = master.kinds()
    second = [i for i, k in enumerate(kinds) if k == "subscribe"][1]
    assert kinds[second + 1] == "reconcile", kinds
    return master.calls[second].subscribe, master.calls[second + 1].reconcile


async def test_a_silent_master_is_left_after_three_heartbeats() -> None:
    framework = Recorder()
    async with fake_master() as master:
        master.heartbeat_interval = 0.05  # and the fake never sends one
        async with running(framework, master):
            await wait_for_condition(lambda: master.streams_opened >= 2, what="a new stream")
            await wait_for_condition(lambda: len(framework.seen("subscribed")) >= 2, what="resub")
            assert framework.seen("subscribed")[1] == ("fw-1", True)


async def test_a_transient_rejection_is_retried() -> None:
    framework = Recorder()
    async with fake_master() as master:
        master.reject.append((grpc.StatusCode.UNAVAILABLE, "not the leader yet"))
        async with running(framework, master):
            await wait_for_condition(lambda: bool(framework.seen("subscribed")), what="subscribed")
            assert len(master.calls_of("subscribe")) == 2
            assert framework.seen("subscribed") == [("fw-1", False)]


@pytest.mark.parametrize("code", [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT])
async def test_a_rejected_subscription_is_fatal(code: grpc.StatusCode) -> None:
    framework = Recorder(framework_id="fw-gone")
    async with fake_master() as master:
        master.reject.append((code, "no such framework"))
        with pytest.raises(FrameworkRejected) as raised:
            await within(framework.run(master.address), what="run()")
        assert isinstance(raised.value, MesoliteError)
        assert (raised.value.code, raised.value.details) == (code.name, "no such framework")
        assert len(master.calls_of("subscribe")) == 1  # no retry
        assert framework.events == []


async def test_stop_ends_run_and_later_calls_raise() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master) as task:
        await within(framework.stop(), what="stop()")
        assert task.done() and task.exception() is None
        assert not framework.connected
        with pytest.raises(NotConnected):
            await framework.revive()
        await wait_for_condition(lambda: not master.connected, what="the stream to close")
        assert framework.seen("disconnected") == []


async def test_teardown_is_delivered_and_ends_run() -> None:
    framework = Recorder()
    async with fake_master() as master, running(framework, master) as task:
        call_id = await within(framework.teardown(), what="teardown()")
        assert task.done() and task.exception() is None
        (teardown,) = [c for c in master.calls if c.HasField("teardown")]
        assert teardown.call_id == call_id


async def test_stop_from_a_callback_ends_run_after_it() -> None:
    class StopOnOffers(Recorder):
        async def on_offers(self, offers: list[Offer]) -> None:
            await self.decline(offers, refuse_seconds=1)
            await self.stop()

    framework = StopOnOffers()
    async with fake_master() as master, running(framework, master) as task:
        master.send_offers(offer("o1"))
        await within(asyncio.wait({task}), what="run() to end")
        assert task.exception() is None
        # stop() let the queued decline reach the master before closing the stream.
        assert len(master.calls_of("decline")) == 1


async def test_an_exception_in_a_callback_ends_run() -> None:
    class Broken(Recorder):
        async def on_offers(self, offers: list[Offer]) -> None:
            raise RuntimeError("bug in the framework")

    framework = Broken()
    async with fake_master() as master, running(framework, master, raises=RuntimeError) as task:
        master.send_offers(offer("o1"))
        await within(asyncio.wait({task}), what="run() to end")
        assert isinstance(task.exception(), RuntimeError)


async def test_keeps_retrying_until_a_master_appears() -> None:
    async with fake_master() as gone:
        address = gone.address  # a port nothing listens on once this server is stopped
    with structlog.testing.capture_logs() as logs:
        framework = Recorder()
        task = asyncio.create_task(framework.run(address))
        try:
            await wait_for_condition(
                lambda: sum(e["event"] == "reconnecting" for e in logs) >= 2, what="retries"
            )
            assert not task.done()
            async with fake_master(address) as master:
                await wait_for_condition(lambda: framework.connected, what="SUBSCRIBED")
                assert len(master.calls_of("subscribe")) == 1
                assert framework.seen("subscribed") == [("fw-1", False)]
                assert framework.seen("disconnected") == []  # it never was connected before
                await within(framework.stop(), what="stop()")
        finally:
            await within(framework.stop(), what="stop()")
    assert task.exception() is None


async def test_offers_are_declined_unless_on_offers_is_overridden() -> None:
    class Idle(Framework):
        pass

    framework = Idle("idle")
    async with fake_master() as master, running(framework, master):
        master.send_offers(offer("o1"), offer("o2"))
        (decline,) = await wait_for_calls(master, "decline")
        assert list(decline.offer_ids) == ["o1", "o2"]
        assert framework.outstanding_offers == {}
