"""What keeps the master cheap per task and per agent, and what it must not cost.

The core driven directly (tests/support/core.py), in virtual time: the health check
reads only the silent agents; a task ended early is never forgotten while its updates
are on their way, however many tasks end meanwhile; per-task lines are counted for one
activity line; the heartbeat interval and the agent timeout are checked together.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mesolite.master import messages as msg
from mesolite.master.config import MasterConfig
from mesolite.model import TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer

pytestmark = pytest.mark.unit


class CountingDict(dict[str, object]):
    """The master's agents, counting the lookups by id."""

    reads = 0

    def __getitem__(self, key: str) -> object:
        CountingDict.reads += 1
        return super().__getitem__(key)

    def values(self) -> Any:  # a scan reads them all
        CountingDict.reads += len(self)
        return super().values()


def test_the_health_check_reads_only_the_silent_agents() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, check_invariants=False))  # they read all
    agents = []
    for i in range(50):
        agents.append(core.add_agent(hostname=f"h{i}"))
        core.advance(0.1)
    core.advance(CONFIG.agent_timeout - 1.55)  # agents 0-34 silent too long
    for agent in agents[:10]:  # heard from: they move behind the others
        core.heartbeat(agent)
    counting = CountingDict(core.master.agents)
    core.master.agents = counting  # type: ignore[assignment]
    CountingDict.reads = 0
    # The 25 oldest of the 40 silent ones are past the timeout: exactly they go.
    removed = core.master.check_agent_health()
    assert removed == [a.agent_id for a in agents[10:35]]
    assert CountingDict.reads < 26 + 25 * 5  # read them and the first that is not silent
    CountingDict.reads = 0
    assert core.master.check_agent_health() == []
    assert CountingDict.reads == 1
    assert core.master.verify("the test") == []


def ended_early(core: CoreHarness, fw: FrameworkPeer, agent: AgentPeer, task_id: str) -> None:
    """Launch `task_id` on `agent`, whose STARTING update (id "s") says it has ended."""
    offer = next(o for o in core.allocate_for(fw) if o.agent_id == agent.agent_id)
    core.launch(fw, offer, task_id, "cpus:1;mem:64")
    starting = TaskStatus(
        task_id, fw.framework_id, agent.agent_id, TaskState.STARTING, update_id="s"
    )
    core.master.status_update(agent.agent_id, starting, TaskState.FINISHED)


def test_a_task_ended_early_is_not_forgotten_while_its_updates_come() -> None:
    """An agent says a task ended (latest state) with its STARTING update; its RUNNING
    and FINISHED updates follow, one per acknowledgement. Meanwhile more tasks end than
    the master keeps: the first one's updates and acknowledgements must still pass."""
    core = CoreHarness(dataclasses.replace(CONFIG, max_completed_tasks_per_framework=2))
    fw = core.subscribe()
    agent = core.add_agent("cpus:8;mem:8192")
    ended_early(core, fw, agent, "first")
    assert [u.state for u in core.updates(fw)] == [TaskState.STARTING]
    for i in range(5):  # five other tasks come and go: the history holds two
        [offer] = core.allocate_for(fw)
        core.launch(fw, offer, f"other{i}", "cpus:1;mem:64")
        core.update(agent, fw, f"other{i}", TaskState.FINISHED)
    core.updates(fw)
    agent.peer.take(msg.AcknowledgeUpdate)
    core.master.acknowledge(fw.framework_id, agent.agent_id, "first", "s")
    assert [a.update_id for a in agent.peer.take(msg.AcknowledgeUpdate)] == ["s"]
    for state, update_id in ((TaskState.RUNNING, "r"), (TaskState.FINISHED, "f")):
        core.update(agent, fw, "first", state, update_id=update_id)
        assert [(u.task_id, u.state) for u in core.updates(fw)] == [("first", state)]
        core.master.acknowledge(fw.framework_id, agent.agent_id, "first", update_id)
        assert [a.update_id for a in agent.peer.take(msg.AcknowledgeUpdate)] == [update_id]
    # Its end delivered, it is back in the history, which is back to its bound.
    framework = core.master.frameworks[fw.framework_id]
    assert framework.ending == {} and len(framework.completed) == 2
    assert framework.completed[-1].spec.task_id == "first"
    assert set(framework.completed_on) == {t.spec.task_id for t in framework.completed}
    core.assert_sound()


def test_a_removed_agent_has_the_ends_it_owed_delivered_even_if_out_of_history() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, max_completed_tasks_per_framework=1))
    fw = core.subscribe()
    agent = core.add_agent("cpus:8;mem:8192")
    ended_early(core, fw, agent, "first")
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "second", "cpus:1;mem:64")
    core.update(agent, fw, "second", TaskState.FINISHED)
    core.updates(fw)
    core.master.remove_agent(agent.agent_id, "test")
    ends = [(u.task_id, u.state) for u in core.updates(fw)]
    assert ("first", TaskState.FINISHED) in ends
    assert core.master.frameworks[fw.framework_id].ending == {}
    core.assert_sound()


def test_an_ended_tasks_updates_are_taken_only_from_its_agents() -> None:
    """A task ended early still takes updates (its end is on its way): only from the
    agent it ran on, found in the history's index of placements."""
    core = CoreHarness()
    fw = core.subscribe()
    here = core.add_agent("cpus:1;mem:1024", hostname="here")
    there = core.add_agent("cpus:1;mem:1024", hostname="there")
    ended_early(core, fw, here, "t")
    core.updates(fw)
    core.update(there, fw, "t", TaskState.FAILED, update_id="forged")
    assert core.updates(fw) == []  # refused: the task never ran there
    core.update(here, fw, "t", TaskState.FINISHED, update_id="end")
    assert [u.update_id for u in core.updates(fw)] == ["end"]


def test_per_task_events_are_counted_for_one_activity_line() -> None:
    core = CoreHarness()
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.master.accept(
        fw.framework_id,
        [offer.offer_id],
        [core_spec(f"t{i}") for i in range(3)],
        refuse_seconds=None,
    )
    for i in range(3):
        core.update(agent, fw, f"t{i}", TaskState.RUNNING)
    core.update(agent, fw, "t0", TaskState.FAILED)
    assert core.master.activity.take() == {
        "offers": 1,
        "offers_accepted": 1,
        "tasks_launched": 3,
        "updates_task_failed": 1,
        "updates_task_running": 3,
    }
    assert core.master.activity.take() == {}


def core_spec(task_id: str) -> TaskSpec:
    return TaskSpec(task_id, "true", Resources.parse("cpus:0.1;mem:32"))


@pytest.mark.parametrize(("interval", "timeout"), [(15.0, 15.0), (20.0, 10.0), (0.0, 10.0)])
def test_agents_must_be_able_to_heartbeat_within_the_timeout(
    interval: float, timeout: float
) -> None:
    with pytest.raises(ValueError, match="must be longer than the agent heartbeat interval"):
        MasterConfig(agent_heartbeat_interval=interval, agent_timeout=timeout)


def test_the_defaults_are_mesos_pings() -> None:
    config = MasterConfig()
    assert (config.agent_heartbeat_interval, config.agent_timeout) == (15.0, 75.0)
