"""The master's core driven directly (tests/support/core.py): no network, virtual time.

The same scenarios the gRPC cluster tests cover, and the races around them,
each in milliseconds. Every test here is synchronous: the core is built and
driven with no event loop at all. Every step runs the invariant checker.
"""

from __future__ import annotations

import dataclasses

import pytest

from mesolite.master import messages as msg
from mesolite.master.errors import CallRejected, Refusal, RegistrationRefused
from mesolite.model import RunningTask, StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer

pytestmark = pytest.mark.unit


# Subscribing, offers, launching ----------------------------------------------


def test_a_subscriber_is_offered_a_whole_agent(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent("cpus:4;mem:4096")
    [offer] = core.allocate_for(fw)
    assert (offer.agent_id, offer.resources) == (agent.agent_id, agent.total)


def test_launch_reaches_the_agent_and_updates_reach_the_framework(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    spec = core.launch(fw, offer, "t1", "cpus:1;mem:128")
    [launch] = agent.peer.take(msg.LaunchTask)
    assert launch.task.task_id == "t1" and launch.task.agent_id == agent.agent_id
    assert [t.task.task_id for t in core.registry.tasks()] == ["t1"]

    core.update(agent, fw, "t1", TaskState.RUNNING)
    core.update(agent, fw, "t1", TaskState.FINISHED, exit_code=0)
    assert [s.state for s in core.updates(fw)] == [TaskState.RUNNING, TaskState.FINISHED]
    assert core.master.allocator.agent_allocated(agent.agent_id).is_empty()
    assert core.registry.tasks() == []
    # The freed resources are offered again.
    [again] = core.allocate_for(fw)
    assert again.resources == agent.total
    assert spec.resources == Resources.parse("cpus:1;mem:128")


def test_the_unused_part_of_an_accepted_offer_is_offered_again(core: CoreHarness) -> None:
    fw = core.subscribe()
    core.add_agent("cpus:4;mem:4096")
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:1024")
    [rest] = core.allocate_for(fw)
    assert rest.resources == Resources.parse("cpus:3;mem:3072")


@pytest.mark.parametrize(
    ("tasks", "problem"),
    [
        ([TaskSpec("t1", "true", Resources(cpus=5))], "hold only"),
        ([TaskSpec("bad/id", "true", Resources(cpus=1))], "invalid task id"),
        ([TaskSpec("t1", "true", Resources(cpus=1))] * 2, "appears twice"),
        ([TaskSpec("t1", "  ", Resources(cpus=1))], "no command"),
        ([TaskSpec("t1", "true", Resources())], "no resources"),
        ([TaskSpec("t1", "true", Resources(cpus=1), agent_id="other")], "names agent"),
    ],
)
def test_a_bad_accept_changes_nothing(
    core: CoreHarness, tasks: list[TaskSpec], problem: str
) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    before = core.state()
    with pytest.raises(CallRejected, match=problem):
        core.master.accept(fw.framework_id, [offer.offer_id], tasks, refuse_seconds=0)
    assert core.state() == before
    assert agent.peer.of(msg.LaunchTask) == []
    # The offer is still good.
    core.launch(fw, offer, "ok", "cpus:1;mem:64")


def test_a_task_id_in_use_cannot_be_launched_again(core: CoreHarness) -> None:
    fw = core.subscribe()
    core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    [offer] = core.allocate_for(fw)
    with pytest.raises(CallRejected, match="already in use"):
        core.launch(fw, offer, "t1", "cpus:1;mem:64")


def test_offers_are_the_frameworks_own(core: CoreHarness) -> None:
    one, two = core.subscribe("one"), core.subscribe("two")
    core.add_agent()
    core.master.allocate()
    [offer] = [o for fw in (one, two) for batch in fw.peer.take(msg.Offers) for o in batch.offers]
    other = two if offer.framework_id == one.framework_id else one
    with pytest.raises(CallRejected, match="not outstanding for this framework"):
        core.master.decline(other.framework_id, [offer.offer_id], None)
    with pytest.raises(CallRejected, match="refuse_seconds"):
        core.master.decline(offer.framework_id, [offer.offer_id], float("nan"))
    assert offer.offer_id in core.master.offers


def test_a_declined_agent_is_not_offered_until_the_filter_expires(core: CoreHarness) -> None:
    fw = core.subscribe()
    core.add_agent()
    [offer] = core.allocate_for(fw)
    core.master.decline(fw.framework_id, [offer.offer_id], refuse_seconds=10)
    core.advance(9.9)
    assert core.allocate_for(fw) == []
    core.advance(0.2)
    assert len(core.allocate_for(fw)) == 1


def test_an_unanswered_offer_is_rescinded_at_the_offer_timeout(core: CoreHarness) -> None:
    fw = core.subscribe()
    core.add_agent()
    [offer] = core.allocate_for(fw)
    core.advance(CONFIG.offer_timeout - 0.1)
    assert fw.peer.of(msg.Rescind) == []
    core.advance(0.2)
    assert [r.offer_id for r in fw.peer.take(msg.Rescind)] == [offer.offer_id]
    assert core.master.offers == {}


def test_suppress_stops_offers_and_revive_brings_them_back(core: CoreHarness) -> None:
    fw = core.subscribe()
    core.master.suppress(fw.framework_id)
    core.add_agent()
    assert core.allocate_for(fw) == []
    core.master.revive(fw.framework_id)
    assert len(core.allocate_for(fw)) == 1


def test_drf_gives_the_next_offer_to_the_lowest_dominant_share(core: CoreHarness) -> None:
    """The paper's example, task by task: A <1 CPU, 4 GB>, B <3 CPUs, 1 GB> on <9, 18 GB>."""
    a, b = core.subscribe("A"), core.subscribe("B")
    core.add_agent("cpus:9;mem:18432")
    shapes = {a.framework_id: "cpus:1;mem:4096", b.framework_id: "cpus:3;mem:1024"}
    launched = {a.framework_id: 0, b.framework_id: 0}
    for _ in range(20):
        core.master.allocate()
        offers = [o for fw in (a, b) for batch in fw.peer.take(msg.Offers) for o in batch.offers]
        if not offers:
            break
        [offer] = offers
        need = Resources.parse(shapes[offer.framework_id])
        if offer.resources.contains(need):
            n = launched[offer.framework_id]
            task = TaskSpec(f"{offer.framework_id}-{n}", "true", need)
            core.master.accept(offer.framework_id, [offer.offer_id], [task], refuse_seconds=0)
            launched[offer.framework_id] += 1
        else:
            core.master.decline(offer.framework_id, [offer.offer_id], refuse_seconds=1e6)
    assert launched == {a.framework_id: 3, b.framework_id: 2}


# Framework failover ------------------------------------------------------------


def test_failover_within_the_timeout_keeps_the_tasks(core: CoreHarness) -> None:
    fw = core.subscribe(failover=10)
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:64")
    core.master.disconnect_framework(fw.framework_id, fw.peer)
    core.advance(9)
    again = core.resubscribe(fw)
    core.advance(5)
    assert list(core.master.frameworks[again.framework_id].tasks) == ["t1"]
    assert agent.peer.of(msg.KillTask) == []


def test_past_the_failover_timeout_tasks_are_killed_then_the_framework_forgotten(
    core: CoreHarness,
) -> None:
    fw = core.subscribe(failover=10)
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:64")
    core.master.disconnect_framework(fw.framework_id, fw.peer)
    core.advance(10.1)
    assert [k.task_id for k in agent.peer.take(msg.KillTask)] == ["t1"]
    # Until the task has ended, its resources stay allocated.
    assert core.master.frameworks[fw.framework_id].removing
    assert not core.master.allocator.agent_allocated(agent.agent_id).is_empty()
    core.update(agent, fw, "t1", TaskState.KILLED, update_id="k1")
    assert fw.framework_id not in core.master.frameworks
    assert [a.update_id for a in agent.peer.take(msg.AcknowledgeUpdate)][-1] == "k1"
    with pytest.raises(RegistrationRefused) as refused:
        core.resubscribe(fw)
    assert refused.value.refusal is Refusal.NOT_FOUND


def test_a_second_subscriber_with_the_same_id_replaces_the_first(core: CoreHarness) -> None:
    fw = core.subscribe(failover=10)
    core.add_agent()
    core.allocate_for(fw)
    again = core.resubscribe(fw)
    assert fw.peer.closed and "another scheduler" in fw.peer.close_reason
    assert core.master.frameworks[fw.framework_id].outbox is again.peer
    assert len(core.allocate_for(again)) == 1  # the first one's offer was rescinded


def test_changing_role_on_failover_is_refused(core: CoreHarness) -> None:
    fw = core.subscribe(role="eng", failover=10)
    with pytest.raises(RegistrationRefused, match="changing it"):
        core.subscribe("fw", "ops", 10, fw.framework_id)


@pytest.mark.parametrize(
    ("name", "role", "failover", "problem"),
    [
        ("", "*", 0.0, "name must not be empty"),
        ("fw", "bad role!", 0.0, "invalid role"),
        ("fw", "*", float("inf"), "failover timeout"),
        ("fw", "*", -1.0, "failover timeout"),
    ],
)
def test_an_invalid_subscription_is_refused(
    core: CoreHarness, name: str, role: str, failover: float, problem: str
) -> None:
    with pytest.raises(RegistrationRefused, match=problem) as refused:
        core.subscribe(name, role, failover)
    assert refused.value.refusal is Refusal.INVALID
    assert core.master.frameworks == {} and core.registry.frameworks() == []


# Agents --------------------------------------------------------------------------


def test_a_silent_agent_is_removed_and_its_tasks_lost(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:64")
    core.advance(CONFIG.agent_timeout - 1)
    assert core.master.check_agent_health() == []
    core.advance(2)
    assert core.master.check_agent_health() == [agent.agent_id]
    [lost] = core.updates(fw)
    assert (lost.task_id, lost.state, lost.source) == ("t1", TaskState.LOST, StatusSource.MASTER)
    assert [f.agent_id for f in fw.peer.take(msg.AgentFailure)] == [agent.agent_id]
    assert core.master.allocator.total.is_empty()
    with pytest.raises(RegistrationRefused) as refused:
        core.add_agent(agent_id=agent.agent_id)
    assert refused.value.refusal is Refusal.PRECONDITION


def test_heartbeats_keep_an_agent(core: CoreHarness) -> None:
    agent = core.add_agent()
    for _ in range(5):
        core.advance(CONFIG.agent_timeout / 2)
        core.heartbeat(agent)
        assert core.master.check_agent_health() == []


def test_an_agent_that_reconnects_reports_what_it_runs(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    kept = core.launch(fw, offer, "kept", "cpus:1;mem:64")
    core.launch(fw, core.allocate_for(fw)[0], "gone", "cpus:1;mem:64")
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    again = core.add_agent(agent_id=agent.agent_id, running=(core.running(fw, kept),))
    [lost] = core.updates(fw)
    assert (lost.task_id, lost.state) == ("gone", TaskState.LOST)
    assert again.agent_id == agent.agent_id
    assert list(core.master.agents[agent.agent_id].tasks) == [(fw.framework_id, "kept")]


@pytest.mark.parametrize(
    ("agent_id", "resources", "running", "refusal", "problem"),
    [
        ("", "cpus:0", (), Refusal.INVALID, "no resources"),
        ("bad id!", "cpus:1", (), Refusal.INVALID, "invalid agent id"),
        ("never-seen", "cpus:1", (), Refusal.PRECONDITION, "not known"),
    ],
)
def test_an_invalid_registration_is_refused(
    core: CoreHarness,
    agent_id: str,
    resources: str,
    running: tuple[RunningTask, ...],
    refusal: Refusal,
    problem: str,
) -> None:
    with pytest.raises(RegistrationRefused, match=problem) as refused:
        core.add_agent(resources, agent_id, running)
    assert refused.value.refusal is refusal
    assert core.master.agents == {}


def test_a_new_agent_cannot_bring_tasks(core: CoreHarness) -> None:
    task = RunningTask("F", TaskSpec("t", "true", Resources(cpus=1)), TaskState.RUNNING)
    with pytest.raises(RegistrationRefused, match="new agent cannot have tasks"):
        core.add_agent("cpus:1", running=(task,))
    with pytest.raises(RegistrationRefused, match="more than the agent"):
        core.add_agent("cpus:0.5", agent_id="S1", running=(task,))


# Status updates --------------------------------------------------------------------


def test_a_retried_update_is_applied_once_and_forwarded_again(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="same")
    core.launch(fw, core.allocate_for(fw)[0], "t2", "cpus:1;mem:64")
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="same")
    assert [s.update_id for s in core.updates(fw)] == ["same", "same"]
    # The retry did not free t1's resources a second time.
    used = core.master.allocator.agent_allocated(agent.agent_id)
    offered = sum((o.offer.resources for o in core.master.offers.values()), Resources())
    assert used - offered == Resources.parse("cpus:1;mem:64")


def test_an_old_update_retried_does_not_move_a_task_back(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.update(agent, fw, "t1", TaskState.STARTING, update_id="u1")
    core.update(agent, fw, "t1", TaskState.RUNNING, update_id="u2")
    core.update(agent, fw, "t1", TaskState.STARTING, update_id="u1")  # a retry
    assert core.master.frameworks[fw.framework_id].tasks["t1"].state is TaskState.RUNNING
    assert [s.update_id for s in core.updates(fw)] == ["u1", "u2", "u1"]  # forwarded anyway


def test_a_retried_update_from_before_the_end_is_not_shown_after_it(core: CoreHarness) -> None:
    """RUNNING is applied but not yet acknowledged when the master ends the task
    itself (LOST); the agent's retry of RUNNING must not reach the framework after
    the LOST (found by the fault injection: RUNNING after LOST)."""
    fw = core.subscribe()
    agent = core.add_agent()
    spec = core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    running = core.update(agent, fw, "t1", TaskState.RUNNING, update_id="r1")
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    back = core.add_agent(agent_id=agent.agent_id)  # no longer reports t1: LOST
    core.master.status_update(back.agent_id, running)  # the agent retries RUNNING
    assert [(s.state, s.update_id) for s in core.updates(fw)][-1][0] is TaskState.LOST
    assert [a.update_id for a in back.peer.take(msg.AcknowledgeUpdate)] == ["r1"]
    assert spec.task_id not in core.master.frameworks[fw.framework_id].tasks


def test_an_update_for_an_unknown_task_is_acknowledged_by_the_master(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.update(agent, fw, "ghost", TaskState.FINISHED, update_id="g1")
    assert [a.update_id for a in agent.peer.take(msg.AcknowledgeUpdate)] == ["g1"]
    assert core.updates(fw) == []


def test_kill_goes_to_the_tasks_agent(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.master.kill(fw.framework_id, "t1")
    assert [k.task_id for k in agent.peer.take(msg.KillTask)] == ["t1"]
    with pytest.raises(CallRejected, match="not a running task"):
        core.master.kill(fw.framework_id, "nope")


def test_reconciliation_answers_known_tasks_and_unknown_ones_as_lost(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.update(agent, fw, "t1", TaskState.RUNNING)
    core.updates(fw)
    core.master.reconcile(fw.framework_id, ["t1", "never"])
    answers = {s.task_id: s.state for s in core.updates(fw)}
    assert answers == {"t1": TaskState.RUNNING, "never": TaskState.LOST}
    core.master.reconcile(fw.framework_id, [])
    assert [(s.task_id, s.state) for s in core.updates(fw)] == [("t1", TaskState.RUNNING)]


def test_teardown_kills_the_tasks_and_frees_only_when_they_end(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.master.teardown(fw.framework_id)
    assert fw.peer.closed
    assert [k.task_id for k in agent.peer.take(msg.KillTask)] == ["t1"]
    assert core.registry.frameworks()[0].removing
    core.update(agent, fw, "t1", TaskState.KILLED)
    assert core.master.frameworks == {} and core.registry.frameworks() == []
    assert core.master.allocator.agent_allocated(agent.agent_id).is_empty()


def test_teardown_while_the_agent_is_away_kills_when_it_returns(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    spec = core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    core.master.teardown(fw.framework_id)
    assert agent.peer.of(msg.KillTask) == []  # nowhere to send it
    back = core.add_agent(agent_id=agent.agent_id, running=(core.running(fw, spec),))
    assert [k.task_id for k in back.peer.take(msg.KillTask)] == ["t1"]
    core.update(back, fw, "t1", TaskState.KILLED)
    assert core.master.frameworks == {}


# Master restarts (master/recovery.py) ---------------------------------------------


def launched_and_running(
    core: CoreHarness, failover: float = 0.0
) -> tuple[FrameworkPeer, AgentPeer, TaskSpec]:
    fw = core.subscribe(failover=failover)
    agent = core.add_agent()
    spec = core.launch(fw, core.allocate_for(fw)[0], "t1", "cpus:1;mem:64")
    core.update(agent, fw, "t1", TaskState.RUNNING)
    return fw, agent, spec


def test_after_a_restart_a_failover_0_framework_has_the_window_to_come_back(
    core: CoreHarness,
) -> None:
    fw, agent, spec = launched_and_running(core, failover=0)
    new = core.restart()
    window = CONFIG.agent_reregister_timeout
    new.advance(window - 1)
    assert fw.framework_id in new.master.frameworks
    back = new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    again = new.resubscribe(fw)
    new.advance(window * 2)
    assert list(new.master.frameworks[again.framework_id].tasks) == ["t1"]
    assert back.peer.of(msg.KillTask) == []
    new.assert_sound()


def test_after_a_restart_the_grace_is_the_window_plus_the_failover_timeout(
    core: CoreHarness,
) -> None:
    fw, agent, spec = launched_and_running(core, failover=30)
    new = core.restart()
    back = new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    new.advance(CONFIG.agent_reregister_timeout + 30 - 0.5)
    assert back.peer.of(msg.KillTask) == []
    new.advance(1)
    assert [k.task_id for k in back.peer.take(msg.KillTask)] == ["t1"]
    new.update(back, fw, "t1", TaskState.KILLED)
    assert new.master.frameworks == {}
    new.assert_sound()


def test_registered_comes_before_the_kills_for_a_gone_framework(core: CoreHarness) -> None:
    fw, agent, spec = launched_and_running(core)
    core.master.teardown(fw.framework_id)  # the kill is sent, but the master dies first
    new = core.restart()
    assert new.master.frameworks[fw.framework_id].removing
    # add_agent asserts that Registered is the first message.
    back = new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    assert [k.task_id for k in back.peer.take(msg.KillTask)] == ["t1"]
    assert not new.master.allocator.agent_allocated(agent.agent_id).is_empty()
    new.update(back, fw, "t1", TaskState.KILLED)
    assert new.master.frameworks == {} and new.registry.frameworks() == []
    assert new.master.allocator.agent_allocated(agent.agent_id).is_empty()
    new.assert_sound()


def test_tasks_of_a_framework_no_registry_knows_are_adopted_and_killed(core: CoreHarness) -> None:
    agent = core.add_agent()
    new = core.restart()
    task = TaskSpec("x", "sleep 9", Resources(cpus=1))
    stranger = RunningTask("F-unknown", task, TaskState.RUNNING)
    back = new.add_agent(agent_id=agent.agent_id, running=(stranger,))
    assert [k.task_id for k in back.peer.take(msg.KillTask)] == ["x"]
    assert new.master.frameworks["F-unknown"].removing
    # Its resources are not offered while the process still runs.
    fw = new.subscribe()
    [offer] = new.allocate_for(fw)
    assert offer.resources == Resources.parse("cpus:3;mem:4096")
    end = TaskStatus("x", "F-unknown", agent.agent_id, TaskState.KILLED, update_id="x-end")
    new.master.status_update(agent.agent_id, end)
    assert "F-unknown" not in new.master.frameworks
    assert [a.update_id for a in back.peer.take(msg.AcknowledgeUpdate)] == ["x-end"]
    new.assert_sound()


def test_a_framework_gone_during_the_downtime_loses_its_tasks_after_the_grace(
    core: CoreHarness,
) -> None:
    fw, agent, spec = launched_and_running(core, failover=0)
    new = core.restart()
    back = new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    new.advance(CONFIG.agent_reregister_timeout + 0.1)
    assert [k.task_id for k in back.peer.take(msg.KillTask)] == ["t1"]
    new.update(back, fw, "t1", TaskState.KILLED)
    assert new.master.frameworks == {}
    newcomer = new.subscribe("newcomer")
    [offer] = new.allocate_for(newcomer)
    assert offer.resources == back.total
    new.assert_sound()


def test_an_agent_back_after_its_framework_was_removed_in_the_grace(core: CoreHarness) -> None:
    """The framework's grace ends while its agent is still away (a long window
    for agents is not possible: the grace is never shorter). Here the agent was
    removed by the window; when it returns it is refused and kills its tasks."""
    fw, agent, spec = launched_and_running(core, failover=0)
    new = core.restart()
    new.advance(CONFIG.agent_reregister_timeout + 1)
    assert new.master.frameworks == {}
    assert agent.agent_id in new.master.removed_agents
    with pytest.raises(RegistrationRefused) as refused:
        new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    assert refused.value.refusal is Refusal.PRECONDITION
    new.assert_sound()


def test_the_framework_back_before_its_agent(core: CoreHarness) -> None:
    fw, agent, spec = launched_and_running(core, failover=0)
    new = core.restart()
    again = new.resubscribe(fw)
    new.master.reconcile(again.framework_id, ["t1"])
    assert new.updates(again) == []  # its agent has not re-registered yet: no answer
    back = new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, spec),))
    new.master.reconcile(again.framework_id, ["t1"])
    assert [s.state for s in new.updates(again)] == [TaskState.RUNNING]
    assert back.peer.of(msg.KillTask) == []
    new.assert_sound()


def test_an_end_applied_before_the_restart_is_not_answered_lost_first(
    core: CoreHarness,
) -> None:
    """The previous master applied the task's end while its framework was away,
    so no registry holds the task; the agent still has the end to deliver. Asked
    before that agent is back, the master must not answer LOST (found by the
    fault injection: FINISHED after LOST)."""
    fw, agent, spec = launched_and_running(core, failover=100)
    core.master.disconnect_framework(fw.framework_id, fw.peer)
    end = core.update(agent, fw, "t1", TaskState.FINISHED, update_id="end", exit_code=0)
    new = core.restart()
    other = new.add_agent(hostname="other")  # not the one that ran t1
    again = new.resubscribe(fw)
    new.master.reconcile(again.framework_id, ["t1"])
    assert new.updates(again) == []  # t1's agent is still re-registering
    back = new.add_agent(agent_id=agent.agent_id, running=(ended(fw, spec),))
    new.master.status_update(back.agent_id, end)  # the agent re-sends the end
    assert [(s.task_id, s.state) for s in new.updates(again)] == [("t1", TaskState.FINISHED)]
    new.master.reconcile(again.framework_id, ["t1", "never"])
    answers = {s.task_id: s.state for s in new.updates(again)}
    assert answers == {"t1": TaskState.FINISHED, "never": TaskState.LOST}
    assert other.agent_id in new.master.agents
    new.assert_sound()


def test_an_agent_that_does_not_return_has_its_tasks_reported_lost(core: CoreHarness) -> None:
    fw, _, _ = launched_and_running(core, failover=100)
    new = core.restart()
    again = new.resubscribe(fw)
    new.advance(CONFIG.agent_reregister_timeout + 0.1)
    [lost] = new.updates(again)
    assert (lost.task_id, lost.state) == ("t1", TaskState.LOST)
    assert "did not re-register" in lost.message
    new.assert_sound()


def test_lost_updates_wait_for_a_framework_that_is_away(core: CoreHarness) -> None:
    fw, _, _ = launched_and_running(core, failover=1000)
    new = core.restart()
    new.advance(CONFIG.agent_reregister_timeout + 0.1)
    again = new.resubscribe(fw)
    [lost] = new.updates(again)
    assert (lost.task_id, lost.state) == ("t1", TaskState.LOST)


def test_two_restarts_in_a_row_lose_nothing(core: CoreHarness) -> None:
    fw, agent, spec = launched_and_running(core, failover=0)
    second = core.restart()
    second.advance(CONFIG.agent_reregister_timeout - 1)  # nobody came back yet
    third = second.restart()
    third.advance(CONFIG.agent_reregister_timeout - 1)  # the grace started again
    back = third.add_agent(agent_id=agent.agent_id, running=(third.running(fw, spec),))
    again = third.resubscribe(fw)
    third.advance(1000)
    third.heartbeat(back)
    assert list(third.master.frameworks[again.framework_id].tasks) == ["t1"]
    assert back.peer.of(msg.KillTask) == []
    third.assert_sound()


def test_weights_from_the_config_apply_to_roles_the_file_does_not_name() -> None:
    harness = CoreHarness(dataclasses.replace(CONFIG, weights={"eng": 2.0}))
    harness.subscribe(role="eng")
    assert harness.master.allocator.role_weight("eng") == 2.0
    assert harness.master.allocator.role_weight("*") == 1.0


def ended(fw: FrameworkPeer, spec: TaskSpec) -> RunningTask:
    """How an agent reports a task whose end is not acknowledged yet."""
    return RunningTask(fw.framework_id, spec, TaskState.FINISHED)


def test_a_task_that_ended_while_the_master_was_down_is_not_reported_lost(
    core: CoreHarness,
) -> None:
    """The agent reports the ended task with its end state; the master neither
    counts it nor calls it LOST, and forwards its real end when it comes."""
    fw, agent, spec = launched_and_running(core, failover=100)
    new = core.restart()
    again = new.resubscribe(fw)
    back = new.add_agent(agent_id=agent.agent_id, running=(ended(fw, spec),))
    assert new.updates(again) == []  # no LOST
    assert new.master.allocator.agent_allocated(back.agent_id).is_empty()
    assert new.registry.tasks() == []
    new.update(back, again, "t1", TaskState.FINISHED, update_id="end", exit_code=0)
    assert [(s.task_id, s.state) for s in new.updates(again)] == [("t1", TaskState.FINISHED)]
    new.assert_sound()


def test_ended_tasks_do_not_count_against_an_agents_capacity(core: CoreHarness) -> None:
    """An ended, unacknowledged task and the task that took its place together
    exceed the agent: both are reported, and the registration is accepted (fault
    injection seed 178: the agent left the ended one out, and the master said LOST)."""
    fw = core.subscribe(failover=100)
    agent = core.add_agent("cpus:1;mem:256")
    [offer] = core.allocate_for(fw)
    first = core.launch(fw, offer, "t1", "cpus:1;mem:256")
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="f1")  # not acknowledged
    [offer] = core.allocate_for(fw)
    second = core.launch(fw, offer, "t2", "cpus:1;mem:256")
    core.update(agent, fw, "t2", TaskState.RUNNING)
    core.updates(fw)
    new = core.restart()
    again = new.resubscribe(fw)
    new.add_agent(
        "cpus:1;mem:256",
        agent_id=agent.agent_id,
        running=(new.running(fw, second), ended(fw, first)),
    )
    assert new.updates(again) == []
    assert new.master.frameworks[fw.framework_id].tasks.keys() == {"t2"}
    new.assert_sound()


def test_a_live_task_reported_ended_on_reconnection_is_freed_then_its_end_shown(
    core: CoreHarness,
) -> None:
    fw, agent, spec = launched_and_running(core)
    core.updates(fw)
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    back = core.add_agent(agent_id=agent.agent_id, running=(ended(fw, spec),))
    assert core.master.allocator.agent_allocated(back.agent_id).is_empty()
    assert core.updates(fw) == []
    core.update(back, fw, "t1", TaskState.FINISHED, update_id="end")
    assert [s.state for s in core.updates(fw)] == [TaskState.FINISHED]


def test_a_torn_down_framework_is_forgotten_when_its_task_comes_back_ended(
    core: CoreHarness,
) -> None:
    """Fault injection: a gone framework still listed. Its task ended while the master
    was down; reported ended, it holds nothing, so nothing is left to wait for."""
    fw, agent, spec = launched_and_running(core)
    core.master.teardown(fw.framework_id)
    new = core.restart()
    assert fw.framework_id in new.master.frameworks  # removing: waits for t1's agent
    new.add_agent(agent_id=agent.agent_id, running=(ended(fw, spec),))
    assert fw.framework_id not in new.master.frameworks
    assert new.registry.frameworks() == []
    new.assert_sound()
