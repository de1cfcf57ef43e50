"""The preemption planner (`master/preemption.py`) and fair levels (`master/fair_levels.py`):
pure tables and hypothesis properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesolite.master.fair_levels import fair_levels
from mesolite.master.fair_share import ShareInput
from mesolite.master.policies import DRFPolicy
from mesolite.master.preemption import (
    Candidate,
    Kind,
    RoleState,
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


def test_a_guaranteed_role_takes_back_its_guarantee_from_one_that_came_first() -> None:
    # The case: gold is guaranteed 6 of 8 CPUs; `*` came first and holds all 8.
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
