"""The master's side of the SDK's promise: an implicit reconciliation is answered with
the state of every task the master knows for the framework, then RECONCILED; after a
restart, only once the agents the registry placed its tasks on are back (or their
window is over). Driven on the core, in virtual time (tests/support/core.py)."""

from __future__ import annotations

from typing import Any

import pytest

from mesolite.master import messages as msg
from mesolite.master.errors import CallRejected
from mesolite.master.status_updates import MAX_DEFERRED_RECONCILIATIONS
from mesolite.model import TaskSpec, TaskState
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer

pytestmark = pytest.mark.unit


def running_tasks(
    core: CoreHarness, *task_ids: str, failover: float = 100.0
) -> tuple[FrameworkPeer, AgentPeer, list[TaskSpec]]:
    fw = core.subscribe(failover=failover)
    agent = core.add_agent()
    specs = []
    for task_id in task_ids:
        [offer] = core.allocate_for(fw)
        specs.append(core.launch(fw, offer, task_id, "cpus:1;mem:64"))
        core.update(agent, fw, task_id, TaskState.RUNNING)
    fw.peer.messages.clear()
    return fw, agent, specs


def answers(fw: FrameworkPeer) -> list[tuple[str, Any, Any]]:
    """What the framework was sent about reconciliation, in order."""
    seen: list[tuple[str, Any, Any]] = []
    for m in fw.peer.messages:
        if isinstance(m, msg.Update):
            seen.append(("update", m.status.task_id, m.status.state))
        elif isinstance(m, msg.Reconciled):
            seen.append(("reconciled", m.call_id, m.tasks))
    fw.peer.messages.clear()
    return seen


def test_an_implicit_reconciliation_ends_with_reconciled(core: CoreHarness) -> None:
    fw, _, _ = running_tasks(core, "t1", "t2")
    core.master.reconcile(fw.framework_id, [], "c1")
    assert answers(fw) == [
        ("update", "t1", TaskState.RUNNING),
        ("update", "t2", TaskState.RUNNING),
        ("reconciled", "c1", 2),
    ]
    # An explicit one has no marker: it may leave tasks unanswered (see the docstring).
    core.master.reconcile(fw.framework_id, ["t1"], "c2")
    assert answers(fw) == [("update", "t1", TaskState.RUNNING)]


def test_after_a_restart_the_answer_waits_for_the_agent(core: CoreHarness) -> None:
    fw, agent, specs = running_tasks(core, "t1", "t2")
    new = core.restart()
    again = new.resubscribe(fw)
    new.master.reconcile(again.framework_id, [], "c1")
    assert answers(again) == []  # answered now, it would leave out t1 and t2
    back = new.add_agent(agent_id=agent.agent_id, running=tuple(new.running(fw, s) for s in specs))
    assert answers(again) == [
        ("update", "t1", TaskState.RUNNING),
        ("update", "t2", TaskState.RUNNING),
        ("reconciled", "c1", 2),
    ]
    assert back.peer.of(msg.KillTask) == []
    new.assert_sound()


def test_a_framework_with_nothing_on_the_agents_away_is_answered_at_once(
    core: CoreHarness,
) -> None:
    _, agent, _ = running_tasks(core, "t1")
    other = core.subscribe("other", failover=100)
    new = core.restart()
    again = new.resubscribe(other)
    new.master.reconcile(again.framework_id, [], "c1")
    assert answers(again) == [("reconciled", "c1", 0)]
    assert agent.agent_id in new.master.recovering_agents
    new.assert_sound()


def test_tasks_of_an_agent_that_does_not_return_are_lost_first(core: CoreHarness) -> None:
    fw, _, _ = running_tasks(core, "t1")
    new = core.restart()
    again = new.resubscribe(fw)
    new.master.reconcile(again.framework_id, [], "c1")
    new.advance(CONFIG.agent_reregister_timeout + 0.1)
    assert answers(again) == [("update", "t1", TaskState.LOST), ("reconciled", "c1", 0)]
    new.assert_sound()


def test_a_deferred_answer_is_dropped_with_its_stream(core: CoreHarness) -> None:
    fw, agent, specs = running_tasks(core, "t1")
    new = core.restart()
    again = new.resubscribe(fw)
    new.master.reconcile(again.framework_id, [], "c1")
    new.master.disconnect_framework(again.framework_id, again.peer)
    assert new.master.frameworks[again.framework_id].deferred_reconciliations == []
    third = new.resubscribe(fw)  # asks again on its new stream
    new.master.reconcile(third.framework_id, [], "c2")
    new.add_agent(agent_id=agent.agent_id, running=(new.running(fw, specs[0]),))
    assert answers(again) == []
    assert answers(third) == [("update", "t1", TaskState.RUNNING), ("reconciled", "c2", 1)]
    new.assert_sound()


def test_deferred_reconciliations_are_bounded_and_call_ids_checked(core: CoreHarness) -> None:
    fw, _, _ = running_tasks(core, "t1")
    new = core.restart()
    again = new.resubscribe(fw)
    with pytest.raises(CallRejected, match="invalid call id"):
        new.master.reconcile(again.framework_id, [], "bad id\n")
    for n in range(MAX_DEFERRED_RECONCILIATIONS):
        new.master.reconcile(again.framework_id, [], f"c{n}")
    with pytest.raises(CallRejected, match="already wait"):
        new.master.reconcile(again.framework_id, [], "one-more")
    deferred = new.master.frameworks[again.framework_id].deferred_reconciliations
    assert len(deferred) == MAX_DEFERRED_RECONCILIATIONS
    new.advance(CONFIG.agent_reregister_timeout + 0.1)
    markers = [a for a in answers(again) if a[0] == "reconciled"]
    assert [m[1] for m in markers] == [f"c{n}" for n in range(MAX_DEFERRED_RECONCILIATIONS)]
    new.assert_sound()
