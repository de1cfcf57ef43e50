"""The read model (master/read_model.py): the figures it derives, on the master's core
driven directly (virtual time, no network), and on a real cluster GET /state and
GET /metrics showing the same ones as the in-process snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.master.read_model import COMPLETED_TASKS_SHOWN, agent_snapshot, build_snapshot
from mesolite.model import TaskStatus
from mesolite.resources import EMPTY
from mesolite.snapshot import AgentHealth, ClusterSnapshot
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.scraping import scrape, value
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer
from tests.waiting import wait_for_condition


def end(core: CoreHarness, agent: AgentPeer, fw: FrameworkPeer, task_id: str, at: float) -> None:
    """The task finishes, stamped `at` on the wall clock."""
    status = TaskStatus(
        task_id,
        fw.framework_id,
        agent.agent_id,
        TaskState.FINISHED,
        timestamp=at,
        update_id=task_id,
    )
    core.master.status_update(agent.agent_id, status)


@pytest.mark.unit
def test_dominant_share_counts_every_resource() -> None:
    core = CoreHarness()
    core.add_agent("cpus:4;mem:4096;gpus:2")
    fw = core.subscribe("trainer")
    [offer] = core.allocate_for(fw)
    # A quarter of the CPUs, 1/16 of the memory, half the GPUs: the GPUs dominate.
    core.launch(fw, offer, "gpu-1", "cpus:1;mem:256;gpus:1")
    state = build_snapshot(core.master)

    [f] = state.frameworks
    assert f.used == f.allocated == Resources(cpus=1, mem=256, gpus=1) and f.offered == EMPTY
    assert f.dominant_share == f.used_dominant_share == pytest.approx(0.5)
    assert f.weighted_dominant_share == pytest.approx(0.5)  # weight 1, DRF
    [role] = [r for r in state.roles if r.path == "*"]
    assert role.dominant_share == role.share == pytest.approx(0.5) and role.frameworks == 1
    [a] = state.agents
    assert a.used == a.allocated == f.used and a.free == Resources(cpus=3, mem=3840, gpus=1)
    core.assert_sound()


@pytest.mark.unit
def test_an_offer_counts_as_allocated_not_used() -> None:
    core = CoreHarness()
    core.add_agent("cpus:2;mem:1024")
    fw = core.subscribe("holder")
    [offer] = core.allocate_for(fw)
    state = build_snapshot(core.master)

    [f], [a], [o] = state.frameworks, state.agents, state.offers
    assert (o.id, o.framework_id, o.resources) == (offer.offer_id, fw.framework_id, offer.resources)
    assert f.used == EMPTY and f.used_dominant_share == 0
    assert f.offered == f.allocated == o.resources and f.dominant_share == 1
    assert a.offered == a.allocated == o.resources and a.used == EMPTY
    assert state.cluster.allocated == o.resources and state.cluster.free == EMPTY
    assert state.cluster.outstanding_offers == 1


@pytest.mark.unit
def test_health_follows_the_heartbeat_timeout() -> None:
    core = CoreHarness()
    steady, gone = core.add_agent(hostname="steady"), core.add_agent(hostname="gone")
    core.master.disconnect_agent(gone.agent_id, gone.peer)

    def health() -> dict[str, AgentHealth]:
        return {a.hostname: a.health for a in build_snapshot(core.master).agents}

    assert health() == {"steady": AgentHealth.HEALTHY, "gone": AgentHealth.DISCONNECTED}
    core.advance(CONFIG.agent_timeout)  # late, but not yet past the timeout
    assert health()["steady"] is AgentHealth.HEALTHY
    core.advance(0.5)
    [late] = [a for a in build_snapshot(core.master).agents if a.hostname == "steady"]
    assert late.health is AgentHealth.UNHEALTHY and late.connected and not late.healthy
    assert late.seconds_since_heartbeat == CONFIG.agent_timeout + 0.5
    core.heartbeat(steady)
    assert health()["steady"] is AgentHealth.HEALTHY
    assert agent_snapshot(core.master, steady.agent_id) == build_snapshot(core.master).agent(
        steady.agent_id
    )
    assert agent_snapshot(core.master, "no-such-agent") is None


@pytest.mark.unit
def test_ended_tasks_newest_first_and_bounded() -> None:
    core = CoreHarness()
    agent = core.add_agent("cpus:100;mem:100000")
    first, second = core.subscribe("first"), core.subscribe("second")
    many = COMPLETED_TASKS_SHOWN + 10
    for fw, prefix in ((first, "a"), (second, "b")):
        [offer] = core.allocate_for(fw)
        specs = [TaskSpec(f"{prefix}{i}", "true", Resources(cpus=0.1)) for i in range(many)]
        core.master.accept(fw.framework_id, [offer.offer_id], specs, refuse_seconds=0)
    # Ended in turn, a0 b0 a1 b1 ...: the newest 50 interleave the two frameworks.
    for i in range(many):
        end(core, agent, first, f"a{i}", at=2 * i)
        end(core, agent, second, f"b{i}", at=2 * i + 1)
    state = build_snapshot(core.master)

    shown = [t.id for t in state.completed_tasks]
    expected = [f"{p}{i}" for i in reversed(range(many)) for p in ("b", "a")]
    assert shown == expected[:COMPLETED_TASKS_SHOWN]
    assert {t.state for t in state.completed_tasks} == {TaskState.FINISHED}
    assert [f.completed_tasks for f in state.frameworks] == [many, many]
    assert state.tasks == () and state.cluster.running_tasks == 0


@pytest.mark.unit
def test_roles_count_their_frameworks_and_the_json_reads_back() -> None:
    core = CoreHarness()
    core.add_agent()
    for name, role in (("a", "eng"), ("b", "eng"), ("c", "*")):
        core.subscribe(name, role=role)
    core.advance(65.0)
    state = build_snapshot(core.master)

    assert {r.path: r.frameworks for r in state.roles} == {"*": 1, "eng": 2}
    assert state.time - state.started_at == 65.0  # the master's wall clock
    again = ClusterSnapshot.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state


async def test_state_metrics_and_snapshot_agree(tmp_path: Path) -> None:
    """One read model: what GET /state and GET /metrics show is what the snapshot has."""
    config = fast(agent_timeout=60.0, weights={"eng": 2.0})  # weighted share: half of dominant
    async with LocalCluster(tmp_path, config) as cluster:
        await cluster.add_agent("cpus:4;mem:4096;gpus:2", name="gpu-box")
        stopped = await cluster.add_agent("cpus:1;mem:256", name="stopped")
        await stopped.stop()  # listed, disconnected, until the (long) agent timeout
        await wait_for_condition(
            lambda: cluster.server.snapshot().agents[-1].health is AgentHealth.DISCONNECTED,
            what="the stopped agent to be disconnected",
        )
        fw = RecordingFramework("trainer", role="eng")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            task = TaskSpec("gpu-1", "sleep 60", Resources(cpus=1, mem=256, gpus=1))
            await fw.launch(offer, [task], refuse_seconds=3600)
            await fw.wait_state("gpu-1", TaskState.RUNNING)
            snapshot = cluster.server.snapshot()
            document = await cluster.state()
            samples = await scrape(cluster.server.http_address)

    [f] = snapshot.frameworks
    assert f.dominant_share == pytest.approx(0.5)  # GPUs: 1 of 2
    assert f.weighted_dominant_share == pytest.approx(0.25)
    shown = ClusterSnapshot.from_json(document)
    assert shown.frameworks == snapshot.frameworks
    assert [a.health for a in shown.agents] == [AgentHealth.HEALTHY, AgentHealth.DISCONNECTED]
    assert shown.cluster == snapshot.cluster
    labels = {"framework_id": f.id, "role": "eng"}
    assert value(samples, "mesolite_framework_dominant_share", **labels) == f.dominant_share
    weighted = value(samples, "mesolite_framework_weighted_share", **labels)
    assert weighted == f.weighted_dominant_share
    assert value(samples, "mesolite_agents", health="healthy") == 1
    assert value(samples, "mesolite_agents", health="disconnected") == 1
    assert value(samples, "mesolite_cluster_allocated_resources", resource="gpus") == 1
