"""Operators act, and the master remembers: an operator's teardown and kill on the core
(`master/operator.py`), and the history of ended frameworks and tasks it keeps,
bounded (`max_completed_frameworks`, `max_completed_tasks_per_framework`), as the
read model shows it. The core driven directly, in virtual time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from mesolite.http_hosts import AllowedHosts
from mesolite.master import messages as msg
from mesolite.master.errors import OperatorCallRefused, Refusal
from mesolite.master.http import create_app
from mesolite.master.read_model import COMPLETED_TASKS_SHOWN, build_snapshot
from mesolite.model import TaskState
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer

pytestmark = pytest.mark.unit


def with_tasks(core: CoreHarness, name: str, *task_ids: str) -> tuple[AgentPeer, FrameworkPeer]:
    """A framework `name` running `task_ids` on a new agent."""
    agent = core.add_agent("cpus:64;mem:65536", hostname=f"{name}-host")
    fw = core.subscribe(name)
    [offer] = core.allocate_for(fw)
    for task_id in task_ids:
        core.launch(fw, offer, task_id, "cpus:0.5;mem:64")
        core.update(agent, fw, task_id, TaskState.RUNNING)
        [offer] = core.allocate_for(fw) or [offer]
    return agent, fw


def killed(core: CoreHarness, agent: AgentPeer, fw: FrameworkPeer) -> list[str]:
    """The tasks the agent was told to kill; each then reported KILLED, exit code 143."""
    kills = [k.task_id for k in agent.peer.take(msg.KillTask) if k.framework_id == fw.framework_id]
    for task_id in kills:
        core.update(agent, fw, task_id, TaskState.KILLED, exit_code=143)
    return kills


def test_an_operator_teardown_kills_the_tasks_then_keeps_the_framework_in_history() -> None:
    core = CoreHarness()
    agent, fw = with_tasks(core, "sweep", "t1", "t2")
    core.update(agent, fw, "t1", TaskState.FINISHED, exit_code=0)

    assert core.master.operator_teardown(fw.framework_id, "admin") == 1
    assert fw.peer.closed and "torn down" in fw.peer.close_reason
    assert fw.framework_id in core.master.frameworks  # removing until its task has ended
    assert killed(core, agent, fw) == ["t2"]
    assert fw.framework_id not in core.master.frameworks

    [ended] = core.master.completed_frameworks.values()
    assert ended.end_reason == "torn down by operator 'admin'"
    state = build_snapshot(core.master, ended_tasks=None)
    [done] = state.completed_frameworks
    assert (done.id, done.name, done.reason) == (fw.framework_id, "sweep", ended.end_reason)
    assert done.ended_at == core.master.wall_time() and done.completed_tasks == 2
    assert done.tasks_by_state == {"TASK_FINISHED": 1, "TASK_KILLED": 1}
    assert state.frameworks == () and state.cluster.frameworks == 0
    by_id = {t.id: t for t in state.completed_tasks}
    assert (by_id["t1"].state, by_id["t1"].exit_code) == (TaskState.FINISHED, 0)
    assert (by_id["t2"].state, by_id["t2"].exit_code) == (TaskState.KILLED, 143)
    assert all(t.framework_id == fw.framework_id and t.ended_at for t in by_id.values())
    assert state.framework_names()[fw.framework_id] == "sweep"
    core.assert_sound()


def test_why_a_framework_ended_is_kept() -> None:
    core = CoreHarness()
    own = core.subscribe("own")
    core.master.teardown(own.framework_id)
    away = core.subscribe("away", failover=30.0)
    core.master.disconnect_framework(away.framework_id, away.peer)
    core.advance(30.0)
    anonymous = core.subscribe("anonymous")
    core.master.operator_teardown(anonymous.framework_id, None)

    reasons = {f.info.name: f.end_reason for f in core.master.completed_frameworks.values()}
    assert reasons == {
        "own": "torn down by the framework",
        "away": "failover timeout expired: away for 30 s, its failover timeout is 30 s",
        "anonymous": "torn down by an anonymous operator",
    }
    newest_first = [f.name for f in build_snapshot(core.master).completed_frameworks]
    assert newest_first == ["anonymous", "away", "own"]


def test_history_is_bounded_as_mesos_bounds_it() -> None:
    config = dataclasses.replace(
        CONFIG, max_completed_frameworks=2, max_completed_tasks_per_framework=3
    )
    core = CoreHarness(config)
    agent, fw = with_tasks(core, "first", *(f"a{i}" for i in range(5)))
    for i in range(5):
        core.update(agent, fw, f"a{i}", TaskState.FAILED, exit_code=i)
    live = core.master.frameworks[fw.framework_id]
    assert [t.spec.task_id for t in live.completed] == ["a2", "a3", "a4"]  # the newest 3
    core.master.operator_teardown(fw.framework_id, "admin")
    for name in ("second", "third"):
        core.master.operator_teardown(core.subscribe(name).framework_id, "admin")

    kept = [f.info.name for f in core.master.completed_frameworks.values()]
    assert kept == ["second", "third"]  # the oldest forgotten
    state = build_snapshot(core.master, ended_tasks=None)
    assert [f.name for f in state.completed_frameworks] == ["third", "second"]
    assert state.completed_tasks == ()  # "first" and its tasks are gone
    core.assert_sound()


def test_a_snapshot_holds_the_newest_ended_tasks_unless_asked_for_all() -> None:
    core = CoreHarness()
    agent, fw = with_tasks(core, "many", *(f"t{i}" for i in range(6)))
    for i in range(6):
        core.advance(1.0)
        core.update(agent, fw, f"t{i}", TaskState.FINISHED, exit_code=0)
    core.master.operator_teardown(fw.framework_id, "admin")

    assert [t.id for t in build_snapshot(core.master, ended_tasks=2).completed_tasks] == [
        "t5",
        "t4",
    ]
    every = build_snapshot(core.master, ended_tasks=None).completed_tasks
    assert [t.id for t in every] == [f"t{i}" for i in reversed(range(6))]


def test_an_operator_kill_is_the_frameworks_own_kill() -> None:
    core = CoreHarness()
    agent, fw = with_tasks(core, "service", "web-1", "web-2")

    assert core.master.operator_kill(fw.framework_id, "web-1", "admin") == agent.agent_id
    [kill] = agent.peer.take(msg.KillTask)
    assert (kill.framework_id, kill.task_id) == (fw.framework_id, "web-1")
    status = core.update(agent, fw, "web-1", TaskState.KILLED, exit_code=143)
    assert status in core.updates(fw)  # the framework hears how it ended
    assert set(core.master.frameworks[fw.framework_id].tasks) == {"web-2"}
    assert fw.peer.closed is False
    core.assert_sound()


@pytest.mark.parametrize(
    ("case", "refusal", "message"),
    [
        ("unknown framework", Refusal.NOT_FOUND, "is not known to this master"),
        ("bad framework id", Refusal.INVALID, "invalid framework id"),
        ("bad task id", Refusal.INVALID, "invalid task id"),
        ("unknown task", Refusal.NOT_FOUND, "has no task 'nope'"),
        ("ended task", Refusal.PRECONDITION, "has already ended: TASK_FINISHED"),
        ("agent away", Refusal.PRECONDITION, "is disconnected: try again"),
        ("being torn down", Refusal.PRECONDITION, "is already being torn down: 1 task still"),
        ("ended framework", Refusal.PRECONDITION, "has already ended: torn down by the framework"),
    ],
)
def test_operator_refusals_say_why_and_change_nothing(
    case: str, refusal: Refusal, message: str
) -> None:
    core = CoreHarness()
    agent, fw = with_tasks(core, "target", "running", "done")
    core.update(agent, fw, "done", TaskState.FINISHED, exit_code=0)
    framework_id, task_id = fw.framework_id, "running"
    if case == "unknown framework":
        framework_id = "no-such-framework"
    elif case == "bad framework id":
        framework_id = "a b\n"
    elif case == "bad task id":
        task_id = "../x"
    elif case == "unknown task":
        task_id = "nope"
    elif case == "ended task":
        task_id = "done"
    elif case == "agent away":
        core.master.disconnect_agent(agent.agent_id, agent.peer)
    elif case == "being torn down":
        core.master.operator_teardown(fw.framework_id, "admin")
    elif case == "ended framework":
        other = core.subscribe("other")
        core.master.teardown(other.framework_id)
        framework_id = other.framework_id
    agent.peer.take(msg.KillTask)
    before = core.state()

    calls: list[Callable[[], object]] = [
        lambda: core.master.operator_kill(framework_id, task_id, "admin")
    ]
    if case not in ("bad task id", "unknown task", "ended task", "agent away"):
        calls.append(lambda: core.master.operator_teardown(framework_id, "admin"))
    for call in calls:
        with pytest.raises(OperatorCallRefused, match=message) as refused:
            call()
        assert refused.value.refusal is refusal
        assert core.state() == before and agent.peer.of(msg.KillTask) == []
    core.assert_sound()


async def test_get_state_holds_every_ended_task_kept_and_the_page_the_newest() -> None:
    """GET /state: the whole history (as Mesos' /state), or the newest N ended tasks for
    ?completed_tasks=N; the web UI's events: the newest COMPLETED_TASKS_SHOWN only (they
    are sent again at every change)."""
    core = CoreHarness()
    many = COMPLETED_TASKS_SHOWN + 10
    agent, fw = with_tasks(core, "many", *(f"t{i}" for i in range(many)))
    for i in range(many):
        core.update(agent, fw, f"t{i}", TaskState.FINISHED, exit_code=0)
    core.master.operator_teardown(fw.framework_id, "admin")
    app = create_app(core.master, allowed_hosts=AllowedHosts(("*",)))
    async with TestClient(TestServer(app)) as client:

        async def state(query: str = "") -> dict[str, Any]:
            async with client.get(f"/state{query}") as response:
                assert response.status == 200, await response.text()
                document: dict[str, Any] = await response.json()
                return document

        every = await state()
        assert len(every["completed_tasks"]) == many
        assert [f["id"] for f in every["completed_frameworks"]] == [fw.framework_id]
        assert (await state("?completed_tasks=all")) == every
        newest = (await state("?completed_tasks=2"))["completed_tasks"]
        assert [t["id"] for t in newest] == [t["id"] for t in every["completed_tasks"][:2]]
        none = await state("?completed_tasks=0")  # what the CLI's views ask for
        assert none["completed_tasks"] == [] and none["completed_frameworks"]
        for bad in ("-1", "x", "1e3", "%C2%B3", "9" * 12):
            async with client.get(f"/state?completed_tasks={bad}") as response:
                assert response.status == 400, bad
    assert len(build_snapshot(core.master).completed_tasks) == COMPLETED_TASKS_SHOWN
