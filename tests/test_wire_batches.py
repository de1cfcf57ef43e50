"""Batched wire messages: the master sends a peer several events in one message only if
it asked (Register.batches, Subscribe.batches), never its first one; it reads batches
of calls from anyone, handling each as if it came alone, within bounds; and whatever a
message acknowledges is committed to the registry before the message is written.

Raw protobuf on both ends (real gRPC on 127.0.0.1, an in-process master), so the tests
see exactly which messages cross the wire.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc.aio
import pytest

from mesolite import grpc_utils
from mesolite.master.validation import MAX_BATCH_CALLS
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import LocalCluster
from tests.waiting import within

pytestmark = pytest.mark.integration

ACall = agent_pb2.AgentCall
AEvent = agent_pb2.AgentEvent
Call = scheduler_pb2.Call
Event = scheduler_pb2.Event
C = TypeVar("C")
E = TypeVar("E")


class _RawStream(Generic[C, E]):
    """One raw stream to the master: what it sends, and every event recorded as it came
    (batches not unwrapped)."""

    def __init__(self, master: str) -> None:
        self._master = master
        self.events: list[E] = []
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()

    async def _open(self, connect: Callable[[grpc.aio.Channel], Any], first: C) -> E:
        self._channel = grpc_utils.create_channel(self._master)
        self._call = connect(self._channel)
        await self._call.write(first)
        self._reader = asyncio.create_task(self._read())
        await self.wait_for(lambda: bool(self.events), "the first event")
        return self.events[0]

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._call is not None:
            self._call.cancel()
        if self._channel is not None:
            await self._channel.close()

    async def _read(self) -> None:
        while (event := await self._call.read()) is not grpc.aio.EOF:
            self.events.append(event)
            self._arrived.set()

    async def send(self, call: C) -> None:
        await self._call.write(call)

    def unwrapped(self, kind: str | None = None) -> list[E]:
        out: list[E] = []
        for e in self.events:
            out.extend(e.batch.events if e.WhichOneof("event") == "batch" else [e])  # type: ignore[attr-defined]
        return [e for e in out if kind is None or e.WhichOneof("event") == kind]  # type: ignore[attr-defined]

    async def wait_for(self, check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
        async def until() -> None:
            while not check():
                self._arrived.clear()
                await self._arrived.wait()

        await within(until(), timeout, what)


class RawAgent(_RawStream[ACall, AEvent]):
    """An agent that speaks raw protobuf."""

    def __init__(self, master: str, hostname: str, batches: bool) -> None:
        super().__init__(master)
        self._register = ACall.Register(
            hostname=hostname,
            total=common_pb2.Resources(scalars={"cpus": 64.0, "mem": 65536.0}),
            batches=batches,
        )
        self.agent_id = ""

    async def __aenter__(self) -> RawAgent:
        first = await self._open(
            lambda ch: agent_pb2_grpc.AgentGatewayStub(ch).Connect(),
            ACall(register=self._register),
        )
        assert first.WhichOneof("event") == "registered"
        self.agent_id = first.registered.agent_id
        return self


class BatchingFramework(_RawStream[Call, Event]):
    """A framework that asks for batches, on raw protobuf."""

    async def __aenter__(self) -> BatchingFramework:
        info = scheduler_pb2.FrameworkInfo(name="batching")
        first = await self._open(
            lambda ch: scheduler_pb2_grpc.SchedulerStub(ch).Connect(),
            Call(subscribe=Call.Subscribe(framework_info=info, batches=True)),
        )
        assert first.WhichOneof("event") == "subscribed" and first.subscribed.batches
        self.framework_id = first.subscribed.framework_id
        return self

    async def offer_on(self, agent_id: str) -> scheduler_pb2.Offer:
        def found() -> scheduler_pb2.Offer | None:
            for event in self.unwrapped("offers"):
                for offer in event.offers.offers:
                    if offer.agent_id == agent_id:
                        return offer
            return None

        await self.wait_for(lambda: found() is not None, f"an offer on {agent_id}")
        offer = found()
        assert offer is not None
        return offer

    async def error_for(self, call_id: str) -> str:
        def found() -> str | None:
            for event in self.unwrapped("error"):
                if event.error.call_id == call_id:
                    return event.error.message
            return None

        await self.wait_for(lambda: found() is not None, f"the error for {call_id}")
        message = found()
        assert message is not None
        return message


def tasks(prefix: str, count: int) -> list[common_pb2.TaskInfo]:
    return [
        common_pb2.TaskInfo(
            task_id=f"{prefix}-{i}",
            command="true",
            resources=common_pb2.Resources(scalars={"cpus": 1.0, "mem": 32.0}),
        )
        for i in range(count)
    ]


def twenty_launched(agent: RawAgent) -> bool:
    return len(launches(agent)) == 20


def launches(agent: RawAgent) -> list[AEvent.LaunchTask]:
    return [e.launch_task for e in agent.unwrapped("launch_task")]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path) as cluster:
        yield cluster


async def test_only_a_peer_that_asked_gets_batches_and_never_its_first_message(
    cluster: LocalCluster,
) -> None:
    async with (
        RawAgent(cluster.address, "asks", batches=True) as asks,
        RawAgent(cluster.address, "does-not", batches=False) as plain,
        BatchingFramework(cluster.address) as fw,
    ):
        for agent, prefix in ((asks, "a"), (plain, "p")):
            offer = await fw.offer_on(agent.agent_id)
            await fw.send(
                Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=tasks(prefix, 20)))
            )
            await agent.wait_for(functools.partial(twenty_launched, agent), "20 launches")
        # One ACCEPT's launches were queued together: the agent that asked got them in
        # batches; the other, one message each. Registered came alone to both.
        kinds = [e.WhichOneof("event") for e in asks.events]
        assert kinds[0] == "registered" and "batch" in kinds
        assert all(k in ("registered", "launch_task", "batch") for k in kinds)
        plain_kinds = [e.WhichOneof("event") for e in plain.events]
        assert plain_kinds == ["registered"] + ["launch_task"] * 20
        assert [t.task.task_id for t in launches(asks)] == [f"a-{i}" for i in range(20)]
        assert asks.events[0].registered.batches and plain.events[0].registered.batches


async def test_batched_calls_are_each_handled_as_if_alone(cluster: LocalCluster) -> None:
    async with (
        RawAgent(cluster.address, "a", batches=True) as agent,
        BatchingFramework(cluster.address) as fw,
    ):
        offer = await fw.offer_on(agent.agent_id)
        batch = Call.Batch(
            calls=[
                Call(call_id="bad", accept=Call.Accept(offer_ids=["no-such-offer"])),
                Call(
                    call_id="good",
                    accept=Call.Accept(offer_ids=[offer.offer_id], tasks=tasks("t", 2)),
                ),
                Call(call_id="nested", batch=Call.Batch(calls=[Call(revive=Call.Revive())])),
            ]
        )
        await fw.send(Call(call_id="outer", batch=batch))
        assert "not outstanding" in await fw.error_for("bad")
        assert "a batch may not hold a batch" in await fw.error_for("nested")
        await agent.wait_for(lambda: len(launches(agent)) == 2, "the good accept's launches")
        assert not [e for e in fw.unwrapped("error") if e.error.call_id == "good"]

        # The agent's batched updates reach the framework, each as if sent alone.
        updates = ACall.Batch(
            calls=[
                ACall(
                    status_update=ACall.StatusUpdate(
                        status=common_pb2.TaskStatus(
                            task_id=launch.task.task_id,
                            framework_id=fw.framework_id,
                            agent_id=agent.agent_id,
                            state=common_pb2.TASK_RUNNING,
                            update_id=f"u-{launch.task.task_id}",
                            source=common_pb2.TaskStatus.SOURCE_AGENT,
                        )
                    )
                )
                for launch in launches(agent)
            ]
        )
        await agent.send(ACall(batch=updates))
        await fw.wait_for(lambda: len(fw.unwrapped("update")) == 2, "both updates")
        assert {e.update.status.task_id for e in fw.unwrapped("update")} == {"t-0", "t-1"}


async def test_a_batch_over_the_bound_is_refused_whole(cluster: LocalCluster) -> None:
    async with (
        RawAgent(cluster.address, "a", batches=True) as agent,
        BatchingFramework(cluster.address) as fw,
    ):
        offer = await fw.offer_on(agent.agent_id)
        accept = Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=tasks("t", 1)))
        calls = [accept] + [Call(revive=Call.Revive())] * MAX_BATCH_CALLS
        await fw.send(Call(call_id="big", batch=Call.Batch(calls=calls)))
        assert f"more than {MAX_BATCH_CALLS}" in await fw.error_for("big")
        # Nothing of it was applied: the offer is still outstanding.
        assert offer.offer_id in cluster.master.offers
        assert launches(agent) == []


async def test_a_launch_reaches_its_agent_only_once_the_registry_holds_it(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Commits are batched per turn of the loop; the stream writers commit before they
    write. With the end-of-turn commit never run, only the writers' commits remain: the
    agent must still never see a launch the registry does not hold."""
    registry = cluster.master.registry
    registry.flush()
    registry.defer_commits(lambda flush: None)  # no end-of-turn commit
    assert cluster.config.work_dir is not None
    path = cluster.config.work_dir / "registry.sqlite"
    async with (
        RawAgent(cluster.address, "a", batches=True) as agent,
        BatchingFramework(cluster.address) as fw,
    ):
        offer = await fw.offer_on(agent.agent_id)
        await fw.send(Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=tasks("t", 3))))
        await agent.wait_for(lambda: len(launches(agent)) == 3, "the launches")
        # Read as another process would (a restarted master), right as they arrived.
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT task_id FROM tasks ORDER BY task_id").fetchall()
        assert rows == [("t-0",), ("t-1",), ("t-2",)]
