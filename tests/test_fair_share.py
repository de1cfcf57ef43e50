"""Fair shares: worked examples, edge cases, and agreement with an exact reference.

The reference below recomputes everything with `fractions.Fraction`, straight
from the definition in `master.fair_share` (find R with
sum clamp(w*R, lo, hi) = min(T, sum hi), by bisection over the breakpoints), so
it shares no code with the sweep it checks. Rounding is floor plus largest
remainder, ties to the first child by path; the module promises exactly that,
so results are compared for equality, not just within a thousandth.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Collection, Mapping
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mesolite.master.fair_share import (
    ROOT,
    ShareInput,
    _split_at_ratio,
    compute_fair_shares,
    role_tree,
)
from mesolite.master.role_config import parse_roles
from mesolite.resources import Resources

# Amounts are compared in thousandths, as Resources keeps them.
Units = dict[str, int]


def units(r: Resources) -> Units:
    return dict(r._units)


def shares_in_units(
    roles: Mapping[str, ShareInput], total: Resources, active: Collection[str] | None = None
) -> dict[str, Units]:
    return {path: units(r) for path, r in compute_fair_shares(roles, total, active).items()}


# The reference -----------------------------------------------------------------


def reference_exact(
    total: int, weights: list[Fraction], lo: list[int], hi: list[int | None]
) -> list[Fraction]:
    """The exact (unrounded) shares of `total`, by the definition."""
    lo = [g if h is None else min(g, h) for g, h in zip(lo, hi, strict=True)]
    promised = sum(lo)
    if promised >= total:
        return [Fraction(g * total, promised) if promised else Fraction(0) for g in lo]
    # A weight 0 child is stuck at its guarantee whatever R is.
    top: list[float | int] = [
        g if w == 0 else (math.inf if h is None else h)
        for w, g, h in zip(weights, lo, hi, strict=True)
    ]
    if sum(top) <= total:
        return [Fraction(t) for t in top]  # every t is finite here

    def f(r: Fraction) -> Fraction:
        return sum(
            (clamp(w * r, g, h) for w, g, h in zip(weights, lo, hi, strict=True)), Fraction(0)
        )

    points = sorted(
        {Fraction(0)}
        | {Fraction(g) / w for w, g in zip(weights, lo, strict=True) if w}
        | {Fraction(h) / w for w, h in zip(weights, hi, strict=True) if w and h is not None}
    )
    # The first breakpoint where f reaches total, by bisection (f is monotone).
    first, last = 0, len(points)
    while first < last:
        mid = (first + last) // 2
        if f(points[mid]) >= total:
            last = mid
        else:
            first = mid + 1
    if first == len(points):  # beyond every breakpoint f grows at a constant rate
        left = points[-1]
        rate = f(left + 1) - f(left)
        r = left + (total - f(left)) / rate
    else:
        right = points[first]
        left = points[first - 1]  # f(0) = sum(lo) < total, so first > 0
        r = left + (total - f(left)) * (right - left) / (f(right) - f(left))
    out = [clamp(w * r, g, h) for w, g, h in zip(weights, lo, hi, strict=True)]
    assert sum(out) == total
    return out


def clamp(x: Fraction, lo: int, hi: int | None) -> Fraction:
    x = max(x, Fraction(lo))
    return x if hi is None else min(x, Fraction(hi))


def round_largest_remainder(exact: list[Fraction]) -> list[int]:
    floors = [math.floor(x) for x in exact]
    short = int(sum(exact)) - sum(floors)  # the exact shares always sum to a whole amount
    order = sorted(range(len(exact)), key=lambda i: -(exact[i] - floors[i]))
    for i in order[:short]:
        floors[i] += 1
    return floors


def reference_shares(
    roles: Mapping[str, ShareInput], total: Resources, active: Collection[str] | None = None
) -> dict[str, Units]:
    """The whole tree, top down, rounding at each level like the module."""
    paths: set[str] = set()
    for path in roles:
        parts = path.split("/")
        paths.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    live = None
    if active is not None:
        live = {p for p in paths if any(a == p or a.startswith(p + "/") for a in active)}
    out: dict[str, Units] = {p: {} for p in paths}

    def divide(node: str, share: Units) -> None:
        kids = sorted(p for p in paths if p.rpartition("/")[0] == node)
        if live is not None:
            kids = [k for k in kids if k in live]
        if not kids:
            return
        specs = [roles.get(k, ShareInput()) for k in kids]
        for name, amount in share.items():
            exact = reference_exact(
                amount,
                [Fraction((s.resource_weights or {}).get(name, s.weight)) for s in specs],
                [s.guarantee._units.get(name, 0) for s in specs],
                [
                    None if s.limit is None or name not in s.limit else round(s.limit[name] * 1000)
                    for s in specs
                ],
            )
            for kid, part in zip(kids, round_largest_remainder(exact), strict=True):
                if part:
                    out[kid][name] = part
        for kid in kids:
            divide(kid, out[kid])

    divide(ROOT, dict(total._units))
    return out


# Worked examples ---------------------------------------------------------------

SEED_LIMIT = {"mem": 1073741824, "cpus": 1000}
SEED_ROLES = {
    "queueA": ShareInput(0.25, limit=SEED_LIMIT),
    "queueB": ShareInput(0.75, limit=SEED_LIMIT),
    "*": ShareInput(1.0),  # the Fair Scheduler's root.default
}
SEED_NODE = Resources(mem=8 * 1024, cpus=8)


def test_seed_example_steady_shares() -> None:
    # The walk-through prints steady shares memory 1024 / 3072 / 4096 (YARN
    # computes memory only, so its vcores read 0; here every resource counts).
    shares = compute_fair_shares(SEED_ROLES, SEED_NODE)
    assert shares["queueA"] == Resources(mem=1024, cpus=1)
    assert shares["queueB"] == Resources(mem=3072, cpus=3)
    assert shares["*"] == Resources(mem=4096, cpus=4)


def test_seed_example_instantaneous_shares() -> None:
    # Only queueA and queueB have applications: FairShare 2048 / 6144 / 0.
    shares = compute_fair_shares(SEED_ROLES, SEED_NODE, active={"queueA", "queueB"})
    assert shares["queueA"] == Resources(mem=2048, cpus=2)
    assert shares["queueB"] == Resources(mem=6144, cpus=6)
    assert shares["*"] == Resources()


def test_seed_weight_example() -> None:
    # queueX weight .25, the others .75 together, 1000 GB and 200 vcores.
    roles = {"x": ShareInput(0.25), "y": ShareInput(0.5), "z": ShareInput(0.25)}
    shares = compute_fair_shares(roles, Resources(mem=1000 * 1024, cpus=200))
    assert shares["x"] == Resources(mem=250 * 1024, cpus=50)


@pytest.mark.parametrize(
    "roles, total, expected",
    [
        pytest.param(
            {"a": ShareInput(), "b": ShareInput(), "c": ShareInput()},
            10,
            {"a": 3334, "b": 3333, "c": 3333},
            id="equal weights: the spare thousandth goes to the first path",
        ),
        pytest.param(
            {"a": ShareInput(1), "b": ShareInput(3)},
            8,
            {"a": 2000, "b": 6000},
            id="weights",
        ),
        pytest.param(
            {"a": ShareInput(guarantee=Resources(cpus=6)), "b": ShareInput(), "c": ShareInput()},
            9,
            {"a": 6000, "b": 1500, "c": 1500},
            id="a guarantee above the weighted share is honoured",
        ),
        pytest.param(
            {"a": ShareInput(guarantee=Resources(cpus=2)), "b": ShareInput()},
            9,
            {"a": 4500, "b": 4500},
            id="a guarantee below the weighted share changes nothing",
        ),
        pytest.param(
            {
                "a": ShareInput(guarantee=Resources(cpus=6)),
                "b": ShareInput(guarantee=Resources(cpus=3)),
                "c": ShareInput(5),
            },
            6,
            {"a": 4000, "b": 2000, "c": 0},
            id="guarantees above the total are scaled down, never over-allocated",
        ),
        pytest.param(
            {"a": ShareInput(limit={"cpus": 1}), "b": ShareInput(), "c": ShareInput()},
            10,
            {"a": 1000, "b": 4500, "c": 4500},
            id="a capped role's excess goes to the others",
        ),
        pytest.param(
            {"a": ShareInput(limit={"cpus": 1}), "b": ShareInput(3, limit={"cpus": 2})},
            10,
            {"a": 1000, "b": 2000},
            id="everyone capped: the rest stays unallocated",
        ),
        pytest.param(
            {"a": ShareInput(limit={"cpus": 0}), "b": ShareInput()},
            10,
            {"a": 0, "b": 10000},
            id="limit 0 is fixed at 0",
        ),
        pytest.param(
            {
                "a": ShareInput(0, guarantee=Resources(cpus=1)),
                "b": ShareInput(0),
                "c": ShareInput(),
            },
            10,
            {"a": 1000, "b": 0, "c": 9000},
            id="weight 0 is fixed at its guarantee",
        ),
        pytest.param(
            {"a": ShareInput(0, guarantee=Resources(cpus=1)), "b": ShareInput(0)},
            10,
            {"a": 1000, "b": 0},
            id="only weight 0 roles: the rest stays unallocated",
        ),
        pytest.param(
            {"a": ShareInput(guarantee=Resources(cpus=5), limit={"cpus": 2}), "b": ShareInput()},
            3,
            {"a": 2000, "b": 1000},
            id="a guarantee above the role's own limit counts as the limit",
        ),
        pytest.param(
            {
                "a": ShareInput(1, guarantee=Resources(cpus=6)),
                "b": ShareInput(1, limit={"cpus": 1}),
                "c": ShareInput(1),
                "d": ShareInput(0, guarantee=Resources(cpus=1)),
            },
            10,
            {"a": 6000, "b": 1000, "c": 2000, "d": 1000},
            id="everything at once: R = 2",
        ),
        pytest.param(
            {
                "a": ShareInput(1, guarantee=Resources(cpus=3), limit={"cpus": 5}),
                "b": ShareInput(2, limit={"cpus": 4}),
                "c": ShareInput(4, guarantee=Resources(cpus=1)),
            },
            11,
            {"a": 3000, "b": 8000 / 3, "c": 16000 / 3},
            id="a segment between breakpoints: R = 4/3",
        ),
    ],
)
def test_one_level(roles: dict[str, ShareInput], total: float, expected: dict[str, float]) -> None:
    shares = shares_in_units(roles, Resources(cpus=total))
    # Where the exact share is fractional, rounding goes to the largest remainder.
    assert {p: u.get("cpus", 0) for p, u in shares.items()} == {
        p: round(v) if v == int(v) else pytest.approx(v, abs=1) for p, v in expected.items()
    }
    assert sum(u.get("cpus", 0) for u in shares.values()) <= total * 1000
    assert shares == reference_shares(roles, Resources(cpus=total))


def test_resources_are_divided_separately() -> None:
    roles = {
        "a": ShareInput(limit={"gpus": 0}, guarantee=Resources(mem=3000)),
        "b": ShareInput(),
    }
    shares = compute_fair_shares(roles, Resources(cpus=4, mem=4000, gpus=2))
    assert shares["a"] == Resources(cpus=2, mem=3000)
    assert shares["b"] == Resources(cpus=2, mem=1000, gpus=2)


def test_bounds_on_resources_outside_the_total_are_ignored() -> None:
    roles = {"a": ShareInput(guarantee=Resources(disk=5), limit={"gpus": 1}), "b": ShareInput()}
    shares = compute_fair_shares(roles, Resources(cpus=2))
    assert shares == {"a": Resources(cpus=1), "b": Resources(cpus=1)}


# The tree ----------------------------------------------------------------------


def test_nested_roles_divide_their_parents_share() -> None:
    roles = {
        "eng": ShareInput(2),
        "eng/ml": ShareInput(1),
        "eng/web": ShareInput(3),
        "ops": ShareInput(1),
    }
    shares = compute_fair_shares(roles, Resources(cpus=12))
    assert shares == {
        "eng": Resources(cpus=8),
        "eng/ml": Resources(cpus=2),
        "eng/web": Resources(cpus=6),
        "ops": Resources(cpus=4),
    }


def test_missing_ancestors_join_with_weight_one() -> None:
    roles = {"team/a/x": ShareInput(), "ops": ShareInput(3)}
    shares = compute_fair_shares(roles, Resources(cpus=8))
    assert list(shares) == ["ops", "team", "team/a", "team/a/x"]  # path order
    assert shares["team"] == shares["team/a"] == shares["team/a/x"] == Resources(cpus=2)


def test_a_parent_limit_caps_its_subtree_and_frees_the_rest() -> None:
    roles = {
        "eng": ShareInput(3, limit={"cpus": 4}),
        "eng/ml": ShareInput(guarantee=Resources(cpus=3)),
        "eng/web": ShareInput(),
        "ops": ShareInput(1),
    }
    shares = compute_fair_shares(roles, Resources(cpus=12))
    assert shares["eng"] == Resources(cpus=4)
    assert shares["ops"] == Resources(cpus=8)
    assert shares["eng/ml"] == Resources(cpus=3)
    assert shares["eng/web"] == Resources(cpus=1)


def test_children_guarantees_above_a_small_parent_share_are_scaled() -> None:
    roles = {
        "eng": ShareInput(limit={"cpus": 2}),
        "eng/ml": ShareInput(guarantee=Resources(cpus=3)),
        "eng/web": ShareInput(guarantee=Resources(cpus=1)),
    }
    shares = compute_fair_shares(roles, Resources(cpus=12))
    assert shares["eng/ml"] == Resources(cpus=1.5)
    assert shares["eng/web"] == Resources(cpus=0.5)


def test_role_tree_lists_children_in_path_order() -> None:
    assert role_tree(["b", "a/y", "a/x", "c/d/e"]) == {
        ROOT: ["a", "b", "c"],
        "a": ["a/x", "a/y"],
        "c": ["c/d"],
        "c/d": ["c/d/e"],
    }
    assert role_tree([]) == {ROOT: []}
    with pytest.raises(ValueError, match="root"):
        role_tree([""])


# Steady and instantaneous ------------------------------------------------------

TREE = {
    "*": ShareInput(),
    "eng": ShareInput(2),
    "eng/ml": ShareInput(),
    "eng/web": ShareInput(),
    "ops": ShareInput(guarantee=Resources(cpus=1)),
}


def test_inactive_roles_get_nothing_and_their_share_goes_to_the_active() -> None:
    total = Resources(cpus=8)
    steady = compute_fair_shares(TREE, total)
    assert steady["ops"] == Resources(cpus=2)
    assert steady["eng/ml"] == Resources(cpus=2)
    now = compute_fair_shares(TREE, total, active={"eng/ml", "ops"})
    assert now["eng"] == Resources(cpus=16 / 3)  # weight 2 of 3 among the active
    assert now["eng/ml"] == now["eng"]
    assert now["eng/web"] == now["*"] == Resources()
    assert now["ops"] == Resources(cpus=8 / 3)
    assert compute_fair_shares(TREE, total) == steady  # the steady shares are unaffected


def test_an_internal_role_without_active_descendants_is_inactive() -> None:
    now = compute_fair_shares(TREE, Resources(cpus=8), active={"ops"})
    assert now["eng"] == now["eng/ml"] == now["eng/web"] == Resources()
    assert now["ops"] == Resources(cpus=8)


def test_an_active_internal_role_keeps_its_share_from_inactive_children() -> None:
    now = compute_fair_shares(TREE, Resources(cpus=9), active={"eng", "ops"})
    assert now["eng"] == Resources(cpus=6)
    assert now["eng/ml"] == now["eng/web"] == Resources()


def test_nothing_active_gives_nothing() -> None:
    now = compute_fair_shares(TREE, Resources(cpus=8), active=())
    assert all(share.is_empty() for share in now.values())


def test_every_leaf_active_equals_steady() -> None:
    total = Resources(cpus=7, mem=1000)
    leaves = {"*", "eng/ml", "eng/web", "ops"}
    assert compute_fair_shares(TREE, total, leaves) == compute_fair_shares(TREE, total)


def test_active_roles_must_be_known() -> None:
    with pytest.raises(ValueError, match="nope"):
        compute_fair_shares(TREE, Resources(cpus=1), active={"nope"})


def test_empty_inputs() -> None:
    assert compute_fair_shares({}, Resources(cpus=1)) == {}
    assert compute_fair_shares(TREE, Resources()) == dict.fromkeys(TREE, Resources())


def test_shares_from_a_roles_file() -> None:
    config = parse_roles(
        """
        [roles.eng]
        weight = 2.0
        guarantee = { cpus = 8, mem = "25%" }
        limit = { cpus = "50%" }

        [roles."eng/ml"]
        limit = { gpus = 0 }

        [roles."eng/web"]

        [roles.ops]
        guarantee = { cpus = 2 }
        """
    )
    total = Resources(cpus=40, mem=1000, gpus=4)
    roles = {
        path: ShareInput(config.spec(path).weight, guarantee, limit)
        for path, (guarantee, limit) in config.resolve(total).items()
    }
    shares = compute_fair_shares(roles, total)
    # cpus: eng weighs 2 of 4 but is limited to 50%: 20; `*` and ops 10 each.
    # mem: eng's 25% guarantee is below its weighted half. gpus: eng/ml gets none.
    assert shares == {
        "*": Resources(cpus=10, mem=250, gpus=1),
        "eng": Resources(cpus=20, mem=500, gpus=2),
        "eng/ml": Resources(cpus=10, mem=250),
        "eng/web": Resources(cpus=10, mem=250, gpus=2),
        "ops": Resources(cpus=10, mem=250, gpus=1),
    }


# Exactness at scale ------------------------------------------------------------


def test_huge_amounts_are_split_exactly() -> None:
    total = Resources(cpus=1e15, mem=999_999_999_999_999.999)
    roles = {
        "a": ShareInput(0.1),
        "b": ShareInput(0.2, guarantee=Resources(cpus=4e14)),
        "c": ShareInput(0.7, limit={"mem": 3.3e14}),
        "d": ShareInput(1e-9),
    }
    shares = shares_in_units(roles, total)
    for name, amount in total._units.items():
        assert sum(u.get(name, 0) for u in shares.values()) == amount
    assert shares == reference_shares(roles, total)


def test_huge_guarantees_above_the_total_are_scaled_exactly() -> None:
    total = Resources(cpus=1e15)
    roles = {p: ShareInput(guarantee=Resources(cpus=4e14 + i)) for i, p in enumerate("abc")}
    shares = shares_in_units(roles, total)
    assert sum(u["cpus"] for u in shares.values()) == 10**18
    assert shares == reference_shares(roles, total)


def test_breakpoints_that_tie_as_floats_are_resolved_exactly() -> None:
    # Two breakpoints 20 units apart near 5e17 round to the same float (64 apart),
    # and the answer lies between them: the float-ordered sweep must give up
    # and the exact one must find it.
    lo = {0: 499_999_999_999_999_990, 1: 499_999_999_999_999_970}
    target = sum(lo.values()) + 10
    assert lo[0] / 1 == lo[1] / 1
    assert _split_at_ratio(target, [1, 1], lo, {}, exact_sort=False) is None
    assert _split_at_ratio(target, [1, 1], lo, {}, exact_sort=True) == [lo[0], lo[1] + 10]
    roles = {
        "a": ShareInput(guarantee=Resources._from_units({"cpus": lo[0]})),
        "b": ShareInput(guarantee=Resources._from_units({"cpus": lo[1]})),
    }
    total = Resources._from_units({"cpus": target})
    assert shares_in_units(roles, total) == {"a": {"cpus": lo[0]}, "b": {"cpus": lo[1] + 10}}


def test_many_roles_agree_with_the_reference() -> None:
    roles: dict[str, ShareInput] = {}
    for i in range(600):
        weight = (0.5, 1.0, 2.0, 3.7, 0.0)[i % 5]
        guarantee = Resources(cpus=(i % 7) * 0.4) if i % 3 == 0 else Resources()
        limit = {"cpus": (i % 11) * 0.25, "gpus": float(i % 2)} if i % 4 == 1 else None
        roles[f"g{i % 6}/r{i:04d}"] = ShareInput(weight, guarantee, limit)
    total = Resources(cpus=1000, gpus=40, mem=1e6)
    assert shares_in_units(roles, total) == reference_shares(roles, total)
    active = [p for i, p in enumerate(roles) if i % 3]
    assert shares_in_units(roles, total, active) == reference_shares(roles, total, active)


# Inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [-1.0, math.nan, math.inf, True])
def test_share_input_rejects_bad_weights(weight: float) -> None:
    with pytest.raises(ValueError, match=r"^weight must be a finite number >= 0, got "):
        ShareInput(weight)


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf, 2e15])
def test_share_input_rejects_bad_limits(amount: float) -> None:
    with pytest.raises(ValueError, match="limit"):
        ShareInput(limit={"cpus": amount})


# Properties --------------------------------------------------------------------

AMOUNT = st.one_of(
    st.integers(0, 20_000),
    st.integers(0, 10**18),
    st.sampled_from([0, 1, 999, 10**18]),
)
WEIGHT = st.one_of(
    st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0]),
    st.floats(0, 1000, allow_nan=False, allow_infinity=False),
    st.floats(1e-9, 1e9),
)


@st.composite
def share_inputs(draw: st.DrawFn) -> ShareInput:
    weight = draw(WEIGHT)
    guarantee = None if draw(st.booleans()) else draw(AMOUNT)
    limit = None if draw(st.booleans()) else draw(AMOUNT)
    return ShareInput(
        weight,
        Resources._from_units({"cpus": guarantee} if guarantee else {}),
        None if limit is None else {"cpus": limit / 1000},
    )


GROUP = st.lists(share_inputs(), min_size=1, max_size=8)


def group_of(inputs: list[ShareInput]) -> dict[str, ShareInput]:
    return {f"r{i}": s for i, s in enumerate(inputs)}


def bounds(s: ShareInput) -> tuple[float, float]:
    """(guarantee, limit) in thousandths, the guarantee cut to the limit."""
    lo = s.guarantee._units.get("cpus", 0)
    hi: float = math.inf if s.limit is None else round(s.limit["cpus"] * 1000)
    return min(lo, hi), hi


@given(GROUP, AMOUNT)
@settings(max_examples=300, deadline=None)
def test_children_add_up_to_the_total_or_their_limits(inputs: list[ShareInput], t: int) -> None:
    roles = group_of(inputs)
    got = [u.get("cpus", 0) for u in shares_in_units(roles, _cpus(t)).values()]
    # A weight 0 child never goes past its guarantee: that is its top.
    top = [lo if s.weight == 0 else hi for s, (lo, hi) in ((s, bounds(s)) for s in inputs)]
    assert sum(got) == min(t, sum(top))


@given(GROUP, AMOUNT)
@settings(max_examples=300, deadline=None)
def test_children_stay_within_their_bounds_when_guarantees_fit(
    inputs: list[ShareInput], t: int
) -> None:
    roles = group_of(inputs)
    got = [u.get("cpus", 0) for u in shares_in_units(roles, _cpus(t)).values()]
    limits = [bounds(s) for s in inputs]
    for share, (_, hi) in zip(got, limits, strict=True):
        assert share <= hi
    if sum(lo for lo, _ in limits) <= t:
        for share, (lo, _) in zip(got, limits, strict=True):
            assert share >= lo


@given(GROUP, AMOUNT)
@settings(max_examples=300, deadline=None)
def test_one_level_agrees_with_the_exact_reference(inputs: list[ShareInput], t: int) -> None:
    roles = group_of(inputs)
    got = shares_in_units(roles, _cpus(t))
    assert got == reference_shares(roles, _cpus(t))
    # Each share is its exact value rounded down or up: within one thousandth.
    exact = reference_exact(
        t,
        [Fraction(s.weight) for s in inputs],
        [s.guarantee._units.get("cpus", 0) for s in inputs],
        [None if s.limit is None else round(s.limit["cpus"] * 1000) for s in inputs],
    )
    for share, x in zip(got.values(), exact, strict=True):
        assert abs(share.get("cpus", 0) - x) < 1


@given(GROUP, AMOUNT, st.data())
@settings(max_examples=300, deadline=None)
def test_raising_a_weight_never_lowers_that_share(
    inputs: list[ShareInput], t: int, data: st.DataObject
) -> None:
    i = data.draw(st.integers(0, len(inputs) - 1))
    factor = data.draw(st.floats(1, 100))
    raised = list(inputs)
    old = inputs[i]
    raised[i] = ShareInput(old.weight * factor or 1.0, old.guarantee, old.limit)
    before = shares_in_units(group_of(inputs), _cpus(t))[f"r{i}"].get("cpus", 0)
    after = shares_in_units(group_of(raised), _cpus(t))[f"r{i}"].get("cpus", 0)
    # Exactly, the share rises and every other share falls or stays; so the
    # remainders ranked above this one can only gain as many places as the
    # spare thousandths grow, and the rounded share never falls either.
    assert after >= before


@st.composite
def trees(draw: st.DrawFn) -> dict[str, ShareInput]:
    paths = draw(
        st.lists(
            st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map("/".join),
            min_size=1,
            max_size=12,
            unique=True,
        )
    )
    return {path: draw(share_inputs()) for path in paths}


@given(trees(), AMOUNT, st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_trees_agree_with_the_reference(
    roles: dict[str, ShareInput], t: int, data: st.DataObject
) -> None:
    active = data.draw(st.none() | st.lists(st.sampled_from(sorted(roles))))
    assert shares_in_units(roles, _cpus(t), active) == reference_shares(roles, _cpus(t), active)


def _cpus(amount: int) -> Resources:
    return Resources._from_units({"cpus": amount} if amount else {})


def test_public_names() -> None:
    import mesolite.master.fair_share

    assert sorted(mesolite.master.fair_share.__all__) == [
        "ROOT",
        "ShareInput",
        "compute_fair_shares",
        "role_tree",
    ]


# Shapes the tests above rarely draw: many siblings (rounding hands out the
# leftover thousandths through a partial sort), weight 0 beside limited
# siblings, totals that just fit (or just miss) everyone's limits, sub-unit
# amounts. Each is checked against the reference, exactly.

EDGE_AMOUNT = st.sampled_from([0, 1, 2, 3, 999, 1000, 1001, 2000, 2500, 3000, 4000, 4001, 10_000])


@st.composite
def edge_inputs(draw: st.DrawFn) -> ShareInput:
    weight = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0, 0.1, 7.0]))
    guarantee = draw(st.none() | EDGE_AMOUNT)
    limit = draw(st.none() | EDGE_AMOUNT)
    return ShareInput(
        weight,
        Resources._from_units({"cpus": guarantee} if guarantee else {}),
        None if limit is None else {"cpus": limit / 1000},
    )


@given(
    st.lists(edge_inputs(), min_size=1, max_size=40),
    st.sampled_from([1, 3, 17, 1000, 4000, 4001, 4002, 9999, 10_000, 123_457]),
)
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
def test_edge_shapes_agree_with_the_reference(inputs: list[ShareInput], t: int) -> None:
    roles = group_of(inputs)
    assert shares_in_units(roles, _cpus(t)) == reference_shares(roles, _cpus(t))


def test_a_weight_0_guarantee_counts_when_everyone_else_is_limited() -> None:
    # a may hold 3 CPUs, b (weight 0) gets exactly its guarantee of 2: together
    # 5 > 4, so a is not at its limit: it gets what b leaves, 2.
    roles = {
        "a": ShareInput(1.0, limit={"cpus": 3}),
        "b": ShareInput(0.0, Resources(cpus=2)),
    }
    assert shares_in_units(roles, Resources(cpus=4)) == {
        "a": {"cpus": 2000},
        "b": {"cpus": 2000},
    }


def test_weight_0_roles_without_a_guarantee_get_nothing_even_with_room_left() -> None:
    roles = {
        "a": ShareInput(1.0, limit={"cpus": 2}),
        "b": ShareInput(1.0, limit={"cpus": 2}),
        "c": ShareInput(0.0),
        "d": ShareInput(0.0),
    }
    assert shares_in_units(roles, Resources(cpus=4.001)) == {
        "a": {"cpus": 2000},
        "b": {"cpus": 2000},
        "c": {},
        "d": {},
    }


@pytest.mark.parametrize(
    "weights, total",
    [
        # 20 siblings, weights 20 down to 1, 1.051 CPUs: one thousandth is left
        # after rounding down, and it goes to the largest remainder (the first).
        ([float(w) for w in range(20, 0, -1)], 1051),
        # Remainders that tie: the leftover goes to the lower index (path order).
        ([1.0] * 10 + [3.0] + [1.0] * 9 + [3.0], 1001),
    ],
)
def test_many_siblings_hand_out_leftover_thousandths_like_the_reference(
    weights: list[float], total: int
) -> None:
    roles = {f"r{i:02d}": ShareInput(w) for i, w in enumerate(weights)}
    got = shares_in_units(roles, _cpus(total))
    assert got == reference_shares(roles, _cpus(total))
    assert sum(u.get("cpus", 0) for u in got.values()) == total


@st.composite
def sweeps(draw: st.DrawFn) -> tuple[int, list[int], dict[int, int], dict[int, int]]:
    """Inputs within `_split_at_ratio`'s preconditions: sum(lo) < target < sum(hi)."""
    n = draw(st.integers(1, 6))
    weights = [draw(st.integers(1, 7)) for _ in range(n)]
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for i in range(n):
        g = draw(st.none() | st.integers(1, 5000))
        h = draw(st.none() | st.integers(g or 0, 9000))
        if g:
            lo[i] = g
        if h is not None:
            hi[i] = h
    top = math.inf if len(hi) < n else sum(hi.values())
    floor = sum(lo.values())
    assume(floor + 1 < top)
    target = draw(st.integers(floor + 1, int(min(top - 1, floor + 20_000))))
    return target, weights, lo, hi


@given(sweeps())
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
def test_the_exact_sweep_agrees_with_the_reference(
    case: tuple[int, list[int], dict[int, int], dict[int, int]],
) -> None:
    # The float-ordered sweep gives up on ties it cannot order; the exact one,
    # ordering breakpoints g / w and h / w as fractions, must be right alone.
    target, weights, lo, hi = case
    n = len(weights)
    exact = reference_exact(
        target,
        [Fraction(w) for w in weights],
        [lo.get(i, 0) for i in range(n)],
        [hi.get(i) for i in range(n)],
    )
    expected = round_largest_remainder(exact)
    assert _split_at_ratio(target, weights, lo, hi, exact_sort=True) == expected
    assert _split_at_ratio(target, weights, lo, hi, exact_sort=False) in (None, expected)


def test_share_input_rejects_a_limit_that_is_not_a_number() -> None:
    with pytest.raises(ValueError, match=r"^limit cpus: '3' is not a number$"):
        ShareInput(limit={"cpus": "3"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"^limit gpus: True is not a number$"):
        ShareInput(limit={"gpus": True})


def test_the_largest_finite_weight_is_accepted() -> None:
    assert ShareInput(sys.float_info.max).weight == sys.float_info.max


def test_role_tree_takes_each_path_once_and_adds_every_missing_ancestor() -> None:
    assert role_tree(["b", "a", "b"]) == {ROOT: ["a", "b"]}
    assert role_tree(["a/b/c/d", "a/b/c/d"]) == {
        ROOT: ["a"],
        "a": ["a/b"],
        "a/b": ["a/b/c"],
        "a/b/c": ["a/b/c/d"],
    }
    with pytest.raises(ValueError, match=r"^the empty path is the root, not a role$"):
        role_tree(["a", ROOT])


# Weight vectors ------------------------------------------------------------------


def test_a_weight_vector_divides_each_resource_by_its_own_weights() -> None:
    # a weighs 3 for cpus and 1 for everything else, b 1 for all: the CPUs split
    # 3 : 1, memory and disk 1 : 1. Its steady share is no single multiple of b's.
    roles = {"a": ShareInput(resource_weights={"cpus": 3}), "b": ShareInput()}
    total = Resources(cpus=8, mem=1000, disk=10)
    shares = compute_fair_shares(roles, total)
    assert shares["a"] == Resources(cpus=6, mem=500, disk=5)
    assert shares["b"] == Resources(cpus=2, mem=500, disk=5)
    # The unnamed resources weigh `weight`, not 1, when it is given.
    roles = {"a": ShareInput(3.0, resource_weights={"mem": 1}), "b": ShareInput()}
    assert compute_fair_shares(roles, total)["a"] == Resources(cpus=6, mem=500, disk=7.5)


def test_weight_vectors_in_instantaneous_shares_and_below_a_parent() -> None:
    # eng's children split eng's share of each resource by their weights for it.
    roles = {
        "eng": ShareInput(resource_weights={"mem": 3}),
        "eng/ml": ShareInput(resource_weights={"cpus": 4, "mem": 0.5}),
        "eng/web": ShareInput(),
        "ops": ShareInput(),
    }
    total = Resources(cpus=10, mem=800)
    steady = compute_fair_shares(roles, total)
    assert steady["eng"] == Resources(cpus=5, mem=600)
    assert steady["eng/ml"] == Resources(cpus=4, mem=200)
    assert steady["eng/web"] == Resources(cpus=1, mem=400)
    assert steady["ops"] == Resources(cpus=5, mem=200)
    active = compute_fair_shares(roles, total, active=["eng/ml", "ops"])
    assert active["eng/ml"] == Resources(cpus=5, mem=600)
    assert active["eng/web"] == Resources()
    assert active["ops"] == Resources(cpus=5, mem=200)


def test_a_zero_weight_for_one_resource_fixes_only_that_resource() -> None:
    # Weight 0 for cpus: a gets its cpus guarantee and no more, memory by weight.
    roles = {
        "a": ShareInput(guarantee=Resources(cpus=1), resource_weights={"cpus": 0}),
        "b": ShareInput(),
    }
    shares = compute_fair_shares(roles, Resources(cpus=8, mem=100))
    assert shares["a"] == Resources(cpus=1, mem=50)
    assert shares["b"] == Resources(cpus=7, mem=50)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf"), True, "2"])
def test_share_input_rejects_bad_resource_weights(weight: object) -> None:
    with pytest.raises(ValueError, match=r"^weight for cpus must be a finite number >= 0"):
        ShareInput(resource_weights={"cpus": weight})  # type: ignore[dict-item]


@st.composite
def vector_trees(draw: st.DrawFn) -> dict[str, ShareInput]:
    """Trees whose roles may weigh cpus and mem differently, with bounds on both."""
    roles = draw(trees())
    out = {}
    for path, s in roles.items():
        vector = draw(st.dictionaries(st.sampled_from(["cpus", "mem", "gpus"]), WEIGHT))
        mem_limit = draw(st.none() | AMOUNT)
        limit = dict(s.limit or {})
        if mem_limit is not None:
            limit["mem"] = mem_limit / 1000
        out[path] = ShareInput(s.weight, s.guarantee, limit or None, vector or None)
    return out


@given(vector_trees(), AMOUNT, AMOUNT, st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_trees_with_weight_vectors_agree_with_the_reference(
    roles: dict[str, ShareInput], cpus: int, mem: int, data: st.DataObject
) -> None:
    active = data.draw(st.none() | st.lists(st.sampled_from(sorted(roles))))
    total = Resources._from_units({k: v for k, v in (("cpus", cpus), ("mem", mem)) if v})
    assert shares_in_units(roles, total, active) == reference_shares(roles, total, active)
