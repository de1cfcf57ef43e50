"""Preemption in the master's core (`master/preemptions.py`), driven in virtual time:
the framework is told first, the kill comes after the grace period, the end is marked
REASON_CONTAINER_PREEMPTED, and the freed resources go to the starved role."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mesolite.master import messages as msg
from mesolite.master.preemptions import REASON_PREEMPTED
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
