"""Reservations (master/reservations.py): with packing, an agent held for a large task
shape that fits nowhere yet, so what frees there accumulates for it.

The scene of most tests is the dynamic-sharing experiment's phase 2: agents of <4 CPUs,
14 GB> full of 1-CPU tasks of `small`, and `big`, first in order, waiting for tasks of
<2 CPUs, 4 GB>. Tasks end one at a time and `small` takes whatever it is offered.
tests/test_packing.py's state machine checks the bounds and that a reservation is only
held for a declared shape, under random churn; the simulator's phase 2 is at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from mesolite.lab.sim.workload import load_workload
from mesolite.master.allocator import Allocation, Allocator, RoleSettings
from mesolite.master.master import Master
from mesolite.master.read_model import build_snapshot
from mesolite.master.reservations import (
    Reservation,
    ReservationEvent,
    cluster_bound,
    shortfall,
    surplus,
)
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import ReservationSnapshot
from tests.scraping import value
from tests.simulate import FakeClock
from tests.support.core import CONFIG, CoreHarness
from tests.support.sim_shares import mean_shares
from tests.support.walk_order import seed_walking, seed_walking_first

AGENT = Resources(cpus=4, mem=14336)
BIG = Resources(cpus=2, mem=4096)
SMALL = Resources(cpus=1, mem=3072)
ROOT = Path(__file__).resolve().parent.parent


class Scene:
    """`agents` agents, each full with four of `small`'s tasks; `big` has nothing."""

    def __init__(
        self,
        agents: int = 1,
        *,
        reservations: bool = True,
        seed: int = 0,
        clock: FakeClock | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.allocator = Allocator(self.clock, seed=seed, packing=True, reservations=reservations)
        self.tasks: dict[str, list[tuple[str, Resources]]] = {}  # agent -> (framework, res)
        for i in range(agents):
            self.allocator.add_agent(f"a{i}", AGENT)
            self.tasks[f"a{i}"] = []
        self.allocator.add_framework("big", "r1")
        self.allocator.add_framework("small", "r2")
        self.allocator.set_demand("big", [(BIG, 100)])
        self.allocator.set_demand("small", [(SMALL, 1000)])
        for agent_id in self.tasks:
            for _ in range(4):
                self.start("small", agent_id, SMALL)

    def start(self, framework_id: str, agent_id: str, resources: Resources) -> None:
        self.allocator.grant(framework_id, agent_id, resources)
        self.tasks[agent_id].append((framework_id, resources))

    def end_one(self, agent_id: str) -> None:
        """The oldest task on the agent ends."""
        framework_id, resources = self.tasks[agent_id].pop(0)
        self.allocator.recover(framework_id, agent_id, resources)

    def cycle(self) -> list[Allocation]:
        """One cycle; every offer is launched whole (as tasks of the offered shapes)."""
        decisions = self.allocator.allocate()
        for d in decisions:
            self.tasks[d.agent_id].append((d.framework_id, d.resources))
        return decisions

    def events(self) -> list[tuple[str, str, str | None]]:
        return [
            (e.reservation.framework_id, e.reservation.agent_id, e.outcome)
            for e in self.allocator.take_reservation_events()
        ]

    def reserved(self) -> dict[str, str]:
        return {r.agent_id: r.framework_id for r in self.allocator.reservations()}


def offered_to(decisions: list[Allocation], framework_id: str) -> list[Allocation]:
    return [d for d in decisions if d.framework_id == framework_id]


def round_robin(agents: int) -> Iterator[str]:
    while True:
        yield from (f"a{i}" for i in range(agents))


# -- the large shape gets its task ------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_a_large_shape_behind_a_stream_of_small_ones_gets_its_task_within_a_bound(
    seed: int,
) -> None:
    # Four agents, one small task ending at a time on each in turn; the cluster bound
    # (4 agents: 1) lets big hold one agent. It is reserved at the first end (the agent
    # closest to fitting: the only one with a CPU free), the three ends elsewhere go to
    # small, and the second end on the reserved agent completes big's task: by the 5th
    # end, whatever the walk's order. Without reservations small takes every CPU.
    for reservations, bound in ((True, 5), (False, None)):
        scene = Scene(agents=4, reservations=reservations, seed=seed)
        got_at = None
        ends = round_robin(4)
        for n in range(1, 41):
            scene.end_one(next(ends))
            decisions = scene.cycle()
            if offered_to(decisions, "big"):
                assert offered_to(decisions, "big") == [Allocation("big", "a0", BIG)]
                got_at = n
                break
            if reservations:
                assert scene.reserved() == {"a0": "big"}, n
        assert got_at == bound, (reservations, seed)


def test_the_reserved_agents_freed_resources_are_not_offered_to_those_behind() -> None:
    scene = Scene()
    scene.end_one("a0")  # <1 CPU, 5 GB> free: big's <2 CPUs, 4 GB> does not fit
    assert scene.cycle() == []  # held for big; small is not offered the CPU
    assert scene.events() == [("big", "a0", None)]
    # What the shape does not need (1 GB beyond its 4) is still offered behind it, to a
    # framework that declared nothing: it is offered it whole.
    scene.allocator.add_framework("any", "r3")
    scene.start("any", "a0", Resources(mem=32))  # a share: behind big in order
    assert scene.cycle() == [Allocation("any", "a0", Resources(mem=1024 - 32))]
    scene.end_one("a0")  # a second CPU: the task fits, and is offered to big
    assert scene.cycle() == [
        Allocation("big", "a0", BIG),
        Allocation("any", "a0", Resources(mem=3072)),  # what is left, whole
    ]
    assert scene.events() == [("big", "a0", "fitted")]


def test_a_framework_ahead_of_the_reserver_is_offered_what_is_free_there() -> None:
    scene = Scene()
    scene.end_one("a0")
    scene.cycle()
    assert scene.reserved() == {"a0": "big"}
    # low holds nothing and is ahead of big (a lower share): DRF serves it first.
    scene.start("big", "a0", Resources(mem=32))  # big's share rises above low's 0
    scene.allocator.add_framework("low", "r0")
    scene.allocator.set_demand("low", [(SMALL, 1)])
    assert scene.cycle() == [Allocation("low", "a0", SMALL)]
    assert scene.reserved() == {"a0": "big"}  # still held: big is behind low, not ended


def test_no_reservation_without_a_declared_demand_nor_without_packing() -> None:
    # One CPU frees. Without a demand big is offered it whole (and may decline it); with
    # a demand but without packing, small is: nothing is ever held.
    for demand, packing in ((False, True), (True, False)):
        clock = FakeClock()
        allocator = Allocator(clock, packing=packing)
        allocator.add_agent("a0", AGENT)
        allocator.add_framework("big", "r1")
        allocator.add_framework("small", "r2")
        allocator.grant("small", "a0", AGENT - Resources(cpus=1, mem=5120))
        if demand:
            allocator.set_demand("big", [(BIG, 1)])
        got = allocator.allocate()
        assert list(allocator.reservations()) == []
        assert allocator.take_reservation_events() == []
        assert got == [
            Allocation("small" if demand else "big", "a0", Resources(cpus=1, mem=5120))
        ], (demand, packing)


def test_reservations_are_bounded_per_framework_and_over_the_cluster() -> None:
    # 80 agents, one CPU free on each: cluster bound 10, per framework 8.
    clock = FakeClock()
    allocator = Allocator(clock, packing=True)
    for i in range(80):
        allocator.add_agent(f"a{i:02}", AGENT)
        allocator.add_framework(f"small{i}", "r9")
        allocator.grant(f"small{i}", f"a{i:02}", AGENT - Resources(cpus=1, mem=5120))
        allocator.suppress(f"small{i}")
    assert cluster_bound(80) == 10 and allocator.max_reservations == 8
    allocator.add_framework("big1", "r1")
    allocator.set_demand("big1", [(BIG, 100)])
    assert allocator.allocate() == []
    assert len([r for r in allocator.reservations() if r.framework_id == "big1"]) == 8
    allocator.grant("big1", "a00", Resources(mem=32))
    allocator.add_framework("big2", "r2")  # now first: no share at all
    allocator.set_demand("big2", [(BIG, 100)])
    allocator.allocate()
    by = [r.framework_id for r in allocator.reservations()]
    assert (by.count("big1"), by.count("big2")) == (8, 2)
    allocator.grant("big2", "a00", Resources(mem=32))
    allocator.add_framework("big3", "r3")  # now first, and would reserve
    allocator.set_demand("big3", [(BIG, 100)])
    allocator.allocate()
    by = [r.framework_id for r in allocator.reservations()]
    assert (by.count("big1"), by.count("big2"), by.count("big3")) == (8, 2, 0)


def test_no_more_reservations_than_tasks_waited_for() -> None:
    scene = Scene(agents=16)  # the cluster's bound is 2
    scene.allocator.set_demand("big", [(BIG, 1)])
    for i in range(16):
        scene.end_one(f"a{i}")
    scene.cycle()
    assert len(scene.reserved()) == 1


def test_as_many_reservations_as_tasks_waited_for_within_the_bounds() -> None:
    # 16 agents (bound 2), one CPU free on each: big's two tasks get two agents; they
    # wait for nothing more in a later cycle.
    scene = Scene(agents=24)  # bound 3
    scene.allocator.set_demand("big", [(BIG, 2)])
    for i in range(24):
        scene.end_one(f"a{i}")
    scene.cycle()
    assert len(scene.reserved()) == 2
    scene.cycle()
    assert len(scene.reserved()) == 2
    # Three tasks, two agents reserved; when eight more agents come (bound 3), the
    # third task gets one more.
    scene = Scene(agents=16)
    scene.allocator.set_demand("big", [(BIG, 3)])
    for i in range(16):
        scene.end_one(f"a{i}")
    scene.cycle()
    assert len(scene.reserved()) == 2
    full_agents(scene, 16, 24)
    scene.cycle()
    assert len(scene.reserved()) == 3
    # Two tasks waited for, two bounded reservations per framework, held over cycles.
    scene = Scene(agents=24, clock=FakeClock())
    scene.allocator.max_reservations = 1
    scene.allocator.set_demand("big", [(BIG, 5)])
    scene.end_one("a0")
    scene.cycle()
    scene.end_one("a1")
    scene.cycle()
    assert len(scene.reserved()) == 1


def test_each_shape_gets_its_own_reserved_agents() -> None:
    # Sixteen agents alike (bound 2): one for each of big's two shapes, both fitting
    # nowhere; the larger one's agents rank after every agent of the smaller.
    larger = Resources(cpus=3, mem=4096)
    scene = Scene(agents=16)
    scene.allocator.set_demand("big", [(BIG, 1), (larger, 1)])
    for i in range(16):
        scene.end_one(f"a{i}")
    scene.cycle()
    assert sorted(str(r.shape) for r in scene.allocator.reservations()) == sorted(
        [str(BIG), str(larger)]
    )


def full_agents(scene: Scene, first: int, last: int) -> None:
    for i in range(first, last):
        scene.allocator.add_agent(f"a{i}", AGENT)
        scene.tasks[f"a{i}"] = []
        for _ in range(4):
            scene.start("small", f"a{i}", SMALL)


def test_a_shape_reserved_for_is_not_waited_for_again() -> None:
    # 8 agents (bound 1): big's first shape gets a0... then its task fits there, and
    # eight more agents come (bound 2): the other shape, which fits nowhere, gets one.
    larger = Resources(cpus=3, mem=4096)
    scene = Scene(agents=8)
    scene.allocator.set_demand("big", [(BIG, 1), (larger, 1)])
    for i in range(8):
        scene.end_one(f"a{i}")
    scene.cycle()
    [(agent_id, _)] = scene.reserved().items()
    full_agents(scene, 8, 16)
    scene.end_one(agent_id)  # BIG fits on its reserved agent
    scene.cycle()
    assert [str(r.shape) for r in scene.allocator.reservations()] == [str(larger)]


def test_a_reserver_offered_its_shape_elsewhere_gets_no_second_on_its_agent() -> None:
    # big waits for one BIG task and small ones; a0 is reserved for BIG. Then BIG fits
    # a1 (walked first) and a0: it is offered on a1, and on a0 only small ones.
    tiny = Resources(cpus=1, mem=512)
    agents = {"a0": AGENT, "a1": AGENT}
    seed = seed_walking(agents, "a1", "a0")
    scene = Scene(agents=2, seed=seed)
    scene.allocator.set_demand("big", [(BIG, 1)])
    scene.end_one("a0")
    scene.cycle()
    assert scene.reserved() == {"a0": "big"}
    scene.allocator.set_demand("big", [(BIG, 1), (tiny, 5)])
    for agent_id in ("a0", "a1", "a1"):
        scene.end_one(agent_id)
    got = {d.agent_id: d.resources for d in offered_to(scene.cycle(), "big")}
    assert got["a1"] == BIG and not got["a0"].contains(BIG), got


def test_no_reservation_for_a_shape_beyond_the_roles_limit() -> None:
    scene = Scene()
    scene.allocator.configure_roles({"r1": RoleSettings(limit={"cpus": 1})})
    scene.end_one("a0")
    assert scene.cycle() == [Allocation("small", "a0", SMALL)]
    assert scene.reserved() == {}


def test_a_framework_its_roles_limit_keeps_from_any_offer_reserves_nothing() -> None:
    allocator = Allocator(FakeClock(), packing=True)
    allocator.add_agent("a0", AGENT)
    allocator.configure_roles({"r1": RoleSettings(limit={"cpus": 0, "mem": 0})})
    allocator.add_framework("big", "r1")
    allocator.set_demand("big", [(BIG, 1)])
    assert allocator.allocate() == []
    assert list(allocator.reservations()) == []


@pytest.mark.parametrize("why", ["filtered", "too_small", "filter_just_expired"])
def test_an_agent_the_framework_cannot_hold_is_passed_over_for_the_next(why: str) -> None:
    # 16 agents with one CPU free each (bound 2), x first in the walk's order: x is not
    # reserved when big declined it, or x's total cannot hold big's shape; the next
    # agents are. A filter that expires at this very time no longer counts.
    free = Resources(cpus=1, mem=5120)
    x_total = Resources(cpus=1.5, mem=8192) if why == "too_small" else AGENT
    agents = {"x": x_total, **{f"a{i}": AGENT for i in range(15)}}
    clock = FakeClock()
    allocator = Allocator(clock, seed=seed_walking_first(agents, "x"), packing=True)
    for agent_id, total in agents.items():
        allocator.add_agent(agent_id, total)
        allocator.add_framework(f"s{agent_id}", "r2")
        allocator.grant(f"s{agent_id}", agent_id, total - free)
        allocator.suppress(f"s{agent_id}")
    allocator.add_framework("big", "r1")
    if why != "too_small":
        allocator.grant("big", "x", free)
        allocator.recover("big", "x", free, refuse_seconds=5)
        if why == "filter_just_expired":
            clock.now = 5.0
    allocator.set_demand("big", [(BIG, 5)])
    allocator.allocate()
    reserved = {r.agent_id for r in allocator.reservations()}
    assert len(reserved) == 2
    assert ("x" in reserved) == (why == "filter_just_expired")


def test_an_agent_every_framework_passed_over_can_be_reserved() -> None:
    # a0 (a CPU free) is reserved; a1 (full) is passed over by everyone: big and the
    # small ones cannot use it, `any` declined it. a0's reservation times out and a0 is
    # barred for big: a1 is reserved now, skipped as it is by the walk.
    clock = FakeClock()
    allocator = Allocator(clock, packing=True)
    for agent_id, free in (("a0", Resources(cpus=1, mem=5120)), ("a1", Resources(mem=2048))):
        allocator.add_agent(agent_id, AGENT)
        allocator.add_framework(f"s{agent_id}", "r2")
        allocator.set_demand(f"s{agent_id}", [(SMALL, 1)])
        allocator.grant(f"s{agent_id}", agent_id, AGENT - free)
    allocator.add_framework("big", "r1")
    allocator.set_demand("big", [(BIG, 5)])
    allocator.add_framework("any", "r3")  # declared nothing
    allocator.grant("any", "a1", Resources(mem=2048))
    allocator.recover("any", "a1", Resources(mem=2048), refuse_seconds=1000)
    allocator.allocate()
    assert [r.agent_id for r in allocator.reservations()] == ["a0"]
    clock.now = allocator.reservation_timeout
    allocator.allocate()
    assert [r.agent_id for r in allocator.reservations()] == ["a1"]


def test_an_agent_reserved_with_nothing_free_is_passed_for_the_next() -> None:
    # a0 is reserved, then what was free there is taken; a task ends on a1: small is
    # offered there, whichever agent the cycle visits first.
    for seed in range(6):
        clock = FakeClock()
        allocator = Allocator(clock, seed=seed, packing=True)
        allocator.add_agent("a0", AGENT)
        allocator.add_agent("a1", AGENT)
        allocator.add_framework("big", "r1")
        allocator.add_framework("small", "r2")
        allocator.add_framework("x", "r3")
        allocator.suppress("x")
        allocator.set_demand("big", [(BIG, 5)])
        allocator.set_demand("small", [(SMALL, 5)])
        free = Resources(cpus=1, mem=5120)
        allocator.grant("small", "a0", AGENT - free)
        allocator.grant("small", "a1", AGENT)
        assert allocator.allocate() == []
        assert [r.agent_id for r in allocator.reservations()] == ["a0"]
        allocator.grant("x", "a0", free)
        allocator.recover("small", "a1", SMALL)
        assert allocator.allocate() == [Allocation("small", "a1", SMALL)], seed


def test_a_reserver_offered_another_of_its_shapes_keeps_its_reservation() -> None:
    tiny = Resources(cpus=0.5, mem=512)
    scene = reserved_scene()
    scene.allocator.set_demand("big", [(BIG, 100), (tiny, 1)])
    assert scene.cycle() == [Allocation("big", "a0", tiny)]
    assert scene.reserved() == {"a0": "big"} and scene.events() == []


def test_a_reservation_of_a_last_task_ends_when_it_fits() -> None:
    scene = reserved_scene()
    scene.allocator.set_demand("big", [(BIG, 1)])
    scene.end_one("a0")
    assert offered_to(scene.cycle(), "big") == [Allocation("big", "a0", BIG)]
    assert scene.events() == [("big", "a0", "fitted")] and scene.reserved() == {}


def test_reservations_that_time_out_together_end_together() -> None:
    scene = Scene(agents=16)
    for i in range(16):
        scene.end_one(f"a{i}")
    scene.cycle()
    assert len(scene.reserved()) == 2
    scene.events()
    scene.clock.now = scene.allocator.reservation_timeout
    scene.cycle()
    assert [outcome for _, _, outcome in scene.events()][:2] == ["timeout", "timeout"]


def test_a_filter_that_expires_as_the_cycle_starts_keeps_the_reservation() -> None:
    scene = reserved_scene()
    scene.allocator.hold("big", "a0", 5)
    scene.clock.now = 5.0
    scene.cycle()
    assert scene.reserved() == {"a0": "big"} and scene.events() == []


class TickingClock(FakeClock):
    """Time moves on by 1 s each time it is read: a cycle reads it once, at its start."""

    def __call__(self) -> float:
        now = self.now
        self.now += 1.0
        return now


@pytest.mark.parametrize("end", ["fitted", "timeout", "filtered"])
def test_a_reservation_ends_at_the_time_of_the_cycle_that_ends_it(end: str) -> None:
    scene = Scene(clock=TickingClock())
    scene.end_one("a0")
    scene.cycle()
    [made] = scene.allocator.take_reservation_events()
    since = made.reservation.since
    if end == "fitted":
        scene.end_one("a0")
    elif end == "filtered":
        scene.allocator.hold("big", "a0", 60)
    after = scene.allocator.reservation_timeout if end == "timeout" else 10.0
    scene.clock.now = since + after
    scene.cycle()
    [ended] = [e for e in scene.allocator.take_reservation_events() if e.outcome]
    assert (ended.outcome, ended.held) == (end, after)


def test_the_agent_closest_to_fitting_is_reserved() -> None:
    # a1 lacks 1 CPU of big's shape, a0 and a2 lack 1.5 (and a2 1 GB more): a1.
    for seed in range(6):
        clock = FakeClock()
        allocator = Allocator(clock, seed=seed, packing=True)
        for i, free in enumerate(
            (Resources(cpus=0.5, mem=8192), Resources(cpus=1, mem=4096), Resources(cpus=0.5))
        ):
            allocator.add_agent(f"a{i}", AGENT)
            allocator.add_framework(f"s{i}", "r2")
            allocator.grant(f"s{i}", f"a{i}", AGENT - free)
        allocator.add_framework("big", "r1")
        allocator.set_demand("big", [(BIG, 1)])
        allocator.allocate()
        assert [r.agent_id for r in allocator.reservations()] == ["a1"], seed


def test_no_reservation_for_a_framework_that_is_not_first_in_order() -> None:
    # first fits the freed CPU and goes first; big is second: it reserves nothing.
    scene = Scene()
    scene.start("big", "a0", Resources(mem=32))  # behind first, which holds nothing
    scene.allocator.add_framework("first", "r0")
    scene.allocator.set_demand("first", [(Resources(cpus=1, mem=1024), 1)])
    scene.end_one("a0")
    assert scene.cycle() == [Allocation("first", "a0", Resources(cpus=1, mem=1024))]
    assert scene.reserved() == {}


def test_no_reservation_while_a_shape_of_the_first_fits_somewhere() -> None:
    scene = Scene(agents=16)
    scene.end_one("a0")
    scene.end_one("a1")
    scene.end_one("a1")  # big fits a1
    assert offered_to(scene.cycle(), "big") == [Allocation("big", "a1", BIG)]
    assert scene.reserved() == {}


# -- how a reservation ends -------------------------------------------------------------


def reserved_scene() -> Scene:
    scene = Scene()
    scene.end_one("a0")
    scene.cycle()
    assert scene.reserved() == {"a0": "big"}
    assert scene.events() == [("big", "a0", None)]
    return scene


def test_a_reservation_ends_when_its_shape_is_no_longer_demanded() -> None:
    scene = reserved_scene()
    scene.allocator.set_demand("big", [(BIG, 0), (SMALL, 3)])
    assert scene.events() == [("big", "a0", "demand_changed")]
    assert scene.cycle() == [Allocation("big", "a0", SMALL)]  # freed for anyone now
    scene = reserved_scene()
    scene.allocator.set_demand("big", [(BIG, 7)])  # the same shape, another count: kept
    assert scene.reserved() == {"a0": "big"} and scene.events() == []
    scene.allocator.set_demand("big", [(BIG, 1)])  # one task of it: still waited for
    assert scene.reserved() == {"a0": "big"} and scene.events() == []
    scene.allocator.set_demand("big", None)
    assert scene.events() == [("big", "a0", "demand_changed")]


def test_a_reservation_times_out_and_the_agent_is_not_reserved_again_as_long() -> None:
    scene = reserved_scene()
    timeout = scene.allocator.reservation_timeout
    scene.clock.now += timeout - 0.001
    assert scene.cycle() == [] and scene.events() == []
    scene.clock.now += 0.001
    assert scene.cycle() == [Allocation("small", "a0", SMALL)]  # not held any more
    events = scene.allocator.take_reservation_events()
    assert [(e.outcome, e.held) for e in events] == [("timeout", timeout)]
    scene.end_one("a0")  # small's old task: one CPU free again
    assert scene.cycle() == [Allocation("small", "a0", SMALL)]  # a0 is barred for big
    assert scene.reserved() == {}
    scene.clock.now += timeout
    scene.end_one("a0")
    scene.cycle()
    assert scene.reserved() == {"a0": "big"}


def test_a_reservation_ends_when_its_framework_declines_the_agent() -> None:
    scene = reserved_scene()
    scene.allocator.hold("big", "a0", 60)  # a filter over the whole agent
    assert scene.cycle() == [Allocation("small", "a0", SMALL)]
    assert scene.events() == [("big", "a0", "filtered")]


@pytest.mark.parametrize(
    ("how", "outcome"),
    [
        ("remove_agent", "agent_removed"),
        ("deactivate_agent", "agent_inactive"),
        ("remove_framework", "framework_removed"),
        ("suppress", "not_wanting"),
        ("disconnect_framework", "not_wanting"),
    ],
)
def test_a_reservation_ends_with_its_agent_or_its_framework(how: str, outcome: str) -> None:
    scene = reserved_scene()
    getattr(scene.allocator, how)("a0" if "agent" in how else "big")
    assert scene.events() == [("big", "a0", outcome)]
    assert scene.reserved() == {}
    if how in ("suppress", "disconnect_framework"):
        assert scene.cycle() == [Allocation("small", "a0", SMALL)]  # not held any more


def test_held_time_is_reported_when_it_ends() -> None:
    scene = reserved_scene()
    scene.clock.now += 2.5
    scene.end_one("a0")
    scene.cycle()
    [event] = scene.allocator.take_reservation_events()
    assert event == ReservationEvent(Reservation("big", "a0", BIG, 0.0), "fitted", 2.5)


# -- the pieces -------------------------------------------------------------------------


def test_surplus_is_what_the_shape_does_not_need() -> None:
    assert surplus(Resources(cpus=1, mem=5120), BIG) == Resources(mem=1024)
    assert surplus(Resources(cpus=3, mem=2048, gpus=1), BIG) == Resources(cpus=1, gpus=1)
    assert surplus(Resources(mem=512), BIG) == EMPTY


def test_shortfall_counts_what_is_missing_as_fractions_of_the_cluster() -> None:
    total = Resources(cpus=8, mem=16384)
    assert shortfall(Resources(cpus=1, mem=5120), BIG, total) == 1 / 8
    assert shortfall(Resources(cpus=0.5), BIG, total) == 1.5 / 8 + 4096 / 16384
    assert shortfall(AGENT, BIG, total) == 0.0
    # A resource the cluster has one of counts as a whole cluster's worth; one it has
    # none of can never be had.
    gpu = Resources(cpus=1, gpus=1)
    assert shortfall(Resources(cpus=1), gpu, Resources(cpus=8, gpus=1)) == 1.0
    assert shortfall(Resources(cpus=1), gpu, total) == float("inf")


def test_the_cluster_bound_is_a_whole_eighth_of_the_agents() -> None:
    assert [cluster_bound(n) for n in (0, 1, 8, 12, 16, 23, 80)] == [1, 1, 1, 1, 2, 2, 10]


# -- the simulator's phase 2 ------------------------------------------------------------


def phase2_shares(packing: bool, reservations: bool) -> dict[str, float]:
    """Each role's dominant share of what its tasks use, over 10-20 s of
    docs/simulate/phase2.toml (the experiment's phase 2, from a cluster full of phase
    1's tasks)."""
    workload = load_workload(ROOT / "docs/simulate/phase2.toml")
    return mean_shares(workload, 10, 20, packing=packing, reservations=reservations)


def test_on_the_simulators_phase_2_reservations_bring_packing_back_to_the_equilibrium() -> None:
    # DRF's equilibrium is 50% each. Packing alone starves job1's 2-CPU tasks (every
    # CPU freed alone goes to job2's 1-CPU tasks); with reservations it is within
    # 1.1 points of it, as close as whole-agent offers without packing.
    assert phase2_shares(packing=True, reservations=False) == {"job1": 0.412, "job2": 0.588}
    assert phase2_shares(packing=True, reservations=True) == {"job1": 0.491, "job2": 0.499}
    assert phase2_shares(packing=False, reservations=True) == {"job1": 0.494, "job2": 0.5}


# -- the master: logged, on /state and /metrics -----------------------------------------


def samples_of(master: Master) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = master.metrics.exposition(build_snapshot(master)).decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def test_the_master_logs_each_reservation_and_shows_it_on_state_and_metrics() -> None:
    core = CoreHarness(dataclasses.replace(CONFIG, packing=True))
    agent = core.add_agent("cpus:4;mem:14336")
    small = core.subscribe("small", role="r2")
    core.master.declare_demand(small.framework_id, [(SMALL, 100)])
    [offer] = core.allocate_for(small)
    tasks = [TaskSpec(f"s{i}", "true", SMALL) for i in range(4)]
    core.master.accept(small.framework_id, [offer.offer_id], tasks, refuse_seconds=0)
    big = core.subscribe("big", role="r1")
    core.master.declare_demand(big.framework_id, [(BIG, 10)])
    core.update(agent, small, "s0", TaskState.FINISHED)
    with capture_logs() as logs:
        assert core.allocate_for(small) == [] and core.allocate_for(big) == []
        core.advance(1.5)
        core.master.suppress(big.framework_id)
    reserved = {
        "agent_id": agent.agent_id,
        "framework_id": big.framework_id,
        "shape": BIG,
        "log_level": "info",
    }
    assert [e for e in logs if "reserv" in e["event"]] == [
        {"event": "agent reserved", **reserved},
        {
            "event": "reservation ended",
            "outcome": "not_wanting",
            "held_seconds": 1.5,
            **reserved,
        },
    ]
    samples = samples_of(core.master)
    assert value(samples, "mesolite_reservations_total", outcome="made") == 1
    assert value(samples, "mesolite_reservations_total", outcome="not_wanting") == 1
    assert value(samples, "mesolite_reservations_total", outcome="fitted") == 0
    assert value(samples, "mesolite_agents_reserved") == 0
    core.master.revive(big.framework_id)
    core.master.allocate()
    [a] = build_snapshot(core.master).agents
    assert a.reservation == ReservationSnapshot(big.framework_id, BIG, 0.0)
    assert value(samples_of(core.master), "mesolite_agents_reserved") == 1
    core.advance(2.0)
    [a] = build_snapshot(core.master).agents
    assert a.reservation is not None and a.reservation.seconds == 2.0
    core.assert_sound()


def test_no_agent_is_reserved_where_only_the_reservers_own_tasks_would_have_to_end() -> None:
    # Phase 1: big's <1 CPU, 10 GB> on a0 beside three of small's <1 CPU, 1 GB>; small
    # also fills a1, so big is first. One of small's tasks on a0 ends: big's shape fits
    # a0 only once big's own task there ends, so holding the CPU for it would gain it
    # nothing; small is offered the CPU. On a2, where small holds 10 GB instead, it is.
    task = Resources(cpus=1, mem=10240)
    clock = FakeClock()
    allocator = Allocator(clock, packing=True)
    allocator.add_framework("big", "r1")
    allocator.add_framework("small", "r2")
    allocator.set_demand("big", [(task, 10)])
    allocator.set_demand("small", [(Resources(cpus=1, mem=1024), 10)])
    for agent_id in ("a0", "a1"):
        allocator.add_agent(agent_id, AGENT)
    allocator.grant("big", "a0", task)
    allocator.grant("small", "a0", Resources(cpus=2, mem=2048))  # one of three ended
    allocator.grant("small", "a1", AGENT)
    assert allocator.allocate() == [Allocation("small", "a0", Resources(cpus=1, mem=1024))]
    assert list(allocator.reservations()) == []
    allocator.add_agent("a2", AGENT)
    allocator.grant("small", "a2", Resources(cpus=3, mem=12288))
    assert allocator.allocate() == []
    assert [r.agent_id for r in allocator.reservations()] == ["a2"]
