"""Bad input gets a clear error, changes nothing, and the master keeps serving.

These tests speak raw protobuf (tests/raw_client.py): the SDK would refuse much
of this input before it left the process, and the point is what the master does.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from mesolite import grpc_utils
from mesolite.agent import Agent
from mesolite.master.stream_limits import GrpcStreamLimitsConfig
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import LocalCluster, fast
from tests.raw_client import Call, RawFramework, resources
from tests.waiting import within

Task = common_pb2.TaskInfo


def accept(offer_id: str, *tasks: Task) -> Call:
    return Call(accept=Call.Accept(offer_ids=[offer_id], tasks=list(tasks)))


def task(task_id: str, command: str = "sleep 30", **amounts: float) -> Task:
    return Task(task_id=task_id, command=command, resources=resources(**(amounts or {"cpus": 1})))


class Setup:
    def __init__(
        self, cluster: LocalCluster, agent: Agent, fw: RawFramework, offer: scheduler_pb2.Offer
    ) -> None:
        self.cluster, self.agent, self.fw, self.offer = cluster, agent, fw, offer

    async def remember(self) -> None:
        self.before = await self.cluster.state()

    async def assert_nothing_changed(self) -> None:
        state = await self.cluster.state()
        assert state["tasks"] == []
        assert state["offers"] == self.before["offers"]
        assert state["frameworks"][0]["allocated"] == self.before["frameworks"][0]["allocated"]
        assert state["agents"] == self.before["agents"] or [
            {k: v for k, v in a.items() if k != "seconds_since_heartbeat"} for a in state["agents"]
        ] == [
            {k: v for k, v in a.items() if k != "seconds_since_heartbeat"}
            for a in self.before["agents"]
        ]

    async def assert_still_serving(self) -> None:
        """A valid accept on the same offer still works and the task runs."""
        self.fw.send(accept(self.offer.offer_id, task("good", "sleep 30", cpus=1, mem=64)))
        while True:
            status = await self.fw.next_update()
            if status.state == common_pb2.TASK_RUNNING:
                assert status.task_id == "good"
                return


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    async with LocalCluster(tmp_path, fast(offer_timeout=0)) as cluster:
        agent = await cluster.add_agent("cpus:4;mem:4096")
        await cluster.add_agent("cpus:1;mem:1024", name="elsewhere")
        async with RawFramework(cluster.address) as fw:
            event = await fw.next_event("offers")
            offer = (
                next(o for o in event.offers.offers if o.agent_id == agent.agent_id)
                if any(o.agent_id == agent.agent_id for o in event.offers.offers)
                else None
            )
            while offer is None:
                event = await fw.next_event("offers")
                offer = next((o for o in event.offers.offers if o.agent_id == agent.agent_id), None)
            while len(cluster.master.offers) < 2:  # both agents offered
                await fw.next_event("offers")
            ready = Setup(cluster, agent, fw, offer)
            await ready.remember()
            yield ready


async def test_accepting_more_than_offered(setup: Setup) -> None:
    message = await setup.fw.error_for(accept(setup.offer.offer_id, task("big", cpus=5)))
    assert "need cpus:5" in message and "hold only" in message
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


async def test_unknown_offer(setup: Setup) -> None:
    message = await setup.fw.error_for(accept("no-such-offer", task("t")))
    assert "no-such-offer is not outstanding" in message
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


async def test_offer_already_used(setup: Setup) -> None:
    await setup.assert_still_serving()  # uses the offer
    message = await setup.fw.error_for(accept(setup.offer.offer_id, task("again")))
    assert "not outstanding" in message and "already used" in message
    state = await setup.cluster.state()
    assert [t["id"] for t in state["tasks"]] == ["good"]


async def test_launching_on_another_agent(setup: Setup) -> None:
    other = next(a for a in setup.cluster.master.agents if a != setup.agent.agent_id)
    wrong = task("moved", cpus=1)
    wrong.agent_id = other
    message = await setup.fw.error_for(accept(setup.offer.offer_id, wrong))
    assert f"names agent {other}" in message
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf])
async def test_bad_resource_amounts(setup: Setup, amount: float) -> None:
    message = await setup.fw.error_for(accept(setup.offer.offer_id, task("bad", cpus=amount)))
    assert "cpus: amount" in message
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


async def test_duplicate_task_ids_in_one_call(setup: Setup) -> None:
    message = await setup.fw.error_for(
        accept(setup.offer.offer_id, task("twin", cpus=1), task("twin", cpus=1))
    )
    assert "twin appears twice" in message
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


async def test_task_id_already_running(setup: Setup) -> None:
    await setup.assert_still_serving()  # "good" is running
    offer = (await setup.fw.next_event("offers")).offers.offers[0]
    message = await setup.fw.error_for(accept(offer.offer_id, task("good", cpus=0.5)))
    assert "good is already in use" in message


async def test_bad_decline_filter_and_unknown_kill(setup: Setup) -> None:
    decline = Call(
        decline=Call.Decline(
            offer_ids=[setup.offer.offer_id], filters=scheduler_pb2.Filters(refuse_seconds=math.nan)
        )
    )
    assert "refuse_seconds" in await setup.fw.error_for(decline)
    kill = Call(kill=Call.Kill(task_id="ghost"))
    assert "ghost is not a running task" in await setup.fw.error_for(kill)
    await setup.assert_nothing_changed()
    await setup.assert_still_serving()


async def test_rescinded_offer(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, fast(offer_timeout=0.3)) as cluster:
        await cluster.add_agent("cpus:1;mem:1024")
        async with RawFramework(cluster.address) as fw:
            offer = (await fw.next_event("offers")).offers.offers[0]
            rescind = await fw.next_event("rescind")
            assert rescind.rescind.offer_id == offer.offer_id
            message = await fw.error_for(accept(offer.offer_id, task("late")))
            assert "not outstanding" in message
            assert (await cluster.state())["tasks"] == []
            # The resources come back in a new offer that works.
            fresh = (await fw.next_event("offers")).offers.offers[0]
            fw.send(accept(fresh.offer_id, task("ok", "sleep 30", cpus=1, mem=64)))
            assert (await fw.next_update()).task_id == "ok"


async def test_unknown_framework_id_is_refused(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with RawFramework(cluster.address, framework_id="made-up"):
                pass
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert "made-up is not known" in (refused.value.details() or "")
        assert cluster.master.frameworks == {}
        async with RawFramework(cluster.address) as fw:  # still serving
            assert fw.framework_id


async def test_invalid_framework_info_is_refused(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        for info in [
            dict(name=""),
            dict(name="x", role="bad role!"),
            dict(name="x", failover_timeout=-1.0),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async with RawFramework(cluster.address, **info):  # type: ignore[arg-type]
                    pass
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert cluster.master.frameworks == {}


async def test_agent_with_bad_resources_is_refused(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        channel = grpc_utils.create_channel(cluster.address)
        stub = agent_pb2_grpc.AgentGatewayStub(channel)
        for total in [{"cpus": -4.0}, {"cpus": math.nan}, {}]:
            register = agent_pb2.AgentCall(
                register=agent_pb2.AgentCall.Register(
                    hostname="bad", total=common_pb2.Resources(scalars=total)
                )
            )

            async def once(r: agent_pb2.AgentCall = register) -> AsyncIterator[agent_pb2.AgentCall]:
                yield r

            call = stub.Connect(once())
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await within(call.read(), 10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await channel.close()
        assert cluster.master.agents == {}
        assert (await cluster.state())["cluster"]["total"] == {}


async def test_calls_before_subscribe_are_refused(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        channel = grpc_utils.create_channel(cluster.address)
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        async def calls() -> AsyncIterator[Call]:
            yield Call(revive=Call.Revive())

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await within(stub.Connect(calls()).read(), 10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "first call must be SUBSCRIBE" in (refused.value.details() or "")
        await channel.close()


async def test_a_framework_that_never_acknowledges_holds_nothing(tmp_path: Path) -> None:
    """The agent sends FINISHED only after RUNNING is acknowledged; this framework never
    acknowledges, yet the task's resources come back: the agent's retries of RUNNING
    carry the task's latest state, and it is terminal."""
    async with LocalCluster(tmp_path, fast()) as cluster:
        await cluster.add_agent("cpus:1;mem:1024")
        async with RawFramework(cluster.address) as fw:
            offer = (await fw.next_event("offers")).offers.offers[0]
            fw.send(accept(offer.offer_id, task("quick", "true", cpus=1, mem=1024)))
            first = (await fw.next_event("update")).update.status  # never acknowledged
            assert first.state == common_pb2.TASK_STARTING
            # Freed: offered again (whole), with no acknowledgement ever sent.
            again_offered = (await fw.next_event("offers")).offers.offers[0]
            assert again_offered.resources.scalars["cpus"] == 1
            assert not cluster.master.frameworks[fw.framework_id].tasks
            # The framework still sees the task's updates in order, unacknowledged.
            again = (await fw.next_event("update")).update.status
            assert (again.task_id, again.update_id) == ("quick", first.update_id)


async def test_a_subscription_the_acls_refuse_is_permission_denied(tmp_path: Path) -> None:
    acls = tmp_path / "acls.json"
    rule = {"principals": {"type": "ANY"}, "roles": {"values": ["ok"]}}
    acls.write_text(json.dumps({"register_frameworks": [rule]}))
    async with LocalCluster(tmp_path, fast(acls_file=acls)) as cluster:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with RawFramework(cluster.address, role="other"):
                pass
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "may not register frameworks in role 'other'" in (refused.value.details() or "")
        assert cluster.master.frameworks == {}
        async with RawFramework(cluster.address, role="ok") as fw:  # still serving
            assert fw.framework_id


async def test_streams_that_never_subscribe_are_bounded_and_timed_out(tmp_path: Path) -> None:
    """Idle streams once stayed forever (2,000 of them were kept). Per client, at most
    `waiting_per_client` may wait for their first message, each at most
    `first_message_timeout`; other clients and later streams are served."""
    limits = GrpcStreamLimitsConfig(waiting_per_client=3, first_message_timeout=1.0)
    async with LocalCluster(tmp_path, fast(grpc_streams=limits)) as cluster:
        channel = grpc_utils.create_channel(cluster.address)
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        idle = [stub.Connect() for _ in range(4)]  # open, never write
        try:
            codes = await within(
                asyncio.gather(*(call.code() for call in idle)), 20, "the idle streams to end"
            )
            assert sorted(c.name for c in codes) == ["DEADLINE_EXCEEDED"] * 3 + [
                "RESOURCE_EXHAUSTED"
            ]
        finally:
            for call in idle:
                call.cancel()
            await channel.close()
        async with RawFramework(cluster.address) as fw:  # the next one is served
            assert fw.framework_id


async def test_a_message_over_4_mib_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:1;mem:1024")
        async with RawFramework(cluster.address) as fw:
            offer = (await fw.next_event("offers")).offers.offers[0]
            huge = task("t", "x" * (grpc_utils.MAX_CLIENT_MESSAGE + 1), cpus=1, mem=64)
            fw.send(accept(offer.offer_id, huge))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await fw.next_event("update", timeout=20)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The stream ended (and the framework, failover timeout 0, with it): no launch.
        assert all(not f.tasks for f in cluster.master.frameworks.values())
        assert not cluster.master.agents[agent.agent_id].tasks
        async with RawFramework(cluster.address) as again:  # still serving
            assert again.framework_id
