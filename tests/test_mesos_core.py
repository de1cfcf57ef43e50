"""The master core's Mesos semantics (used by the Mesos scheduler API, master/mesos_api/):
ACCEPT answered per task, KILL of a task that is not running reconciled."""

from __future__ import annotations

from mesolite.master import messages as msg
from mesolite.master.offers import InvalidTask
from mesolite.model import StatusSource, TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.core import CoreHarness


def spec(task_id: str, resources: str = "cpus:1;mem:128", command: str = "true") -> TaskSpec:
    return TaskSpec(task_id, command, Resources.parse(resources))


def test_a_bad_task_ends_task_error_while_the_others_launch(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent("cpus:4;mem:1024")
    [offer] = core.allocate_for(fw)
    tasks: list[TaskSpec | InvalidTask] = [
        spec("ok1"),
        spec("bad/id"),
        InvalidTask("unreadable", "resource 'ports' is not a scalar"),
        spec("ok1"),  # twice in one call
        spec("too-big", "cpus:3.5"),  # 1 cpu is already taken by ok1: 3 left
        spec("ok2", "cpus:2;mem:128"),
    ]
    core.master.accept_each(fw.framework_id, [offer.offer_id], tasks, 0)
    launched = [m.task.task_id for m in agent.peer.take(msg.LaunchTask)]
    assert launched == ["ok1", "ok2"]
    updates = core.updates(fw)
    assert [(u.task_id, u.state) for u in updates] == [
        ("bad/id", TaskState.ERROR),
        ("unreadable", TaskState.ERROR),
        ("ok1", TaskState.ERROR),
        ("too-big", TaskState.ERROR),
    ]
    assert all(
        u.reason == "REASON_TASK_INVALID" and u.source is StatusSource.MASTER for u in updates
    )
    assert "not a scalar" in updates[1].message
    assert "more resources" in updates[3].message
    # What the launched tasks do not use is offered again.
    [rest] = core.allocate_for(fw)
    assert rest.resources == Resources.parse("cpus:1;mem:768")


def test_invalid_offers_drop_every_task_and_give_the_valid_offers_back(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent("cpus:4;mem:1024")
    [offer] = core.allocate_for(fw)
    tasks = [spec("a"), spec("b")]
    core.master.accept_each(fw.framework_id, [offer.offer_id, "no-such-offer"], tasks, 0)
    assert agent.peer.of(msg.LaunchTask) == []
    updates = core.updates(fw)
    assert [(u.task_id, u.state, u.reason) for u in updates] == [
        ("a", TaskState.DROPPED, "REASON_INVALID_OFFERS"),
        ("b", TaskState.DROPPED, "REASON_INVALID_OFFERS"),
    ]
    assert "invalid offers" in updates[0].message
    assert offer.offer_id not in core.master.offers  # the valid one is taken back, unfiltered
    [again] = core.allocate_for(fw)
    assert again.resources == offer.resources


def test_kill_of_an_unknown_task_is_answered_by_reconciliation(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:128")
    core.master.kill_or_reconcile(fw.framework_id, "never-launched")
    [lost] = core.updates(fw)
    assert (lost.task_id, lost.state, lost.source) == (
        "never-launched",
        TaskState.LOST,
        StatusSource.MASTER,
    )
    assert agent.peer.of(msg.KillTask) == []
    core.master.kill_or_reconcile(fw.framework_id, "t1")  # a running task is killed
    assert [k.task_id for k in agent.peer.take(msg.KillTask)] == ["t1"]


def test_task_ids_as_mesos_allows_them(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent("cpus:8;mem:8192")
    [offer] = core.allocate_for(fw)
    good = ["web server #1", "tâche", "a" * 255, "x@host:8080+1", "..."]
    bad = ["a/b", ".", "..", "", "back\\slash", "new\nline", "é" * 128, "rtl\u202eflip"]
    tasks = [spec(t) for t in good + bad]
    core.master.accept_each(fw.framework_id, [offer.offer_id], tasks, 0)
    assert [m.task.task_id for m in agent.peer.take(msg.LaunchTask)] == good
    errors = core.updates(fw)
    assert [u.state for u in errors] == [TaskState.ERROR] * len(bad)
    assert all("invalid task id" in u.message for u in errors)
