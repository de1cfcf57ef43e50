"""CEEI (`mesolite.lab.ceei`): the paper's numbers, exact answers where they are
known in closed form, and the optimality conditions on random instances.

The solver is scipy's; these tests check its answers by means that share no code
with it: rational closed forms (one resource; two users on two resources), and
the KKT conditions of the Eisenberg-Gale program (feasibility, prices >= 0 only
on resources used up, each user spending its income), within the error bound
the answer carries.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesolite.lab.ceei import CEEIAllocation, CEEIError, ceei

PAPER_CAPACITY = {"cpus": 9, "mem": 18}
PAPER_DEMANDS = {"A": {"cpus": 1, "mem": 4}, "B": {"cpus": 3, "mem": 1}}
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def close(a: CEEIAllocation, user: str, exact: Fraction) -> bool:
    """Within the proven bound, and in fact within 1e-9 (the bound is loose)."""
    x = a.tasks[user]
    return abs(x - exact) <= a.error[user] and abs(x - exact) <= 1e-9 * max(Fraction(1), exact)


def test_paper_example() -> None:
    # max x y s.t. x + 3y <= 9, 4x + y <= 18: both bind, x = 45/11, y = 18/11.
    a = ceei(PAPER_CAPACITY, PAPER_DEMANDS)
    assert close(a, "A", Fraction(45, 11)) and close(a, "B", Fraction(18, 11))
    # "A gets 4.1 CPUs and 16.4 GB, B 4.9 CPUs and 1.6 GB."
    assert {r: round(v, 1) for r, v in a.allocation("A").items()} == {"cpus": 4.1, "mem": 16.4}
    assert {r: round(v, 1) for r, v in a.allocation("B").items()} == {"cpus": 4.9, "mem": 1.6}
    # The market prices (incomes summing to 1): b_i = x_i (d_i . p) for both
    # users gives p_cpus = 9/10, p_mem = 1/10 for all of each resource.
    assert a.prices == pytest.approx({"cpus": 0.9, "mem": 0.1}, abs=1e-12)
    # The stated tolerance: a proven bound, about 1e-7 of what each could run alone.
    assert a.error["A"] < 1e-6 * 4.5 and a.error["B"] < 1e-6 * 3
    assert a.usage() == pytest.approx({"cpus": 9, "mem": 18})


def test_one_resource_is_split_by_income() -> None:
    a = ceei({"cpus": 12}, {"A": {"cpus": 1}, "B": {"cpus": 2}, "C": {"cpus": 3}})
    # Equal incomes buy a third of the CPUs each: 4 CPUs.
    for user, per_task in (("A", 1), ("B", 2), ("C", 3)):
        assert close(a, user, Fraction(4, per_task))
    weighted = ceei({"cpus": 12}, {"A": {"cpus": 1}, "B": {"cpus": 1}}, {"A": 2})
    assert close(weighted, "A", Fraction(8)) and close(weighted, "B", Fraction(4))


def test_a_user_needing_a_resource_with_no_capacity_gets_nothing() -> None:
    a = ceei({"cpus": 4}, {"gpu": {"cpus": 1, "gpus": 1}, "cpu": {"cpus": 1}})
    assert a.tasks["gpu"] == 0 and close(a, "cpu", Fraction(4))
    nobody = ceei({"cpus": 4}, {"gpu": {"gpus": 1}})
    assert nobody.tasks == {"gpu": 0} and nobody.prices == {}


def test_an_answer_that_cannot_be_certified_is_refused() -> None:
    with pytest.raises(CEEIError, match="not certified"):
        ceei(PAPER_CAPACITY, PAPER_DEMANDS, tolerance=1e-12)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="an income per user, not a weight vector"):
        ceei(PAPER_CAPACITY, PAPER_DEMANDS, {"A": {"cpus": 2}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="must be positive"):
        ceei(PAPER_CAPACITY, PAPER_DEMANDS, {"A": 0})
    with pytest.raises(ValueError, match="demands nothing"):
        ceei(PAPER_CAPACITY, {"A": {"cpus": 0}})


def two_users_exact(
    capacity: dict[str, int], a: dict[str, int], b: dict[str, int]
) -> tuple[Fraction, Fraction]:
    """max log x + log y s.t. x a_r + y b_r <= C_r, exactly (equal incomes).

    The optimum is where one constraint alone would put it (x = C_r / (2 a_r),
    y = C_r / (2 b_r)) if that is feasible, else at a vertex where two bind: take
    the feasible candidate with the largest product.
    """
    rows = [
        (Fraction(a.get(r, 0)), Fraction(b.get(r, 0)), Fraction(c)) for r, c in capacity.items()
    ]
    rows = [(p, q, c) for p, q, c in rows if p or q]
    candidates: list[tuple[Fraction, Fraction]] = []
    for p, q, c in rows:
        if p and q:
            candidates.append((c / (2 * p), c / (2 * q)))
    for i, (p1, q1, c1) in enumerate(rows):
        for p2, q2, c2 in rows[i + 1 :]:
            det = p1 * q2 - p2 * q1
            if det:
                candidates.append(((c1 * q2 - c2 * q1) / det, (p1 * c2 - p2 * c1) / det))
    feasible = [
        (x, y)
        for x, y in candidates
        if x > 0 and y > 0 and all(x * p + y * q <= c for p, q, c in rows)
    ]
    return max(feasible, key=lambda xy: xy[0] * xy[1])


@PROPERTY
@given(
    st.dictionaries(st.sampled_from(["r0", "r1", "r2"]), st.integers(1, 30), min_size=1),
    st.data(),
)
def test_two_users_agree_with_the_exact_closed_form(
    capacity: dict[str, int], data: st.DataObject
) -> None:
    names = sorted(capacity)
    demand = st.fixed_dictionaries({r: st.integers(1, 6) for r in names})
    a, b = data.draw(demand), data.draw(demand)
    got = ceei(capacity, {"A": a, "B": b})
    x, y = two_users_exact(capacity, a, b)
    assert abs(got.tasks["A"] - x) <= got.error["A"]
    assert abs(got.tasks["B"] - y) <= got.error["B"]


@st.composite
def markets(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, dict[str, int]], dict[str, int]]:
    names = [f"r{k}" for k in range(draw(st.integers(1, 4)))]
    capacity = {r: draw(st.integers(1, 30)) for r in names}
    demands = {}
    for k in range(draw(st.integers(1, 6))):
        demand = {r: draw(st.integers(0, 7)) for r in names}
        if not any(demand.values()):
            demand[names[0]] = 1
        demands[f"u{k}"] = demand
    incomes = {u: draw(st.integers(1, 4)) for u in demands}
    return capacity, demands, incomes


@PROPERTY
@given(markets())
def test_the_answer_meets_the_optimality_conditions(
    market: tuple[dict[str, int], dict[str, dict[str, int]], dict[str, int]],
) -> None:
    """KKT for max sum b_i log x_i s.t. sum_i x_i d_ir / C_r <= 1, checked directly."""
    capacity, demands, incomes = market
    a = ceei(capacity, demands, incomes)
    total = sum(incomes.values())
    used = a.usage()
    slack = {r: 1 - used[r] / capacity[r] for r in capacity}
    for r, price in a.prices.items():
        assert price >= 0
        assert slack[r] >= -1e-9  # feasible
        # Priced only if used up: within what the certified error of the tasks (each
        # user's `error`) can leave unused of r, as the answer is only that close to
        # the optimum, where a priced resource is used up exactly.
        unused_within_error = sum(
            a.error[u] * d.get(r, 0) / capacity[r] for u, d in demands.items()
        )
        assert price == 0 or abs(slack[r]) <= unused_within_error + 1e-12
    for u, demand in demands.items():
        # Each user spends exactly its income at these prices (and can afford no more).
        cost = sum(a.prices[r] * d / capacity[r] for r, d in demand.items() if d)
        assert math.isclose(a.tasks[u] * cost, incomes[u] / total, rel_tol=1e-7), u
        # The bound is within the stated tolerance of what u could run alone.
        alone = min(capacity[r] / d for r, d in demand.items() if d)
        assert a.error[u] <= 1e-5 * alone
