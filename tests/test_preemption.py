"""The preemption planner (`master/preemption.py`) and fair levels (`master/fair_levels.py`):
pure tables and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesolite.master.fair_levels import fair_levels
from mesolite.master.fair_share import ShareInput
from mesolite.master.policies import DRFPolicy
from mesolite.master.preemption import (
    Candidate,
    Kind,
    RoleState,
    Victim,
    below_fair_share,
    below_guarantee,
    plan,
    starvation,
)
from mesolite.resources import EMPTY, Resources

DRF = DRFPolicy()
TOTAL = Resources(cpus=8, mem=8192)
CPU = Resources(cpus=1, mem=512)


def tasks(role: str, n: int, shape: Resources = CPU, start: float = 0.0) -> list[Candidate]:
    return [
        Candidate(f"fw-{role}", f"{role}-{i}", role, f"a{i % 2}", shape, start + i)
        for i in range(n)
    ]


def held(ts: list[Candidate]) -> Resources:
    total = EMPTY
    for t in ts:
        total = total + t.resources
    return total


def test_fair_levels_divide_among_active_roles_capped_by_demand() -> None:
    inputs = {"a": ShareInput(), "b": ShareInput(), "c": ShareInput()}
    levels = fair_levels(inputs, TOTAL, {"a", "b"})
    assert levels["a"] == levels["b"] == Resources(cpus=4, mem=4096)
    assert levels["c"] == EMPTY
    # b demands 1 CPU: a gets the rest of the CPUs; memory b does not want goes to a too.
    capped = fair_levels(inputs, TOTAL, {"a", "b"}, {"b": Resources(cpus=1)})
    assert capped["b"] == Resources(cpus=1)
    assert capped["a"] == Resources(cpus=7, mem=8192)


def test_fair_levels_give_a_role_no_share_of_a_resource_its_tasks_do_not_use() -> None:
    inputs = {"cpu": ShareInput(), "both": ShareInput(), "new": ShareInput()}
    active = {"cpu", "both", "new"}
    # `cpu` declared nothing and holds CPUs only: it is given no memory, as the Fair
    # Scheduler caps each resource's share at the demand for it; a role that holds
    # nothing and declared nothing (`new`) is not capped, and a declared demand wins.
    held = {"cpu": Resources(cpus=2), "both": Resources(cpus=1, mem=512), "new": EMPTY}
    levels = fair_levels(inputs, Resources(cpus=9, mem=9000), active, {}, held)
    assert levels["cpu"] == Resources(cpus=3)
    assert levels["both"] == levels["new"] == Resources(cpus=3, mem=4500)
    declared = fair_levels(
        inputs, Resources(cpus=9, mem=9000), active, {"cpu": Resources(cpus=2, mem=900)}, held
    )
    assert declared["cpu"] == Resources(cpus=2, mem=900)
    # The rest is divided between the other two.
    assert declared["both"] == declared["new"] == Resources(cpus=3.5, mem=4050)


def test_a_guaranteed_role_takes_back_its_guarantee_from_one_that_came_first() -> None:
    # The issue's case: gold is guaranteed 6 of 8 CPUs; `*` came first and holds all 8.
    star = tasks("*", 8)
    inputs = {"*": ShareInput(), "gold": ShareInput(guarantee=Resources(cpus=6))}
    fair = fair_levels(inputs, TOTAL, {"*", "gold"})
    assert fair["gold"].get_amount("cpus") == 6
    roles = {
        "*": RoleState(held(star), fair["*"]),
        "gold": RoleState(
            EMPTY,
            fair["gold"],
            guarantee=Resources(cpus=6),
            below_guarantee_for=15.0,
            min_share_timeout=15.0,
        ),
    }
    victims = plan(roles, star, EMPTY, TOTAL, DRF)
    assert [v.task.task_id for v in victims] == [f"*-{i}" for i in (7, 6, 5, 4, 3, 2)]
    assert {v.kind for v in victims} == {Kind.MIN_SHARE} and {v.for_role for v in victims} == {
        "gold"
    }
    # Before the timeout, nothing.
    early = dict(
        roles,
        gold=RoleState(
            EMPTY, fair["gold"], Resources(cpus=6), below_guarantee_for=14.9, min_share_timeout=15.0
        ),
    )
    assert plan(early, star, EMPTY, TOTAL, DRF) == []


def test_fair_share_preemption_stops_at_the_victims_own_share() -> None:
    a, b = tasks("a", 6), tasks("b", 2, start=100)
    fair = fair_levels({"a": ShareInput(), "b": ShareInput()}, TOTAL, {"a", "b"})

    def roles(threshold: float) -> dict[str, RoleState]:
        return {
            "a": RoleState(held(a), fair["a"]),
            "b": RoleState(
                held(b),
                fair["b"],
                below_fair_share_for=60,
                fair_share_timeout=30,
                threshold=threshold,
            ),
        }

    # b holds 2/8 = 0.25 against a fair 0.5: starved under a threshold of 0.8, not 0.5.
    assert plan(roles(0.5), a + b, EMPTY, TOTAL, DRF) == []
    victims = plan(roles(0.8), a + b, EMPTY, TOTAL, DRF)
    # a gives 2 (down to its fair 4), the most recent first; b's own tasks are never taken.
    assert [v.task.task_id for v in victims] == ["a-5", "a-4"]
    # Free resources count first: with 1 CPU free, only one is taken.
    assert len(plan(roles(0.8), a + b, CPU, TOTAL, DRF)) == 1


def test_a_role_that_wants_nothing_is_never_starved() -> None:
    s = RoleState(EMPTY, Resources(cpus=4), Resources(cpus=2), wants=False)
    assert starvation(s, TOTAL, DRF) == (False, False)
    assert starvation(RoleState(EMPTY, Resources(cpus=4), Resources(cpus=2)), TOTAL, DRF) == (
        True,
        True,
    )


def test_no_task_is_taken_that_the_starved_role_could_not_use() -> None:
    # gold is short of CPUs only; `*` runs memory-only tasks: nothing to take.
    mem_only = tasks("*", 4, Resources(mem=2048))
    inputs = {"*": ShareInput(), "gold": ShareInput(guarantee=Resources(cpus=6))}
    fair = fair_levels(inputs, TOTAL, {"*", "gold"})
    roles = {
        "*": RoleState(held(mem_only), fair["*"]),
        "gold": RoleState(
            EMPTY, fair["gold"], Resources(cpus=6), below_guarantee_for=99, min_share_timeout=1
        ),
    }
    assert plan(roles, mem_only, EMPTY, TOTAL, DRF) == []


# Properties ----------------------------------------------------------------

ROLES = ("r0", "r1", "r2", "r3")


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[dict[str, RoleState], list[Candidate], Resources, Resources]:
    cpus, mem = draw(st.integers(4, 32)), draw(st.integers(4, 32)) * 512
    total = Resources(cpus=cpus, mem=mem)
    inputs: dict[str, ShareInput] = {}
    candidates: list[Candidate] = []
    left = total
    for role in ROLES:
        guarantee = Resources(cpus=draw(st.integers(0, cpus // 2)))
        inputs[role] = ShareInput(
            weight=draw(st.sampled_from([1.0, 2.0, 3.0])), guarantee=guarantee
        )
        for i in range(draw(st.integers(0, 12))):
            shape = Resources(cpus=draw(st.integers(1, 3)), mem=draw(st.integers(1, 4)) * 256)
            if left.contains(shape):
                left = left - shape
                candidates.append(
                    Candidate(
                        f"fw-{role}", f"{role}-{i}", role, "a", shape, draw(st.floats(0, 100))
                    )
                )
    wants = {r for r in ROLES if draw(st.booleans())}
    fair = fair_levels(inputs, total, wants)
    roles = {
        r: RoleState(
            held([c for c in candidates if c.role == r]),
            fair[r],
            inputs[r].guarantee,
            inputs[r].weight,
            wants=r in wants,
            below_guarantee_for=1.0,
            below_fair_share_for=1.0,
            min_share_timeout=draw(st.sampled_from([0.0, None])),
            fair_share_timeout=draw(st.sampled_from([0.0, None])),
            threshold=draw(st.sampled_from([0.5, 0.8, 1.0])),
        )
        for r in ROLES
    }
    return roles, candidates, total, left


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(situations())
def test_preemption_never_creates_a_new_deficit_and_never_thrashes(
    situation: tuple[dict[str, RoleState], list[Candidate], Resources, Resources],
) -> None:
    roles, candidates, total, free = situation
    victims = plan(roles, candidates, free, total, DRF)
    keys = [(v.task.framework_id, v.task.task_id) for v in victims]
    assert len(keys) == len(set(keys))
    after = {r: s.allocation for r, s in roles.items()}

    def weighted(r: str) -> float:
        return DRF.share(after[r], total) / roles[r].weight

    for v in victims:  # replayed in order: each checked when it was chosen
        assert v.task.role != v.for_role
        after[v.task.role] = after[v.task.role] - v.task.resources
        after[v.for_role] = after[v.for_role] + v.task.resources
        if v.kind is Kind.FAIR_SHARE:  # taken only from a role still above the starved one
            assert weighted(v.task.role) >= weighted(v.for_role) - 1e-12, v
    victim_roles = {v.task.role for v in victims}
    for r in victim_roles:
        s = roles[r]
        assert not below_guarantee(after[r], s.guarantee), r
        assert not below_fair_share(_with(s, after[r]), total, DRF), r
    # No thrash: planned again on the state it leads to (every timeout long passed), no
    # task moves from a role it benefited back to a role it took from.
    moved = [
        c
        if c not in [v.task for v in victims]
        else Candidate(
            c.framework_id + "-moved",
            c.task_id,
            next(v.for_role for v in victims if v.task == c),
            c.agent_id,
            c.resources,
            1000.0,
        )
        for c in candidates
    ]
    again = plan({r: _with(s, after[r]) for r, s in roles.items()}, moved, free, total, DRF)
    beneficiaries = {v.for_role for v in victims}
    for v in again:
        assert not (v.task.role in beneficiaries and v.for_role in victim_roles), v


def _with(s: RoleState, allocation: Resources) -> RoleState:
    return RoleState(
        allocation,
        s.fair_share,
        s.guarantee,
        s.weight,
        s.resource_weights,
        s.wants,
        s.below_guarantee_for,
        s.below_fair_share_for,
        s.min_share_timeout,
        s.fair_share_timeout,
        s.threshold,
    )


# Each test below pins one rule of the planner that a surviving mutant of
# `make mutation` broke without any test failing (docs/mutation/equivalent.md lists
# the ones that change nothing).
ONE = Resources(cpus=1)  # a CPU-only task


def short_of_guarantee(allocation: Resources, fair: Resources, guarantee: Resources) -> RoleState:
    """A role below its guarantee, its min_share_timeout over."""
    return RoleState(allocation, fair, guarantee, below_guarantee_for=0.0, min_share_timeout=0.0)


def short_of_fair_share(
    allocation: Resources, fair: Resources, resource_weights: dict[str, float] | None = None
) -> RoleState:
    """A role below its fair share (threshold 1), its fair_share_timeout over."""
    return RoleState(
        allocation,
        fair,
        resource_weights=resource_weights,
        below_fair_share_for=0.0,
        fair_share_timeout=0.0,
        threshold=1.0,
    )


def shaped(role: str, n: int, shape: Resources, start: float = 0.0) -> list[Candidate]:
    return [Candidate(f"fw-{role}", f"{role}-{i}", role, "a0", shape, start + i) for i in range(n)]


def ids(victims: list[Victim]) -> list[str]:
    return [v.task.task_id for v in victims]


def test_below_guarantee_means_strictly_below_it_in_some_resource() -> None:
    assert not below_guarantee(Resources(cpus=6, mem=10), Resources(cpus=6))
    assert below_guarantee(Resources(cpus=5.9, mem=10), Resources(cpus=6))
    assert not below_guarantee(Resources(cpus=8, mem=100), Resources(cpus=6, mem=100))
    assert below_guarantee(Resources(cpus=8, mem=99), Resources(cpus=6, mem=100))
    assert not below_guarantee(EMPTY, EMPTY)


def test_below_fair_share_takes_the_threshold_given_over_the_roles_own() -> None:
    s = RoleState(Resources(cpus=3), Resources(cpus=4), threshold=0.5)
    assert not below_fair_share(s, TOTAL, DRF)  # 3/8 against 0.5 x 4/8
    assert below_fair_share(s, TOTAL, DRF, threshold=1.0)


def test_min_share_preemption_stops_at_the_guarantee_not_the_fair_share() -> None:
    star = tasks("*", 8)
    roles = {
        "idle": RoleState(EMPTY, EMPTY, wants=False),  # first: the others are still planned
        "*": RoleState(held(star), Resources(cpus=4, mem=4096)),
        "gold": short_of_guarantee(EMPTY, Resources(cpus=4, mem=4096), Resources(cpus=2)),
    }
    victims = plan(roles, star, EMPTY, TOTAL, DRF)
    assert ids(victims) == ["*-7", "*-6"]  # its guarantee, though its fair share is 4


def test_a_role_below_its_guarantee_is_served_before_one_below_its_fair_share() -> None:
    # One task can be taken (v is at its fair share plus one); g is below its guarantee,
    # f further below its fair share: the guarantee comes first.
    v = shaped("v", 6, ONE)
    g = shaped("g", 1, ONE, start=10)
    roles = {
        "v": RoleState(held(v), Resources(cpus=5), threshold=1.0),
        "g": short_of_guarantee(held(g), Resources(cpus=2), Resources(cpus=2)),
        "f": short_of_fair_share(EMPTY, Resources(cpus=2)),
    }
    victims = plan(roles, v + g, EMPTY, TOTAL, DRF)
    assert [(v.task.task_id, v.for_role) for v in victims] == [("v-5", "g")]


def test_the_most_starved_below_its_fair_share_is_served_first() -> None:
    # f1 holds a quarter of its fair share, f2 half of its (smaller) one: f1 first.
    v = shaped("v", 6, ONE)
    roles = {
        "v": RoleState(held(v), Resources(cpus=5), threshold=1.0),
        "f2": short_of_fair_share(Resources(cpus=1), Resources(cpus=2)),
        "f1": short_of_fair_share(Resources(cpus=1), Resources(cpus=4)),
    }
    victims = plan(roles, v, EMPTY, TOTAL, DRF)
    assert [(v.task.task_id, v.for_role) for v in victims] == [("v-5", "f1")]


@pytest.mark.parametrize(("free_cpus", "taken"), [(2, 1), (3, 0)])
def test_free_resources_are_credited_once_and_only_what_a_role_lacks(
    free_cpus: int, taken: int
) -> None:
    # g1 lacks 2 CPUs, g2 1: the free CPUs go to g1 first (its share ties, its name is
    # first), and only what it lacks; g2 is given the rest, and a task for what remains.
    v = shaped("v", 4, ONE)
    roles = {
        "v": RoleState(held(v), Resources(cpus=2)),
        "g1": short_of_guarantee(Resources(cpus=1), Resources(cpus=3), Resources(cpus=3)),
        "g2": short_of_guarantee(Resources(cpus=1), Resources(cpus=2), Resources(cpus=2)),
    }
    victims = plan(roles, v, Resources(cpus=free_cpus), TOTAL, DRF)
    assert len(victims) == taken and all(v.for_role == "g2" for v in victims)


def test_a_task_of_a_role_the_planner_does_not_know_is_never_taken() -> None:
    v = shaped("v", 2, ONE)
    stray = Candidate("fw-x", "x-0", "x", "a0", ONE, 99.0)  # the newest
    roles = {
        "v": RoleState(held(v), EMPTY),
        "g": short_of_guarantee(EMPTY, Resources(cpus=1), Resources(cpus=1)),
    }
    assert ids(plan(roles, [*v, stray], EMPTY, TOTAL, DRF)) == ["v-1"]


def test_a_useless_task_is_passed_over_not_the_end_of_the_search() -> None:
    # g lacks only CPUs: the newest task holds only memory (of which g has exactly its
    # guarantee) and is skipped; the CPU tasks behind it are taken.
    cpu = shaped("v", 2, ONE)
    mem = Candidate("fw-v", "v-mem", "v", "a0", Resources(mem=512), 99.0)
    roles = {
        "v": RoleState(held([*cpu, mem]), EMPTY),
        "g": short_of_guarantee(
            Resources(mem=512), Resources(cpus=2, mem=512), Resources(cpus=2, mem=512)
        ),
    }
    assert ids(plan(roles, [*cpu, mem], EMPTY, TOTAL, DRF)) == ["v-1", "v-0"]


def test_a_task_that_breaks_one_rule_is_passed_over_not_the_end_of_the_search() -> None:
    v = shaped("v", 6, ONE)
    # Fair-share: w's task (the newest) would leave w below f: skipped, v's taken.
    w = shaped("w", 1, ONE, start=99)
    roles = {
        "v": RoleState(held(v), Resources(cpus=4)),
        "w": RoleState(held(w), Resources(cpus=1)),
        "f": short_of_fair_share(EMPTY, Resources(cpus=2)),
    }
    assert ids(plan(roles, v + w, EMPTY, TOTAL, DRF)) == ["v-5", "v-4"]
    # Min-share: k's task (the newest) would take k below its guarantee: skipped.
    k = shaped("k", 1, ONE, start=99)
    roles = {
        "v": RoleState(held(v), Resources(cpus=4)),
        "k": RoleState(held(k), Resources(cpus=1), guarantee=Resources(cpus=1)),
        "g": short_of_guarantee(EMPTY, Resources(cpus=2), Resources(cpus=2)),
    }
    assert ids(plan(roles, v + k, EMPTY, TOTAL, DRF)) == ["v-5", "v-4"]


def test_fair_share_preemption_stops_when_the_share_is_reached_exactly() -> None:
    # b's fair share (limited to 2 CPUs) is 0.25 of the cluster; two tasks of
    # <1 CPU, 512 MB> reach it exactly (with memory still short of it): no third.
    a = tasks("a", 8)
    roles = {
        "a": RoleState(held(a), Resources(cpus=6, mem=6144)),
        "b": short_of_fair_share(EMPTY, Resources(cpus=2, mem=2048)),
    }
    assert ids(plan(roles, a, EMPTY, TOTAL, DRF)) == ["a-7", "a-6"]


def test_the_planner_weighs_shares_with_the_roles_weight_vector() -> None:
    # f weighs CPUs 4: its weighted share is a quarter of its CPU share, so v (weight 1)
    # stays above it down to one task; unweighted, v would stop at two.
    v = shaped("v", 4, ONE)
    roles = {
        "v": RoleState(held(v), Resources(cpus=1)),
        "f": short_of_fair_share(EMPTY, Resources(cpus=4), {"cpus": 4.0}),
    }
    assert ids(plan(roles, v, EMPTY, TOTAL, DRF)) == ["v-3", "v-2", "v-1"]


def test_a_cap_by_demand_or_by_what_is_held_keeps_the_roles_limit_and_weights() -> None:
    inputs = {
        "a": ShareInput(limit={"cpus": 1}),
        "b": ShareInput(resource_weights={"cpus": 3.0}),
        "c": ShareInput(),
    }
    active = {"a", "b", "c"}
    # a's limit (1 CPU) stays below its demand (5); b weighs CPUs 3 against c's 1.
    demands = {"a": Resources(cpus=5, mem=8000), "b": Resources(cpus=8, mem=8000)}
    held = {"a": Resources(cpus=1, mem=1), "b": Resources(cpus=1, mem=1)}
    for capped in (
        fair_levels(inputs, TOTAL, active, demands),
        fair_levels(inputs, TOTAL, active, {}, held),
    ):
        cpus = {path: share.get_amount("cpus") for path, share in capped.items()}
        assert cpus == {"a": 1, "b": 5.25, "c": 1.75}


def test_min_share_preemption_goes_on_while_any_guaranteed_resource_is_short() -> None:
    # Gold's guarantee is 1 CPU and 4 GB. A 4-CPU task gives it a dominant share equal to
    # its fair share's, but no memory: the memory tasks behind are taken too.
    big = Candidate("fw-v", "v-big", "v", "a0", Resources(cpus=4), 99.0)
    mem = shaped("v", 4, Resources(mem=1024))
    roles = {
        "v": RoleState(held([big, *mem]), EMPTY),
        "gold": short_of_guarantee(EMPTY, Resources(cpus=4, mem=4096), Resources(cpus=1, mem=4096)),
    }
    victims = plan(roles, [*mem, big], EMPTY, TOTAL, DRF)
    assert ids(victims) == ["v-big", "v-3", "v-2", "v-1", "v-0"]
