"""What tasks use and why they ended, from the agent's word to the operator's views, on
the master's core driven directly: heartbeats carry usage (each agent speaks only for
its own tasks), status updates carry a reason, and the read model, GET /state's JSON
and /metrics show both."""

from __future__ import annotations

import functools

import pytest

from mesolite import convert
from mesolite.master import messages as msg
from mesolite.master.errors import RegistrationRefused
from mesolite.master.metrics import MasterMetrics
from mesolite.master.read_model import build_snapshot
from mesolite.model import TaskState, TaskStatus, TaskUsage
from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import ClusterSnapshot
from mesolite.v1 import agent_pb2, common_pb2
from tests.support.core import CoreHarness
from tests.support.fakes import RecordingPeer

MEMORY = "REASON_CONTAINER_LIMITATION_MEMORY"


def usage(fw: str, task: str, cpus: float, mem: float) -> TaskUsage:
    return TaskUsage(
        fw, task, cpus, cpu_seconds=12.5, mem_used_mb=mem, mem_peak_mb=mem * 2, processes=3
    )


def two_tasks(core: CoreHarness) -> tuple[str, str, str]:
    """A framework with one task on each of two agents; (framework, agent 1, agent 2) ids."""
    a1 = core.add_agent("cpus:2;mem:1024", hostname="a1")
    fw = core.subscribe()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:256")
    a2 = core.add_agent("cpus:2;mem:1024", hostname="a2")
    [offer2] = [o for o in core.allocate_for(fw) if o.agent_id == a2.agent_id]
    core.launch(fw, offer2, "t2", "cpus:0.5;mem:128")
    for agent, task in ((a1, "t1"), (a2, "t2")):
        core.update(agent, fw, task, TaskState.RUNNING)
    return fw.framework_id, a1.agent_id, a2.agent_id


def test_usage_is_shown_per_task_per_agent_and_for_the_cluster(core: CoreHarness) -> None:
    fw, a1, a2 = two_tasks(core)
    core.master.agent_heartbeat(a1, [usage(fw, "t1", 0.75, 100.0)])
    state = build_snapshot(core.master)

    t1 = next(t for t in state.tasks if t.id == "t1")
    t2 = next(t for t in state.tasks if t.id == "t2")
    assert t1.usage is not None and t2.usage is None  # a2 measures nothing
    assert (t1.usage.cpus_used, t1.usage.mem_used_mb, t1.usage.mem_peak_mb) == (0.75, 100, 200)
    agent1 = state.agent(a1)
    agent2 = state.agent(a2)
    assert agent1 is not None and agent2 is not None
    assert agent1.usage == Resources(cpus=0.75, mem=100) and agent2.usage == EMPTY
    assert agent1.used == Resources(cpus=1, mem=256)  # held, beside used
    assert state.cluster.usage == Resources(cpus=0.75, mem=100)
    assert ClusterSnapshot.from_json(state.to_json()) == state


def test_an_agent_says_how_it_contains_tasks_when_it_registers(core: CoreHarness) -> None:
    peer: RecordingPeer[msg.AgentMessage] = RecordingPeer()
    register = functools.partial(
        core.master.register_agent, "", "h", "127.0.0.1:1", Resources(cpus=1), {}, (), peer
    )
    agent_id = register(isolation="cgroups-v1", task_user="nobody")
    agent = build_snapshot(core.master).agent(agent_id)
    assert agent is not None and (agent.isolation, agent.task_user) == ("cgroups-v1", "nobody")
    with pytest.raises(RegistrationRefused, match="isolation"):
        register(isolation="x" * 1000)


def test_an_agent_speaks_only_for_its_own_tasks(core: CoreHarness) -> None:
    fw, a1, a2 = two_tasks(core)
    # a2 claims figures for a1's task: ignored, as is a task nobody runs.
    core.master.agent_heartbeat(a2, [usage(fw, "t1", 1.9, 999.0), usage(fw, "ghost", 1, 1)])
    state = build_snapshot(core.master)
    assert all(t.usage is None for t in state.tasks)
    # Measured once, then no longer reported: the figures go.
    core.master.agent_heartbeat(a1, [usage(fw, "t1", 0.5, 10.0)])
    core.master.agent_heartbeat(a1, [])
    assert all(t.usage is None for t in build_snapshot(core.master).tasks)


def test_the_reason_reaches_the_framework_and_the_ended_tasks(core: CoreHarness) -> None:
    agent = core.add_agent()
    fw = core.subscribe()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "hog", "cpus:1;mem:64")
    status = TaskStatus(
        "hog",
        fw.framework_id,
        agent.agent_id,
        TaskState.FAILED,
        message="memory limit of 64 MB reached",
        exit_code=137,
        update_id="u-end",
        reason=MEMORY,
    )
    core.master.status_update(agent.agent_id, status)
    [update] = [u for u in core.updates(fw) if u.state is TaskState.FAILED]
    assert update.reason == MEMORY
    [ended] = build_snapshot(core.master).completed_tasks
    assert (ended.reason, ended.exit_code) == (MEMORY, 137)


def test_reasons_and_usage_cross_the_wire() -> None:
    status = TaskStatus("t", "f", "a", TaskState.FAILED, reason=MEMORY)
    msg = convert.status_to_proto(status)
    assert msg.reason == common_pb2.TaskStatus.REASON_CONTAINER_LIMITATION_MEMORY
    assert convert.status_from_proto(msg) == status
    # One this version does not know is left unspecified, not refused.
    unknown = convert.status_to_proto(TaskStatus("t", "f", "a", TaskState.FAILED, reason="NEW"))
    assert unknown.reason == 0 and convert.status_from_proto(unknown).reason == ""

    u = usage("f", "t", 0.25, 32.0)
    assert convert.usage_from_proto(convert.usage_to_proto(u)) == u
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="invalid usage"):
            convert.usage_from_proto(agent_pb2.TaskUsage(task_id="t", cpus_used=bad))


def test_metrics_show_usage_and_how_agents_contain_tasks(core: CoreHarness) -> None:
    fw, a1, a2 = two_tasks(core)
    core.master.agents[a1].isolation = "cgroups-v1"  # as registered
    core.master.agents[a2].isolation = "an agent's free text"
    core.master.agent_heartbeat(a1, [usage(fw, "t1", 0.5, 64.0)])
    text = MasterMetrics().exposition(build_snapshot(core.master)).decode()

    assert f'mesolite_task_usage{{framework_id="{fw}",resource="cpus",task_id="t1"}} 0.5' in text
    assert f'mesolite_task_usage{{framework_id="{fw}",resource="mem",task_id="t1"}} 64.0' in text
    assert "t2" not in text.split("# HELP mesolite_task_usage")[1].split("# HELP")[0]
    assert f'mesolite_agent_usage{{agent_id="{a1}",resource="mem"}} 64.0' in text
    assert f'mesolite_agent_used{{agent_id="{a1}",resource="cpus"}} 1.0' in text
    assert 'mesolite_agents_by_isolation{isolation="cgroups-v1"} 1.0' in text
    assert 'mesolite_agents_by_isolation{isolation="other"} 1.0' in text  # never free text
    assert 'mesolite_cluster_usage{resource="cpus"} 0.5' in text
