"""Demand (`master/demand.py`): declared through the core, bounded, capping fair shares."""

from __future__ import annotations

import pytest

from mesolite.master import messages as msg
from mesolite.master.errors import CallRejected
from mesolite.master.fair_levels import fair_levels
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.core import CoreHarness


def test_a_declared_demand_steers_offers_and_caps_the_roles_fair_share() -> None:
    core = CoreHarness()
    core.add_agent("cpus:4;mem:4096")
    big = core.subscribe("big", role="big")
    small = core.subscribe("small", role="small")
    core.master.declare_demand(big.framework_id, [(Resources(cpus=8), 3)])
    assert core.allocate_for(big) == []  # nothing it waits for fits
    assert len(small.peer.take(msg.Offers)) == 1
    # Its role's demand: 24 CPUs (3 x 8) and no memory; small's is unknown (uncapped).
    assert core.master.role_demands() == {"big": Resources(cpus=24)}
    core.master.declare_demand(small.framework_id, [(Resources(cpus=1, mem=128), 1)])
    demands = core.master.role_demands()
    assert demands["small"] == Resources(cpus=1, mem=128)
    states = core.master.role_states()
    assert states["small"].fair_share == Resources(cpus=1, mem=128)  # capped by its demand
    assert states["big"].fair_share.get_amount("cpus") == 3  # the rest of the CPUs
    core.assert_sound()


@pytest.mark.parametrize(
    ("shapes", "problem"),
    [
        ([(Resources(cpus=1), 1)] * 65, "at most 64"),
        ([(Resources(cpus=1), -1)], "count"),
        ([(Resources(cpus=1), 2_000_000)], "count"),
        ([(Resources(), 1)], "name some"),
    ],
)
def test_a_bad_demand_is_refused_and_changes_nothing(
    shapes: list[tuple[Resources, int]], problem: str
) -> None:
    core = CoreHarness()
    fw = core.subscribe("f")
    before = core.state()
    with pytest.raises(CallRejected, match=problem):
        core.master.declare_demand(fw.framework_id, shapes)
    assert core.state() == before
    assert core.master.frameworks[fw.framework_id].demand is None


def test_fair_levels_unchanged_without_demands() -> None:
    from mesolite.master.fair_share import ShareInput

    inputs = {"a": ShareInput(), "b": ShareInput()}
    total = Resources(cpus=4)
    assert fair_levels(inputs, total, {"a", "b"}, {}) == fair_levels(inputs, total, {"a", "b"})


def test_a_roles_demand_sums_its_frameworks_and_needs_every_one_declared() -> None:
    core = CoreHarness()
    agent = core.add_agent("cpus:4;mem:4096")
    # A torn-down framework whose task is still being killed comes first: it counts
    # for nothing, and the others after it still count.
    gone = core.subscribe("gone", role="r3")
    [offer] = core.allocate_for(gone)
    core.master.accept(
        gone.framework_id, [offer.offer_id], [TaskSpec("g", "sleep inf", Resources(cpus=1))], 0
    )
    core.update(agent, gone, "g", TaskState.RUNNING)
    core.master.declare_demand(gone.framework_id, [(Resources(cpus=1), 2)])
    core.master.teardown(gone.framework_id)
    assert core.master.frameworks[gone.framework_id].removing
    undeclared = core.subscribe("u", role="r1")  # before the declared ones
    d1 = core.subscribe("d1", role="r2")
    d2 = core.subscribe("d2", role="r2")
    declared = core.subscribe("x", role="r1")
    core.master.declare_demand(d1.framework_id, [(Resources(cpus=1), 2)])
    core.master.declare_demand(d2.framework_id, [(Resources(mem=100), 3)])
    core.master.declare_demand(declared.framework_id, [(Resources(cpus=2), 1)])
    # r1 has a framework that declared nothing (`u`): its demand is unknown, uncapped.
    assert undeclared.framework_id in core.master.frameworks
    assert core.master.role_demands() == {"r2": Resources(cpus=2, mem=300)}


def test_state_shows_the_demand_capped_fair_shares_that_preemption_measures() -> None:
    """/state (the read model every view reads) and preemption agree: one computation,
    capped by declared demand and confined to the resources an undeclared role holds."""
    from mesolite.master.read_model import build_snapshot

    core = CoreHarness()
    agent = core.add_agent("cpus:8;mem:8192")
    cpu_only = core.subscribe("cpu-only", role="cpu-only")
    [offer] = core.allocate_for(cpu_only)
    core.master.accept(
        cpu_only.framework_id, [offer.offer_id], [TaskSpec("c", "sleep inf", Resources(cpus=2))], 0
    )
    core.update(agent, cpu_only, "c", TaskState.RUNNING)
    declared = core.subscribe("declared", role="declared")
    core.master.declare_demand(declared.framework_id, [(Resources(cpus=1, mem=1024), 2)])
    state = {r.path: r for r in build_snapshot(core.master).roles}
    # The declared role's share is its demand; the CPU-only role, which declared
    # nothing, gets the other CPUs and no memory.
    assert state["declared"].instantaneous_fair_share == Resources(cpus=2, mem=2048)
    assert state["cpu-only"].instantaneous_fair_share == Resources(cpus=6)
    for path, role_state in core.master.role_states().items():
        assert state[path].instantaneous_fair_share == role_state.fair_share
    core.assert_sound()
