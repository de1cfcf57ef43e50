"""The read model (master/read_model.py): the figures it derives, on a real cluster, and
GET /state, GET /metrics and the in-process snapshot showing the same ones."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from framework_sdk import Resources, TaskSpec, TaskState
from master.read_model import agent_snapshot, build_snapshot
from mesolite.resources import EMPTY
from mesolite.snapshot import AgentHealth, ClusterSnapshot
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.scraping import scrape, value
from tests.waiting import wait_for_condition


async def test_shares_count_every_resource_and_split_used_from_offered(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:4;mem:4096;gpus:2", name="gpu-box")
        fw = RecordingFramework("trainer")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            # Half the GPUs, a quarter of the CPUs, 1/16 of the memory: GPUs dominate.
            task = TaskSpec("gpu-1", "sleep 60", Resources(cpus=1, mem=256, gpus=1))
            await fw.launch(offer, [task], refuse_seconds=3600)
            await fw.wait_state("gpu-1", TaskState.RUNNING)
            snapshot = build_snapshot(cluster.master)
            document = await cluster.state()
            samples = await scrape(cluster.server.http_address)

    [f] = snapshot.frameworks
    assert f.used == Resources(cpus=1, mem=256, gpus=1)
    assert f.offered == EMPTY  # the rest of the agent is refused for an hour
    assert f.allocated == f.used
    assert f.used_dominant_share == pytest.approx(0.5)
    assert f.dominant_share == pytest.approx(0.5)
    assert f.weighted_dominant_share == pytest.approx(0.5)  # weight 1, DRF
    [a] = snapshot.agents
    assert a.used == a.allocated == f.used
    assert a.free == Resources(cpus=3, mem=3840, gpus=1)
    [role] = [r for r in snapshot.roles if r.path == "*"]
    assert role.dominant_share == pytest.approx(0.5) and role.frameworks == 1

    # One read model: /state and /metrics show the figures the snapshot has.
    [shown] = ClusterSnapshot.from_json(document).frameworks
    assert shown.dominant_share == pytest.approx(0.5)
    labels = {"framework_id": f.id, "name": "trainer", "role": "*"}
    assert value(samples, "mesolite_framework_dominant_share", **labels) == pytest.approx(0.5)
    assert value(samples, "mesolite_cluster_allocated_resources", resource="gpus") == 1


async def test_an_offer_counts_as_allocated_not_used(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:1024")
        fw = RecordingFramework("holder")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            snapshot = build_snapshot(cluster.master)

    [f], [a], [o] = snapshot.frameworks, snapshot.agents, snapshot.offers
    assert o.id == offer.offer_id and o.resources == Resources(cpus=2, mem=1024)
    assert f.used == EMPTY and f.used_dominant_share == 0
    assert f.offered == f.allocated == o.resources and f.dominant_share == 1
    assert a.offered == a.allocated == o.resources and a.used == EMPTY
    assert snapshot.cluster.allocated == o.resources and snapshot.cluster.free == EMPTY


async def test_health_follows_the_heartbeat_timeout(tmp_path: Path) -> None:
    config = fast(agent_timeout=60.0)  # the stopped agent stays listed, disconnected
    async with LocalCluster(tmp_path, config) as cluster:
        await cluster.add_agent("cpus:1;mem:256", name="steady")
        stopped = await cluster.add_agent("cpus:1;mem:256", name="stopped")
        await stopped.stop()

        def health() -> dict[str, AgentHealth]:
            return {a.hostname: a.health for a in build_snapshot(cluster.master).agents}

        await wait_for_condition(
            lambda: health()["stopped"] is AgentHealth.DISCONNECTED, what="a disconnected agent"
        )
        assert health()["steady"] is AgentHealth.HEALTHY
        # The master's clock (monotonic) past the timeout: heartbeats are overdue.
        late = build_snapshot(cluster.master, now=time.monotonic() + config.agent_timeout + 1)
        by_name = {a.hostname: a for a in late.agents}
        assert by_name["steady"].health is AgentHealth.UNHEALTHY
        assert not by_name["steady"].healthy and by_name["steady"].connected
        assert by_name["steady"].seconds_since_heartbeat > config.agent_timeout
        assert by_name["stopped"].health is AgentHealth.DISCONNECTED

        samples = await scrape(cluster.server.http_address)
        assert value(samples, "mesolite_agents", health="healthy") == 1
        assert value(samples, "mesolite_agents", health="disconnected") == 1
        [steady] = [a for a in late.agents if a.hostname == "steady"]
        assert agent_snapshot(cluster.master, steady.id) is not None
        assert agent_snapshot(cluster.master, "no-such-agent") is None


async def test_ended_tasks_newest_first(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:1024")
        fw = RecordingFramework("runner")
        async with running(fw, cluster.address):
            for name, command in (("first", "true"), ("second", "exit 3")):
                offer = await fw.next_offer()  # the first still outstanding
                task = TaskSpec(name, command, Resources(cpus=1, mem=64))
                await fw.launch(offer, [task], refuse_seconds=0)
                end = TaskState.FINISHED if command == "true" else TaskState.FAILED
                await fw.wait_state(name, end)
            snapshot = build_snapshot(cluster.master)

    assert [(t.id, t.state, t.exit_code) for t in snapshot.completed_tasks] == [
        ("second", TaskState.FAILED, 3),
        ("first", TaskState.FINISHED, 0),
    ]
    [f] = snapshot.frameworks
    assert f.completed_tasks == 2 and f.running_tasks == 0
