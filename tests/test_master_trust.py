"""No client can act for another, and every size a client controls is bounded: the core.

Identity comes from the connection (the servicers pass the principal they
authenticated); these scenarios drive the core directly, as tests/test_master_core.py
does. Each attack from issue 11 that reaches the core is here: hijacking a
framework, an agent reporting another agent's task or speaking as the master,
claiming another agent's id or tasks; and each refusal changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.acl import Action
from mesolite.master.errors import CallRejected, Refusal, RegistrationRefused
from mesolite.model import (
    FrameworkInfo,
    RunningTask,
    StatusSource,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from mesolite.resources import Resources
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer
from tests.support.fakes import RecordingPeer

pytestmark = pytest.mark.unit


def running_task(
    core: CoreHarness, principal: str = "team-a"
) -> tuple[FrameworkPeer, AgentPeer, TaskSpec]:
    fw = core.subscribe("victim", principal=principal)
    agent = core.add_agent(principal="agent-1")
    [offer] = core.allocate_for(fw)
    spec = core.launch(fw, offer, "t1", "cpus:1;mem:128")
    core.update(agent, fw, "t1", TaskState.RUNNING)
    core.updates(fw)
    return fw, agent, spec


def refused(refusal: Refusal, call: object) -> RegistrationRefused:
    assert callable(call)
    with pytest.raises(RegistrationRefused) as e:
        call()
    assert e.value.refusal is refusal, e.value
    return e.value


# A framework belongs to its principal -------------------------------------------


def test_a_framework_id_cannot_be_taken_by_another_principal(core: CoreHarness) -> None:
    fw, _, _ = running_task(core)
    before = core.state()
    error = refused(Refusal.FORBIDDEN, lambda: core.resubscribe(fw, principal="mallory"))
    assert "another principal" in str(error)
    assert core.state() == before
    assert not fw.peer.closed  # the victim keeps its stream
    # Without a principal (authentication off) is another principal too.
    refused(Refusal.FORBIDDEN, lambda: core.resubscribe(fw, principal=None))
    again = core.resubscribe(fw, principal="team-a")  # its owner may
    assert again.framework_id == fw.framework_id


def test_the_owner_is_kept_across_a_master_restart(core: CoreHarness) -> None:
    fw, agent, spec = running_task(core)
    core = core.restart()
    refused(Refusal.FORBIDDEN, lambda: core.resubscribe(fw, principal="mallory"))
    refused(
        Refusal.FORBIDDEN,
        lambda: core.add_agent(
            agent_id=agent.agent_id, running=(core.running(fw, spec),), principal="mallory"
        ),
    )
    core.add_agent(agent_id=agent.agent_id, running=(core.running(fw, spec),), principal="agent-1")
    assert core.resubscribe(fw, principal="team-a").framework_id == fw.framework_id


# An agent speaks only for itself ---------------------------------------------------


def test_an_agent_cannot_report_a_task_of_another_agent(core: CoreHarness) -> None:
    fw, victim, _ = running_task(core)
    rogue = core.add_agent(principal="agent-2")
    before = core.state()
    for state in (TaskState.FINISHED, TaskState.LOST, TaskState.RUNNING):
        core.update(rogue, fw, "t1", state)
    assert core.state() == before
    assert core.updates(fw) == []
    assert rogue.peer.take(msg.AcknowledgeUpdate) == []
    core.update(victim, fw, "t1", TaskState.FINISHED)  # the task's own agent may
    assert [u.state for u in core.updates(fw)] == [TaskState.FINISHED]


def test_an_agent_cannot_speak_as_the_master(core: CoreHarness) -> None:
    fw, agent, _ = running_task(core)
    before = core.state()
    for status in (
        TaskStatus(
            "t1", fw.framework_id, agent.agent_id, TaskState.LOST, source=StatusSource.MASTER
        ),
        TaskStatus("t1", fw.framework_id, "someone-else", TaskState.FINISHED, update_id="x"),
    ):
        core.master.status_update(agent.agent_id, status)
    assert core.state() == before
    assert core.updates(fw) == []


def test_an_agent_id_cannot_be_taken_by_another_principal(core: CoreHarness) -> None:
    fw, victim, _ = running_task(core)
    before = core.state()
    error = refused(
        Refusal.FORBIDDEN,
        lambda: core.add_agent(agent_id=victim.agent_id, principal="mallory"),
    )
    assert "another principal" in str(error)
    assert core.state() == before
    assert not victim.peer.closed
    assert core.updates(fw) == []  # nothing reported lost


def test_re_registration_cannot_claim_another_agents_task(core: CoreHarness) -> None:
    fw, victim, spec = running_task(core)
    other = core.add_agent(principal="agent-2")
    before = core.state()
    error = refused(
        Refusal.INVALID,
        lambda: core.add_agent(
            agent_id=other.agent_id, running=(core.running(fw, spec),), principal="agent-2"
        ),
    )
    assert f"runs on agent {victim.agent_id}" in str(error)
    assert core.state() == before


def test_re_registration_cannot_claim_a_task_another_recovering_agent_had(
    core: CoreHarness,
) -> None:
    fw, _, spec = running_task(core)
    other = core.add_agent(principal="agent-2")
    core = core.restart()
    before = core.state()
    refused(
        Refusal.INVALID,
        lambda: core.add_agent(
            agent_id=other.agent_id, running=(core.running(fw, spec),), principal="agent-2"
        ),
    )
    assert core.state() == before


def test_re_registration_reporting_more_than_the_agent_has_changes_nothing(
    core: CoreHarness,
) -> None:
    """Reported tasks beyond the agent's known total once made `register_agent` raise
    a ValueError after it had changed state."""
    fw, agent, spec = running_task(core)
    big = TaskSpec("t2", "true", Resources.parse("cpus:4;mem:128"))
    before = core.state()
    refused(
        Refusal.INVALID,
        lambda: core.add_agent(
            "cpus:8;mem:4096",  # claims more than it registered with
            agent_id=agent.agent_id,
            running=(core.running(fw, spec), core.running(fw, big)),
            principal="agent-1",
        ),
    )
    assert core.state() == before


def test_a_task_reported_twice_is_refused(core: CoreHarness) -> None:
    fw, agent, spec = running_task(core)
    before = core.state()
    refused(
        Refusal.INVALID,
        lambda: core.add_agent(
            agent_id=agent.agent_id,
            running=(core.running(fw, spec), core.running(fw, spec)),
            principal="agent-1",
        ),
    )
    assert core.state() == before


def test_offers_for_a_re_registering_agent_are_rescinded_first(core: CoreHarness) -> None:
    """Its reported tasks are granted on a clean slate: an outstanding offer of the
    same resources would otherwise count them twice."""
    fw, agent, spec = running_task(core)
    other = core.subscribe("other", principal="team-b")
    offers = core.allocate_for(other)
    assert offers and offers[0].agent_id == agent.agent_id
    core.add_agent(agent_id=agent.agent_id, running=(core.running(fw, spec),), principal="agent-1")
    assert [r.offer_id for r in other.peer.take(msg.Rescind)] == [offers[0].offer_id]


# Authorization --------------------------------------------------------------------

ACLS = {
    "register_frameworks": [
        {"principals": {"values": ["team-a"]}, "roles": {"values": ["a", "a/*"]}},
        {"principals": {"values": ["team-b"]}, "roles": {"values": ["b"]}},
    ],
    "register_agents": [{"principals": {"values": ["agent-1"]}}],
}


def with_acls(tmp_path: Path, acls: object) -> CoreHarness:
    path = tmp_path / "acls.json"
    path.write_text(json.dumps(acls))
    return CoreHarness(dataclasses.replace(CONFIG, acls_file=path))


def test_frameworks_register_only_in_the_roles_their_principal_may_use(tmp_path: Path) -> None:
    core = with_acls(tmp_path, ACLS)
    for principal, role in [("team-a", "a"), ("team-a", "a/x/y"), ("team-b", "b")]:
        core.subscribe(role=role, principal=principal)
    before = core.state()
    refusals: list[tuple[str | None, str]] = [
        ("team-a", "ab"),
        ("team-a", "b"),
        ("team-b", "b/x"),
        ("team-b", "*"),
        (None, "a"),
        ("mallory", "a"),
    ]
    for who, role in refusals:
        error = refused(
            Refusal.FORBIDDEN,
            lambda who=who, role=role: core.subscribe(role=role, principal=who),
        )
        assert repr(role) in str(error)
    assert core.state() == before


def test_only_principals_the_acls_name_register_agents(tmp_path: Path) -> None:
    core = with_acls(tmp_path, ACLS)
    core.add_agent(principal="agent-1")
    before = core.state()
    refused(Refusal.FORBIDDEN, lambda: core.add_agent(principal="team-a"))
    refused(Refusal.FORBIDDEN, lambda: core.add_agent(principal=None))
    assert core.state() == before


def test_a_bad_acl_file_on_reload_keeps_the_acls_in_force(tmp_path: Path) -> None:
    core = with_acls(tmp_path, ACLS)
    path = tmp_path / "acls.json"
    path.write_text('{"register_frameworks": [{"principals": {"values": "team-a"}}]}')
    assert core.master.reload_acls() is False
    refused(Refusal.FORBIDDEN, lambda: core.subscribe(role="b", principal="team-a"))
    path.write_text(json.dumps({"permissive": True}))
    assert core.master.reload_acls() is True
    core.subscribe(role="b", principal="team-a")


def test_the_acls_are_read_in_order_and_none_denies() -> None:
    from mesolite.master.acl import parse_acls

    acls = parse_acls(
        {
            "register_frameworks": [
                {"principals": {"values": ["ops"]}, "roles": {"type": "NONE"}},
                {"principals": {"type": "ANY"}, "roles": {"values": ["shared"]}},
            ],
            "view_state": [{"principals": {"type": "ANY"}}],
            "access_sandboxes": [
                {"principals": {"values": ["a"]}, "framework_principals": {"values": ["a"]}}
            ],
        }
    )
    assert not acls.allows(Action.REGISTER_FRAMEWORKS, "ops", "shared")
    assert acls.allows(Action.REGISTER_FRAMEWORKS, "dev", "shared")
    assert acls.allows(Action.REGISTER_FRAMEWORKS, None, "shared")  # ANY includes nobody
    assert not acls.allows(Action.REGISTER_FRAMEWORKS, "dev", "other")
    assert acls.allows(Action.VIEW_STATE, None)
    assert acls.allows(Action.ACCESS_SANDBOXES, "a", "a")
    assert not acls.allows(Action.ACCESS_SANDBOXES, "a", "b")
    assert not acls.allows(Action.ACCESS_SANDBOXES, "b", "b")
    assert not acls.allows(Action.REGISTER_AGENTS, "a")  # not in the file: denied


@pytest.mark.parametrize(
    "acls",
    [
        [],
        {"register_framework": []},
        {"permissive": "yes"},
        {"register_agents": {"principals": {"type": "ANY"}}},
        {"register_agents": [{"principals": {"type": "ALL"}}]},
        {"register_agents": [{"principals": {"values": [1]}}]},
        {"register_agents": [{"roles": {"type": "ANY"}}]},
        {"register_agents": [{"principals": {"type": "ANY"}, "roles": {"type": "ANY"}}]},
    ],
)
def test_a_bad_acl_file_is_refused_with_a_reason(acls: object) -> None:
    from mesolite.master.acl import AclError, parse_acls

    with pytest.raises(AclError):
        parse_acls(acls)


# Bounds ----------------------------------------------------------------------------

HUGE = "x" * 3_000_000


@pytest.mark.parametrize(
    "info",
    [
        FrameworkInfo("n" * (validation.MAX_NAME + 1), "*", 0.0),
        FrameworkInfo("fw", "r" * (validation.MAX_NAME + 1), 0.0),
        FrameworkInfo("fw", "*", 1e300),
        FrameworkInfo("fw", "*", validation.MAX_FAILOVER_TIMEOUT + 1),
        FrameworkInfo("fw", "*", 0.0, HUGE),
    ],
)
def test_an_oversized_subscription_is_refused(core: CoreHarness, info: FrameworkInfo) -> None:
    before = core.state()
    error = refused(Refusal.INVALID, lambda: core.master.subscribe(info, RecordingPeer()))
    assert len(str(error)) < 300  # the input is not quoted back whole
    assert core.state() == before


def test_the_number_of_frameworks_and_roles_is_bounded() -> None:
    # Three roles: the default role `*`, a and b.
    core = CoreHarness(dataclasses.replace(CONFIG, max_frameworks=3, max_roles=3))
    core.subscribe(role="a")
    core.subscribe(role="b")
    before = core.state()
    error = refused(Refusal.PRECONDITION, lambda: core.subscribe(role="c"))
    assert "3 roles" in str(error)
    assert core.state() == before
    core.subscribe(role="a")
    refused(Refusal.PRECONDITION, lambda: core.subscribe(role="a"))
    assert core.state() != before


def test_the_number_of_agents_is_bounded() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, max_agents=1))
    agent = core.add_agent()
    refused(Refusal.PRECONDITION, lambda: core.add_agent())
    core.add_agent(agent_id=agent.agent_id)  # a known agent still comes back


def names(n: int) -> str:
    return ";".join(["cpus:1", "mem:64"] + [f"r{i}:1" for i in range(n - 2)])


@pytest.mark.parametrize(
    ("resources", "hostname", "attributes"),
    [
        (names(validation.MAX_RESOURCE_NAMES + 1), "h", {}),
        (f"cpus:1;{'r' * (validation.MAX_RESOURCE_NAME + 1)}:1", "h", {}),
        ("cpus:1", "h" * (validation.MAX_NAME + 1), {}),
        ("cpus:1", "h", {f"k{i}": "v" for i in range(validation.MAX_ATTRIBUTES + 1)}),
        ("cpus:1", "h", {"k": "v" * (validation.MAX_ATTRIBUTE_VALUE + 1)}),
        ("cpus:1", "h", {"": "v"}),
    ],
)
def test_an_oversized_registration_is_refused(
    core: CoreHarness, resources: str, hostname: str, attributes: dict[str, str]
) -> None:
    before = core.state()
    refused(
        Refusal.INVALID,
        lambda: core.master.register_agent(
            "", hostname, "127.0.0.1:1", Resources.parse(resources), attributes, (), RecordingPeer()
        ),
    )
    assert core.state() == before


def spec(**changes: object) -> TaskSpec:
    return dataclasses.replace(TaskSpec("t", "true", Resources.parse("cpus:0.1;mem:32")), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tasks",
    [
        [spec(task_id=f"t{i}") for i in range(validation.MAX_TASKS_PER_CALL + 1)],
        [spec(task_id=HUGE)],
        [spec(command="x" * (validation.MAX_COMMAND + 1))],
        [spec(name="n" * (validation.MAX_NAME + 1))],
        [spec(environment={f"V{i}": "" for i in range(validation.MAX_ENVIRONMENT + 1)})],
        [spec(environment={"A=B": "c"})],
        [spec(environment={"A": "\0"})],
        [spec(environment={"A": "v" * (validation.MAX_ENVIRONMENT_VALUE + 1)})],
        [spec(resources=Resources.parse(names(validation.MAX_RESOURCE_NAMES + 1)))],
    ],
)
def test_an_oversized_launch_is_refused(core: CoreHarness, tasks: list[TaskSpec]) -> None:
    fw = core.subscribe()
    core.add_agent("cpus:4;mem:4096;" + ";".join(f"r{i}:1" for i in range(62)))
    [offer] = core.allocate_for(fw)
    before = core.state()
    with pytest.raises(CallRejected) as e:
        core.master.accept(fw.framework_id, [offer.offer_id], tasks, refuse_seconds=0)
    assert len(str(e.value)) < 300
    assert core.state() == before


def test_too_many_ids_in_one_call_are_refused(core: CoreHarness) -> None:
    fw = core.subscribe()
    ids = [f"o{i}" for i in range(validation.MAX_IDS_PER_CALL + 1)]
    with pytest.raises(CallRejected):
        core.master.decline(fw.framework_id, ids, None)
    with pytest.raises(CallRejected):
        core.master.reconcile(fw.framework_id, ids)
    with pytest.raises(CallRejected):
        core.master.decline(fw.framework_id, [HUGE], None)
    assert core.updates(fw) == []


def test_a_long_id_is_quoted_back_clipped() -> None:
    message = validation.id_problem("task id", HUGE)
    assert message is not None and len(message) < 200
    assert "3000000 characters" in message


def test_running_task_fixture_is_what_it_says(core: CoreHarness) -> None:
    fw, agent, _ = running_task(core)
    task = core.master.frameworks[fw.framework_id].tasks["t1"]
    assert (task.agent_id, task.state) == (agent.agent_id, TaskState.RUNNING)
    assert core.master.agents[agent.agent_id].principal == "agent-1"
    assert core.master.frameworks[fw.framework_id].principal == "team-a"


# A framework that never acknowledges holds nothing ----------------------------------


def launched(core: CoreHarness) -> tuple[FrameworkPeer, AgentPeer, TaskStatus]:
    """A task launched, and its RUNNING update (not sent yet)."""
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:128")
    running = TaskStatus("t1", fw.framework_id, agent.agent_id, TaskState.RUNNING, update_id="r")
    return fw, agent, running


def test_a_terminal_latest_state_frees_the_task_before_any_acknowledgement(
    core: CoreHarness,
) -> None:
    """The agent sends a task's updates one at a time, each after the previous one is
    acknowledged; with the end queued behind an unacknowledged RUNNING, the master
    learns of it from `latest_state` and frees the resources (as Mesos)."""
    fw, agent, running = launched(core)
    core.master.status_update(agent.agent_id, running, TaskState.FINISHED)
    assert core.master.allocator.agent_allocated(agent.agent_id).is_empty()
    assert [u.state for u in core.updates(fw)] == [TaskState.RUNNING]  # still in order
    core.master.status_update(agent.agent_id, running, TaskState.FINISHED)  # a retry
    assert [u.state for u in core.updates(fw)] == [TaskState.RUNNING]
    # Acknowledged at last: the end itself still reaches the framework, once applied.
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="f")
    assert [u.state for u in core.updates(fw)] == [TaskState.FINISHED]
    assert agent.peer.take(msg.AcknowledgeUpdate) == []  # the framework acknowledges
    core.update(agent, fw, "t1", TaskState.RUNNING, update_id="r")  # stale now
    assert core.updates(fw) == []


def test_without_a_terminal_latest_state_the_task_keeps_its_resources(
    core: CoreHarness,
) -> None:
    _, agent, running = launched(core)
    core.master.status_update(agent.agent_id, running, TaskState.RUNNING)
    assert str(core.master.allocator.agent_allocated(agent.agent_id)) == "cpus:1;mem:128"


def test_every_refusal_has_a_grpc_status() -> None:
    from mesolite.master.servicers import _STATUS_OF

    assert set(_STATUS_OF) == set(Refusal)


def test_reconciliation_does_not_answer_ahead_of_updates_on_their_way(
    core: CoreHarness,
) -> None:
    """Fault injection: RUNNING shown after FINISHED. The master knew of the end
    from `latest_state`; a reconciliation answer FINISHED would come before the
    agent's own RUNNING, still unacknowledged, then FINISHED."""
    fw, agent, running = launched(core)
    core.master.status_update(agent.agent_id, running, TaskState.FINISHED)
    core.updates(fw)
    core.master.reconcile(fw.framework_id, ["t1"])
    assert core.updates(fw) == []  # deferred: its updates are on their way
    core.master.status_update(agent.agent_id, running, TaskState.FINISHED)  # retried
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="f")
    assert [u.state for u in core.updates(fw)] == [TaskState.RUNNING, TaskState.FINISHED]
    core.master.reconcile(fw.framework_id, ["t1"])  # delivered now: answered
    assert [u.state for u in core.updates(fw)] == [TaskState.FINISHED]


def test_an_end_whose_agent_is_removed_is_told_by_the_master(core: CoreHarness) -> None:
    fw, agent, running = launched(core)
    core.master.status_update(agent.agent_id, running, TaskState.FINISHED)
    core.updates(fw)
    core.master.remove_agent(agent.agent_id, "test")
    [end] = [u for u in core.updates(fw) if u.task_id == "t1"]
    assert (end.state, end.source) == (TaskState.FINISHED, StatusSource.MASTER)


def test_one_principal_cannot_take_every_framework_slot() -> None:
    """Outside review: one team subscribed every framework the master allows, with a
    failover timeout of a year, and locked the others out."""
    config = dataclasses.replace(CONFIG, max_frameworks=10, max_frameworks_per_principal=3)
    core = CoreHarness(config)
    for _ in range(3):
        core.subscribe(principal="team-a", failover=validation.MAX_FAILOVER_TIMEOUT)
    error = refused(Refusal.PRECONDITION, lambda: core.subscribe(principal="team-a"))
    assert "'team-a' has 3 frameworks" in str(error)
    core.subscribe(principal="team-b")  # the others still may


def test_removed_agents_are_remembered_up_to_a_bound() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, max_removed_agents=2))
    agents = [core.add_agent() for _ in range(3)]
    for agent in agents:
        core.master.remove_agent(agent.agent_id, "test")
    assert list(core.master.removed_agents) == [a.agent_id for a in agents[1:]]
    assert [a.agent_id for a in core.registry.agents()] == [a.agent_id for a in agents[1:]]
    # The forgotten one, back, is unknown: told to register anew, as a removed one is.
    refused(Refusal.PRECONDITION, lambda: core.add_agent(agent_id=agents[0].agent_id))


def test_an_acknowledgement_goes_only_to_the_frameworks_own_tasks_agent(
    core: CoreHarness,
) -> None:
    """Outside review: a framework flooded another principal's agent with
    acknowledgements of updates it never had, until the agent's outbox overflowed."""
    fw, agent, _ = running_task(core)
    other = core.subscribe("other", principal="team-b")
    [update_id] = [u for u in core.master.frameworks[fw.framework_id].tasks["t1"].applied_updates]
    for framework, task_id, update in [
        (other, "t1", update_id),  # not its task
        (fw, "t1", "made-up"),  # not an update it was sent
        (fw, "nope", update_id),  # not a task
    ]:
        with pytest.raises(CallRejected):
            core.master.acknowledge(framework.framework_id, agent.agent_id, task_id, update)
    assert agent.peer.take(msg.AcknowledgeUpdate) == []
    core.master.acknowledge(fw.framework_id, agent.agent_id, "t1", update_id)
    assert len(agent.peer.take(msg.AcknowledgeUpdate)) == 1


def test_names_hold_no_control_characters(core: CoreHarness) -> None:
    """Outside review: a name with terminal escapes reached the log and the CLI raw."""
    for name in ("x\x1b]0;pwned\x07", "a\nb", "zero\u200bwidth"):
        refused(
            Refusal.INVALID,
            lambda n=name: core.master.subscribe(FrameworkInfo(n, "*", 0.0), RecordingPeer()),
        )
    refused(Refusal.INVALID, lambda: core.add_agent(hostname="h\x1b[2J"))


def test_an_ended_task_keeps_no_command_or_environment(core: CoreHarness) -> None:
    fw = core.subscribe()
    agent = core.add_agent()
    [offer] = core.allocate_for(fw)
    resources = Resources.parse("cpus:1;mem:64")
    spec = TaskSpec("t1", "secret command", resources, environment={"K": "v"})
    core.master.accept(fw.framework_id, [offer.offer_id], [spec], refuse_seconds=0)
    core.update(agent, fw, "t1", TaskState.FINISHED)
    [ended] = core.master.frameworks[fw.framework_id].completed
    assert (ended.spec.command, ended.spec.environment) == ("", {})
    assert ended.spec.resources == spec.resources


def test_an_agent_cannot_plant_a_task_in_another_principals_framework(
    core: CoreHarness,
) -> None:
    """Outside review: an agent re-registered reporting a task of team A's framework
    that the master never placed; it was adopted, charged to team A, and its updates
    shown to team A. Now it is killed and taken into no record."""
    fw, agent, _ = running_task(core)
    planted = RunningTask(
        fw.framework_id, TaskSpec("planted", "x", Resources.parse("cpus:1")), TaskState.RUNNING
    )
    before = core.master.allocator.agent_allocated(agent.agent_id)
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    back = core.add_agent(agent_id=agent.agent_id, running=(planted,), principal="agent-1")
    assert back.peer.take(msg.KillTask) == [msg.KillTask(fw.framework_id, "planted")]
    framework = core.master.frameworks[fw.framework_id]
    assert "planted" not in framework.tasks and "planted" not in framework.completed_by_id
    assert core.master.allocator.agent_allocated(agent.agent_id) == before - Resources.parse(
        "cpus:1;mem:128"
    )  # t1, not reported, is LOST: only what the master placed counts
    rogue = TaskStatus("planted", fw.framework_id, agent.agent_id, TaskState.FAILED, update_id="p")
    core.master.status_update(agent.agent_id, rogue)
    assert [u.task_id for u in core.updates(fw)] == ["t1"]  # t1's LOST, nothing planted


def test_after_a_restart_only_tasks_the_registry_placed_are_adopted(core: CoreHarness) -> None:
    fw, agent, spec = running_task(core)
    planted = RunningTask(
        fw.framework_id, TaskSpec("planted", "x", Resources.parse("cpus:1")), TaskState.RUNNING
    )
    new = core.restart()
    back = new.add_agent(
        agent_id=agent.agent_id, running=(new.running(fw, spec), planted), principal="agent-1"
    )
    assert back.peer.take(msg.KillTask) == [msg.KillTask(fw.framework_id, "planted")]
    assert set(new.master.frameworks[fw.framework_id].tasks) == {"t1"}


def test_stand_ins_for_unknown_frameworks_count_against_the_framework_limit() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, max_frameworks=3))
    agent = core.add_agent("cpus:8;mem:4096")
    new = core.restart()
    tiny = TaskSpec("t", "x", Resources.parse("cpus:0.1"))
    ghosts = tuple(RunningTask(f"ghost-{i}", tiny, TaskState.RUNNING) for i in range(5))
    back = new.add_agent("cpus:8;mem:4096", agent_id=agent.agent_id, running=ghosts)
    assert len(new.master.frameworks) == 3
    assert len(back.peer.take(msg.KillTask)) == 5  # three stand-ins' tasks, two unplaced


def test_new_acls_end_the_streams_they_no_longer_allow(tmp_path: Path) -> None:
    """Outside review: an ACL change on SIGHUP applied to new calls only."""
    core = with_acls(tmp_path, ACLS)
    fw = core.subscribe(role="a", principal="team-a")
    other = core.subscribe(role="b", principal="team-b")
    agent = core.add_agent(principal="agent-1")
    narrower = {**ACLS, "register_frameworks": ACLS["register_frameworks"][1:]}
    (tmp_path / "acls.json").write_text(json.dumps(narrower))
    assert core.master.reload_acls() is True
    assert fw.peer.closed and not other.peer.closed and not agent.peer.closed
    refused(Refusal.FORBIDDEN, lambda: core.resubscribe(fw, principal="team-a"))


def test_an_agent_cannot_grow_a_tasks_record_with_made_up_updates(core: CoreHarness) -> None:
    """A rogue agent sends endless RUNNING updates for its own task, each with a new
    update id: past the bound they are acknowledged and dropped, not applied or
    forwarded, and the task's end still comes through."""
    fw, agent, _ = launched(core)
    bound = validation.MAX_UPDATES_PER_TASK
    for n in range(bound + 50):
        core.update(agent, fw, "t1", TaskState.RUNNING, update_id=f"u{n}")
    task = core.master.frameworks[fw.framework_id].tasks["t1"]
    assert len(task.applied_updates) == bound
    assert len(core.updates(fw)) == bound
    dropped = agent.peer.take(msg.AcknowledgeUpdate)
    assert [a.update_id for a in dropped] == [f"u{n}" for n in range(bound, bound + 50)]
    core.update(agent, fw, "t1", TaskState.FINISHED, update_id="end")
    assert [u.state for u in core.updates(fw)] == [TaskState.FINISHED]
    assert core.master.allocator.agent_allocated(agent.agent_id).is_empty()
