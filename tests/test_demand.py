"""Demand (`master/demand.py`): declared through the core, bounded, capping fair shares."""

from __future__ import annotations

import pytest

from mesolite.master import messages as msg
from mesolite.master.errors import CallRejected
from mesolite.master.fair_levels import fair_levels
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
