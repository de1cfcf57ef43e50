"""Preemption in the master's core (`master/preemptions.py`), driven in virtual time:
the framework is told first, the kill comes after the grace period, the end is marked
REASON_CONTAINER_PREEMPTED, and the freed resources go to the starved role."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from structlog.testing import capture_logs

from mesolite.master import messages as msg
from mesolite.master.preemptions import REASON_PREEMPTED
from mesolite.master.read_model import build_snapshot
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.core import CONFIG, AgentPeer, CoreHarness, FrameworkPeer

GOLD = """
[roles.gold]
guarantee = { cpus = 6 }
"""


def cluster(tmp_path: Path, roles: str = GOLD, **config: object) -> CoreHarness:
    path = tmp_path / "roles.toml"
    path.write_text(roles)
    return CoreHarness(dataclasses.replace(CONFIG, roles_file=path, **config))  # type: ignore[arg-type]


def fill(core: CoreHarness, fw: FrameworkPeer, agent: AgentPeer, n: int) -> list[str]:
    [offer] = core.allocate_for(fw)
    ids = [f"t{i}" for i in range(n)]
    specs = [TaskSpec(i, "sleep inf", Resources(cpus=1, mem=64)) for i in ids]
    core.master.accept(fw.framework_id, [offer.offer_id], specs, refuse_seconds=0)
    for i in ids:
        core.update(agent, fw, i, TaskState.RUNNING)
    core.updates(fw)
    return ids


def cycle(core: CoreHarness, seconds: int) -> int:
    """`seconds` allocation intervals of the process's loop: allocate, then check."""
    preempted = 0
    for _ in range(seconds):
        core.advance(1.0)
        core.master.allocate()
        preempted += core.master.check_preemption()
    return preempted


def test_a_guarantee_is_taken_back_from_a_role_that_came_first(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    ids = fill(core, star, agent, 8)
    gold = core.subscribe("gold", role="gold")
    core.master.check_preemption()  # the loop checks at every cycle: gold is starved from now
    # Below its guarantee, gold waits its min_share_timeout (15 s by default), no more.
    assert cycle(core, 14) == 0
    assert star.peer.of(msg.Preemption) == []
    assert cycle(core, 1) == 6
    told = star.peer.take(msg.Preemption)
    assert {p.task_id for p in told} == set(ids[2:])  # the newest six
    assert {(p.for_role, p.grace_seconds, p.agent_id) for p in told} == {
        ("gold", 5.0, agent.agent_id)
    }
    # Told first: no kill until the grace period is over, and no second plan meanwhile.
    assert agent.peer.of(msg.KillTask) == []
    assert cycle(core, 4) == 0
    assert agent.peer.of(msg.KillTask) == []
    core.advance(1.0)
    kills = agent.peer.take(msg.KillTask)
    assert {k.task_id for k in kills} == set(ids[2:])
    for k in kills:
        core.update(agent, star, k.task_id, TaskState.KILLED)
    ends = [u for u in core.updates(star) if u.state is TaskState.KILLED]
    assert len(ends) == 6 and {u.reason for u in ends} == {REASON_PREEMPTED}
    assert core.master.preemptions["min_share"] == 6
    # The freed CPUs are offered to gold, and kept from the framework they came from.
    offers = core.allocate_for(gold)
    assert sum(o.resources.get_amount("cpus") for o in offers) == 6
    cycle(core, 10)
    assert star.peer.of(msg.Offers) == [] or all(
        o.resources.get_amount("cpus") == 0 for b in star.peer.of(msg.Offers) for o in b.offers
    )
    core.assert_sound()


def test_no_preemption_without_it_or_without_a_guarantee(tmp_path: Path) -> None:
    for core in (cluster(tmp_path, preemption=False), cluster(tmp_path, roles="")):
        agent = core.add_agent("cpus:8;mem:4096")
        star = core.subscribe("first", role="*")
        fill(core, star, agent, 8)
        core.subscribe("gold", role="gold")
        assert cycle(core, 60) == 0
        assert agent.peer.of(msg.KillTask) == []


def test_a_task_the_framework_ends_itself_in_its_grace_is_not_killed(tmp_path: Path) -> None:
    core = cluster(tmp_path, preemption_grace=10.0)
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    fill(core, star, agent, 8)
    core.subscribe("gold", role="gold")
    cycle(core, 16)
    told = star.peer.take(msg.Preemption)
    for p in told:
        core.update(agent, star, p.task_id, TaskState.FINISHED)
    cycle(core, 20)
    assert agent.peer.of(msg.KillTask) == []
    assert core.master.preempting == {}
    core.assert_sound()


def test_fair_share_preemption_waits_its_timeout_and_stops_at_the_share(tmp_path: Path) -> None:
    roles = """
[roles.a]
[roles.b]
fair_share_timeout = 30
fair_share_preemption_threshold = 1.0
"""
    core = cluster(tmp_path, roles)
    agent = core.add_agent("cpus:8;mem:512")
    a = core.subscribe("a", role="a")
    fill(core, a, agent, 8)
    core.subscribe("b", role="b")
    core.master.check_preemption()
    assert cycle(core, 29) == 0
    assert cycle(core, 1) == 4  # down to a's fair half, not below
    assert len(a.peer.take(msg.Preemption)) == 4


def test_offers_mark_what_is_beyond_the_roles_guarantee_as_revocable(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    core.add_agent("cpus:8;mem:4096")
    gold = core.subscribe("gold", role="gold")
    [offer] = core.allocate_for(gold)
    # Guaranteed 6 CPUs and no memory: 2 CPUs and all the memory may be taken back.
    assert offer.revocable == Resources(cpus=2, mem=4096)
    core.master.decline(gold.framework_id, [offer.offer_id], refuse_seconds=0)
    star = core.subscribe("first", role="*")
    core.master.suppress(gold.framework_id)
    [offer] = core.allocate_for(star)
    assert offer.revocable == offer.resources  # no guarantee: all of it


def offered_cpus(fw: FrameworkPeer) -> float:
    return sum(o.resources.get_amount("cpus") for b in fw.peer.take(msg.Offers) for o in b.offers)


def test_the_freed_resources_are_held_from_the_victims_framework_for_the_hold(
    tmp_path: Path,
) -> None:
    # The hold is what keeps preemption from being undone: if the starved role does not
    # take what was freed at once (here it declines and stops asking), the framework the
    # tasks were taken from must not be offered them back before `preemption_hold` is over.
    core = cluster(tmp_path, preemption_hold=30.0)
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    fill(core, star, agent, 8)  # 8 CPUs and 512 MB of 4 GB: the agent keeps free memory
    gold = core.subscribe("gold", role="gold")
    core.master.check_preemption()
    assert cycle(core, 15) == 6
    core.advance(5.0)  # the grace period
    for kill in agent.peer.take(msg.KillTask):
        core.update(agent, star, kill.task_id, TaskState.KILLED)
    core.updates(star)
    offers = core.allocate_for(gold)
    assert sum(o.resources.get_amount("cpus") for o in offers) == 6
    core.master.decline(gold.framework_id, [o.offer_id for o in offers], refuse_seconds=0)
    core.master.suppress(gold.framework_id)
    star.peer.take(msg.Offers)
    # Held: not one of the six CPUs goes back to `first` while the hold lasts...
    cycle(core, 29)
    assert offered_cpus(star) == 0
    # ... and then they do: the hold ends.
    cycle(core, 2)
    assert offered_cpus(star) == 6
    core.assert_sound()


def start(
    core: CoreHarness, fw: FrameworkPeer, agent: AgentPeer, n: int, resources: Resources
) -> None:
    [offer] = core.allocate_for(fw)
    specs = [TaskSpec(f"{fw.info.name}{i}", "sleep inf", resources) for i in range(n)]
    core.master.accept(fw.framework_id, [offer.offer_id], specs, refuse_seconds=0)
    for spec in specs:
        core.update(agent, fw, spec.task_id, TaskState.RUNNING)
    core.updates(fw)


def test_a_role_that_uses_only_cpus_is_not_starved_for_memory(tmp_path: Path) -> None:
    # `a` runs CPU-only tasks and declared nothing. Its fair share of memory must be 0,
    # as the Fair Scheduler caps each resource's share at the demand for it: counting
    # memory it never uses (half of it, beside `v`, since `d` declared CPUs only) made
    # its fair share 0.5 of the cluster against the 1/3 it holds, and it took two of
    # `v`'s memory-heavy tasks for CPUs beyond its share of them.
    roles = """
[roles.a]
fair_share_timeout = 10
fair_share_preemption_threshold = 1.0
[roles.v]
[roles.d]
"""
    core = cluster(tmp_path, roles)
    agent = core.add_agent("cpus:12;mem:1000")
    v = core.subscribe("v", role="v")
    start(core, v, agent, 4, Resources(cpus=1, mem=250))  # all the memory
    a = core.subscribe("a", role="a")
    start(core, a, agent, 4, Resources(cpus=1))
    d = core.subscribe("d", role="d")
    start(core, d, agent, 4, Resources(cpus=1))
    core.master.declare_demand(d.framework_id, [(Resources(cpus=1), 1)])
    states = core.master.role_states()
    assert states["a"].fair_share == Resources(cpus=4)
    assert states["v"].fair_share == Resources(cpus=4, mem=1000)
    assert states["d"].fair_share == Resources(cpus=4)
    core.master.check_preemption()
    assert cycle(core, 20) == 0
    assert v.peer.of(msg.Preemption) == []
    core.assert_sound()


# The tests below each pin what a surviving mutant of `make mutation` broke without any
# test failing (docs/mutation/equivalent.md lists the ones that change nothing).


def gold_arrives(core: CoreHarness) -> tuple[FrameworkPeer, AgentPeer, list[str], FrameworkPeer]:
    """`first` (role *) fills 8 CPUs, then gold (guaranteed 6) arrives and the check
    sees it starved: (first, the agent, first's task ids, gold)."""
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    ids = fill(core, star, agent, 8)
    gold = core.subscribe("gold", role="gold")
    core.master.check_preemption()
    return star, agent, ids, gold


def told_and_killed(core: CoreHarness, grace: float = 5.0) -> tuple[FrameworkPeer, AgentPeer]:
    """Gold arrives; after its timeout six tasks are told; the grace passes and the
    agent is told to kill them."""
    star, agent, _, _ = gold_arrives(core)
    assert cycle(core, 15) == 6
    core.advance(grace)
    return star, agent


def test_preemption_is_logged_with_the_task_and_the_role_it_is_for(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    with capture_logs() as logs:
        star, agent = told_and_killed(core)
        kill = agent.peer.take(msg.KillTask)[0]
        core.update(agent, star, kill.task_id, TaskState.KILLED)
    ids = {"framework_id": star.framework_id, "task_id": kill.task_id}
    where = {**ids, "agent_id": agent.agent_id, "for_role": "gold", "kind": "min_share"}
    told = [e for e in logs if e["event"] == "preempting task" and e["task_id"] == kill.task_id]
    assert told == [{**where, "role": "*", "grace_seconds": 5.0, "log_level": "info",
                     "event": "preempting task"}]  # fmt: skip
    ended = [e for e in logs if e["event"] == "task preempted"]
    assert ended == [{**where, "state": "TASK_KILLED", "log_level": "info",
                      "event": "task preempted"}]  # fmt: skip


def test_the_state_shows_how_long_a_task_has_left_of_its_grace(tmp_path: Path) -> None:
    core = cluster(tmp_path, preemption_grace=10.0)
    gold_arrives(core)
    cycle(core, 15)
    core.advance(4.0)
    marked = {t.id: t.preempting for t in build_snapshot(core.master).tasks if t.preempting}
    assert len(marked) == 6
    assert {(p.for_role, p.kind, p.kill_in) for p in marked.values()} == {
        ("gold", "min_share", 6.0)
    }


def test_reading_role_states_starts_no_wait_only_the_check_does(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    fill(core, star, agent, 8)
    core.subscribe("gold", role="gold")
    assert core.master.role_states()["gold"].below_guarantee_for is None  # not tracked yet
    core.advance(15.0)
    assert core.master.check_preemption() == 0  # its wait starts now, not at the read
    core.advance(10.0)
    assert core.master.role_states()["gold"].below_guarantee_for == 10.0  # read, tracked
    core.advance(5.0)
    assert core.master.check_preemption() == 6


def test_a_wait_ends_when_the_role_is_no_longer_starved_and_starts_again_after(
    tmp_path: Path,
) -> None:
    core = cluster(tmp_path)
    star, agent, ids, gold = gold_arrives(core)
    core.advance(10.0)
    # `first` ends six tasks itself: gold is given their CPUs, and is not starved.
    for task_id in ids[2:]:
        core.update(agent, star, task_id, TaskState.FINISHED)
    [offer] = core.allocate_for(gold)
    specs = [TaskSpec(f"g{i}", "sleep inf", Resources(cpus=1, mem=64)) for i in range(6)]
    core.master.accept(gold.framework_id, [offer.offer_id], specs, refuse_seconds=0)
    for spec in specs:
        core.update(agent, gold, spec.task_id, TaskState.RUNNING)
    assert core.master.role_states()["gold"].below_guarantee_for is None  # not starved
    assert core.master.check_preemption() == 0
    core.advance(10.0)
    # Its tasks end and `first` takes the CPUs again: gold waits a whole timeout anew.
    for spec in specs:
        core.update(agent, gold, spec.task_id, TaskState.FINISHED)
    core.master.suppress(gold.framework_id)
    start(core, star, agent, 6, Resources(cpus=1, mem=64))
    core.master.revive(gold.framework_id)
    assert core.master.check_preemption() == 0  # starved again from now
    assert cycle(core, 14) == 0
    assert cycle(core, 1) == 6
    core.assert_sound()


def test_a_preempted_tasks_end_starts_the_wait_of_the_role_it_was_for_again(
    tmp_path: Path,
) -> None:
    # The role is given its chance: while still starved (its offers are not yet tasks),
    # its wait counts from the end of the last task taken for it.
    core = cluster(tmp_path)
    star, agent = told_and_killed(core)
    for kill in agent.peer.take(msg.KillTask):
        core.update(agent, star, kill.task_id, TaskState.KILLED)
    assert core.master.role_states()["gold"].below_guarantee_for == 0.0
    core.advance(3.0)
    assert core.master.role_states()["gold"].below_guarantee_for == 3.0


def test_a_task_that_was_not_preempted_holds_nothing_back(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    agent = core.add_agent("cpus:8;mem:4096")
    star = core.subscribe("first", role="*")
    [task_id, *_] = fill(core, star, agent, 8)
    core.update(agent, star, task_id, TaskState.FINISHED)
    core.updates(star)
    [offer] = core.allocate_for(star)  # at once: no hold after an ordinary end
    assert offer.resources.get_amount("cpus") == 1


def test_only_a_preempted_task_killed_is_marked_preempted(tmp_path: Path) -> None:
    core = cluster(tmp_path, preemption_grace=10.0)
    star, agent, ids, _ = gold_arrives(core)
    cycle(core, 15)
    told = [p.task_id for p in star.peer.take(msg.Preemption)]
    # One told task ends by itself, another is killed: only the kill is a preemption.
    core.update(agent, star, told[0], TaskState.FINISHED)
    core.update(agent, star, told[1], TaskState.KILLED)
    # A task not told, killed (its framework asked), is an ordinary kill.
    core.update(agent, star, ids[0], TaskState.KILLED)
    ends = {u.task_id: u for u in core.updates(star) if u.state.is_terminal}
    assert (ends[told[0]].reason, ends[told[0]].message) == ("", "")
    assert ends[told[1]].reason == REASON_PREEMPTED
    assert ends[told[1]].message == "preempted for role gold (min_share)"
    assert (ends[ids[0]].reason, ends[ids[0]].message) == ("", "")


def test_role_states_carry_each_roles_settings(tmp_path: Path) -> None:
    roles = """
[roles.gold]
guarantee = { cpus = 2 }
weight = { cpus = 3 }
[roles.b]
fair_share_timeout = 30
fair_share_preemption_threshold = 0.8
"""
    core = cluster(tmp_path, roles)
    core.add_agent("cpus:8;mem:4096")
    core.subscribe("gold", role="gold")
    core.subscribe("b", role="b")
    core.subscribe("first", role="*")
    states = core.master.role_states()
    weights = states["gold"].resource_weights
    assert weights is not None and weights["cpus"] == 3.0
    assert (states["gold"].min_share_timeout, states["gold"].fair_share_timeout) == (15.0, None)
    assert (states["b"].threshold, states["b"].fair_share_timeout) == (0.8, 30.0)
    assert states["b"].min_share_timeout is None  # no guarantee
    assert states["*"].threshold == 0.5


def test_revocable_is_what_goes_beyond_the_guarantee_given_what_the_role_holds(
    tmp_path: Path,
) -> None:
    core = cluster(tmp_path)
    agent = core.add_agent("cpus:8;mem:4096")
    gold = core.subscribe("gold", role="gold")
    [offer] = core.allocate_for(gold)
    specs = [TaskSpec(f"g{i}", "sleep inf", Resources(cpus=1)) for i in range(4)]
    core.master.accept(gold.framework_id, [offer.offer_id], specs, refuse_seconds=0)
    for spec in specs:
        core.update(agent, gold, spec.task_id, TaskState.RUNNING)
    # Gold holds 4 of its 6 guaranteed CPUs: of the 4 offered, 2 are revocable.
    [offer] = core.allocate_for(gold)
    assert offer.revocable == Resources(cpus=2, mem=4096)


def test_shutting_down_cancels_the_grace_periods(tmp_path: Path) -> None:
    core = cluster(tmp_path)
    _, agent, _, _ = gold_arrives(core)
    cycle(core, 15)
    assert core.timers.pending() > 0
    core.master.shutdown()
    assert core.timers.pending() == 0  # every grace timer cancelled, none left to fire
    core.advance(10.0)
    assert agent.peer.of(msg.KillTask) == []


def test_a_guarantee_is_taken_back_only_as_far_as_the_role_declared_it_needs(
    tmp_path: Path,
) -> None:
    # Gold is guaranteed 6 CPUs but declares it waits for 2 tasks of 1 CPU: as the Fair
    # Scheduler caps min-share starvation at the demand, 2 tasks are taken back, not 6
    # (4 CPUs taken from `first` for nobody).
    core = cluster(tmp_path)
    star, _, _, gold = gold_arrives(core)
    core.master.declare_demand(gold.framework_id, [(Resources(cpus=1, mem=64), 2)])
    assert cycle(core, 15) == 2
    assert len(star.peer.take(msg.Preemption)) == 2


def told_then_away(core: CoreHarness) -> tuple[FrameworkPeer, AgentPeer, list[str], list[str]]:
    """Gold arrives, six of first's tasks are told, then their agent goes away: (first,
    the agent, first's task ids, those told)."""
    star, agent, ids, _ = gold_arrives(core)
    assert cycle(core, 15) == 6
    told = sorted(p.task_id for p in star.peer.take(msg.Preemption))
    core.master.disconnect_agent(agent.agent_id, agent.peer)
    return star, agent, ids, told


def come_back(
    core: CoreHarness, star: FrameworkPeer, agent: AgentPeer, ids: list[str]
) -> AgentPeer:
    specs = [TaskSpec(i, "sleep inf", Resources(cpus=1, mem=64)) for i in ids]
    return core.add_agent(
        "cpus:8;mem:4096", agent.agent_id, tuple(core.running(star, s) for s in specs)
    )


def test_a_task_whose_grace_ended_while_its_agent_was_away_is_killed_when_it_is_back(
    tmp_path: Path,
) -> None:
    core = cluster(tmp_path)
    star, agent, ids, told = told_then_away(core)
    core.advance(5.0)  # the grace ends while the agent is away: no one to tell
    assert agent.peer.take(msg.KillTask) == []
    with capture_logs() as logs:
        back = come_back(core, star, agent, ids)
    kills = back.peer.take(msg.KillTask)
    assert sorted((k.framework_id, k.task_id) for k in kills) == [
        (star.framework_id, t) for t in told
    ]
    logged = [e for e in logs if e["event"] == "killing preempted task"]
    assert sorted(logged, key=lambda e: str(e["task_id"])) == [
        {
            "event": "killing preempted task",
            "framework_id": star.framework_id,
            "task_id": t,
            "agent_id": agent.agent_id,
            "for_role": "gold",
            "log_level": "info",
        }
        for t in told
    ]
    for task_id in told:
        core.update(back, star, task_id, TaskState.KILLED)
    assert all(u.reason == REASON_PREEMPTED for u in core.updates(star) if u.state.is_terminal)
    assert core.master.preempting == {}
    core.assert_sound()


def test_a_task_still_in_its_grace_when_its_agent_is_back_is_killed_only_after(
    tmp_path: Path,
) -> None:
    core = cluster(tmp_path)
    star, agent, ids, told = told_then_away(core)
    core.advance(1.0)  # back within the grace
    back = come_back(core, star, agent, ids)
    assert back.peer.take(msg.KillTask) == []
    core.advance(4.0)  # the grace ends
    assert sorted(k.task_id for k in back.peer.take(msg.KillTask)) == told
