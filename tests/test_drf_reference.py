"""Table tests for the exact references in `mesolite.lab.drf_reference`.

The numbers come from the DRF paper (Ghodsi et al., NSDI 2011) as summarised
in the project's seed notes, or are worked out by hand in the comments.
"""

from __future__ import annotations

import doctest
from fractions import Fraction

import pytest

import mesolite.lab.drf_reference
from mesolite.lab.drf_reference import (
    Amount,
    Weight,
    asset_fairness,
    discrete_drf,
    drf,
    to_fraction,
)

# The paper's example: <9 CPUs, 18 GB>; A's tasks need <1 CPU, 4 GB>, B's <3 CPUs, 1 GB>.
PAPER_CAPACITY = {"cpus": 9, "mem": 18}
PAPER_DEMANDS = {"A": {"cpus": 1, "mem": 4}, "B": {"cpus": 3, "mem": 1}}


def test_module_examples() -> None:
    assert doctest.testmod(mesolite.lab.drf_reference).failed == 0


def test_paper_example() -> None:
    # max (x, y) s.t. x + 3y <= 9, 4x + y <= 18, 2x/9 = y/3  =>  x = 3, y = 2.
    a = drf(PAPER_CAPACITY, PAPER_DEMANDS)
    assert a.tasks == {"A": 3, "B": 2}
    assert a.dominant_shares == {"A": Fraction(2, 3), "B": Fraction(2, 3)}
    assert a.shares == a.dominant_shares  # weights 1
    assert a.allocation("A") == {"cpus": 3, "mem": 12}
    assert a.allocation("B") == {"cpus": 6, "mem": 2}
    assert a.usage() == {"cpus": 9, "mem": 14}
    assert a.saturated == {"cpus"}
    assert a.finished == frozenset()


def test_paper_example_with_whole_tasks() -> None:
    # The paper's table: B, A, A, B, A, then CPUs are used up.
    assert discrete_drf(PAPER_CAPACITY, PAPER_DEMANDS).tasks == {"A": 3, "B": 2}


def test_weights_two_to_one_give_dominant_shares_two_to_one() -> None:
    # A weighs 2: (2x/9) / 2 = y/3, so x = 3y; memory binds first
    # (4x + y = 13y = 18), giving y = 18/13, x = 54/13; CPUs 108/13 < 9.
    a = drf(PAPER_CAPACITY, PAPER_DEMANDS, weights={"A": 2})
    assert a.tasks == {"A": Fraction(54, 13), "B": Fraction(18, 13)}
    assert a.dominant_shares == {"A": Fraction(12, 13), "B": Fraction(6, 13)}
    assert a.dominant_shares["A"] == 2 * a.dominant_shares["B"]
    assert a.shares == {"A": Fraction(6, 13), "B": Fraction(6, 13)}
    assert a.saturated == {"mem"}


def test_asset_fairness_on_the_paper_example() -> None:
    # A CPU is worth two GB here, so A spends 6 per task and B 7:
    # 6x = 7y with x + 3y <= 9 binding gives y = 54/25 = 2.16, x = 63/25 = 2.52.
    a = asset_fairness(PAPER_CAPACITY, PAPER_DEMANDS)
    assert a.tasks == {"A": Fraction(63, 25), "B": Fraction(54, 25)}
    assert (float(a.tasks["A"]), float(a.tasks["B"])) == (2.52, 2.16)
    assert a.saturated == {"cpus"}
    assert a.shares["A"] == a.shares["B"] == Fraction(21, 25)
    # "A gets 2.5 CPUs and 10.1 GB, B 6.5 CPUs and 2.2 GB."
    assert {r: round(float(x), 1) for r, x in a.allocation("A").items()} == {
        "cpus": 2.5,
        "mem": 10.1,
    }
    assert {r: round(float(x), 1) for r, x in a.allocation("B").items()} == {
        "cpus": 6.5,
        "mem": 2.2,
    }


def test_asset_fairness_breaks_sharing_incentive_where_drf_does_not() -> None:
    # <30 CPUs, 30 GB>; A needs <1, 0>, B <1, 1>. Alone on half the cluster B
    # could run 15 tasks; asset fairness charges B twice per task (x = 2y,
    # x + y = 30) and gives it 10. DRF gives both 15.
    capacity = {"cpus": 30, "mem": 30}
    demands = {"A": {"cpus": 1}, "B": {"cpus": 1, "mem": 1}}
    assert asset_fairness(capacity, demands).tasks == {"A": 20, "B": 10}
    assert drf(capacity, demands).tasks == {"A": 15, "B": 15}


def test_one_resource_is_weighted_water_filling() -> None:
    # 10 CPUs; A <1> capped at 2 tasks, B <2>, C <1> with weight 2. A is
    # satisfied first; the remaining 8 CPUs split 1:2 between B and C.
    a = drf(
        {"cpus": 10},
        {"A": {"cpus": 1}, "B": {"cpus": 2}, "C": {"cpus": 1}},
        weights={"C": 2},
        max_tasks={"A": 2},
    )
    assert a.tasks == {"A": 2, "B": Fraction(4, 3), "C": Fraction(16, 3)}
    assert a.allocation("B") == {"cpus": Fraction(8, 3)}
    assert a.finished == {"A"}
    assert a.saturated == {"cpus"}


def test_finite_demand_leaves_the_rest_to_others() -> None:
    # B wants one task (dominant share 1/3); A then fills memory: 4x + 1 = 18.
    a = drf(PAPER_CAPACITY, PAPER_DEMANDS, max_tasks={"B": 1})
    assert a.tasks == {"A": Fraction(17, 4), "B": 1}
    assert a.finished == {"B"}
    assert a.saturated == {"mem"}


def test_users_that_do_not_need_a_saturated_resource_keep_filling() -> None:
    # <2 CPUs, 4 GB>; A <1, 0>, B <1, 1>, C <0, 1>. CPUs run out at level 1/2
    # (A and B hold 1 task each); C carries on with the memory B left.
    a = drf({"cpus": 2, "mem": 4}, {"A": {"cpus": 1}, "B": {"cpus": 1, "mem": 1}, "C": {"mem": 1}})
    assert a.tasks == {"A": 1, "B": 1, "C": 3}
    assert a.saturated == {"cpus", "mem"}


def test_population_monotonicity_fails_with_zero_demands() -> None:
    # The same cluster without A: memory now binds first, at level 2/3, with
    # B and C both still filling, so C ends with 8/3 tasks instead of 3. The
    # paper's argument needs every saturation to freeze every user, which
    # holds when all users need the same resources (the property test).
    without_a = drf({"cpus": 2, "mem": 4}, {"B": {"cpus": 1, "mem": 1}, "C": {"mem": 1}})
    assert without_a.tasks == {"B": Fraction(4, 3), "C": Fraction(8, 3)}


def test_drf_is_not_resource_monotone() -> None:
    # <1 CPU, 1 GB>; A <0, 1>, B <2, 1>. B's dominant resource is CPU, so
    # x = 2y and x + y = 1: A gets 2/3. With a second CPU B's dominant share
    # halves, x = y, and A gets 1/2: more resources, less for A. The paper
    # shows no policy has sharing incentive, Pareto efficiency and this.
    demands = {"A": {"mem": 1}, "B": {"cpus": 2, "mem": 1}}
    assert drf({"cpus": 1, "mem": 1}, demands).tasks["A"] == Fraction(2, 3)
    assert drf({"cpus": 2, "mem": 1}, demands).tasks["A"] == Fraction(1, 2)


def test_a_resource_with_no_capacity_stops_only_those_who_need_it() -> None:
    a = drf({"cpus": 4}, {"gpu": {"cpus": 1, "gpus": 1}, "cpu": {"cpus": 1}})
    assert a.tasks == {"gpu": 0, "cpu": 4}
    assert a.dominant_shares["gpu"] == 0
    assert a.saturated == {"cpus", "gpus"}
    assert a.capacity["gpus"] == 0  # demanded but absent: capacity 0


def test_a_resource_nobody_demands_is_never_saturated() -> None:
    a = drf({"cpus": 4, "disk": 100}, {"A": {"cpus": 1}})
    assert a.tasks == {"A": 4}
    assert a.saturated == {"cpus"}
    assert a.usage() == {"cpus": 4, "disk": 0}


def test_a_limit_of_zero_tasks() -> None:
    a = drf({"cpus": 4}, {"A": {"cpus": 1}, "B": {"cpus": 1}}, max_tasks={"A": 0})
    assert a.tasks == {"A": 0, "B": 4}
    assert a.finished == {"A"}


def test_floats_are_read_as_the_decimals_they_print_as() -> None:
    assert to_fraction(0.1) == Fraction(1, 10)
    assert drf({"cpus": 0.3}, {"A": {"cpus": 0.1}}).tasks == {"A": 3}
    # Resources keep thousandths, so a mem amount of 4096.5 MB is exact too.
    assert drf({"mem": 8193.0}, {"A": {"mem": 4096.5}}).tasks == {"A": 2}


def test_whole_tasks_go_to_the_lowest_share_and_skip_what_does_not_fit() -> None:
    # 10 CPUs, tasks of 4, 4 and 3: A and B (listed first, so first on ties)
    # take 8 and C's 3 no longer fits. Divisible tasks would give each 10/3.
    demands = {"A": {"cpus": 4}, "B": {"cpus": 4}, "C": {"cpus": 3}}
    assert discrete_drf({"cpus": 10}, demands).tasks == {"A": 1, "B": 1, "C": 0}
    assert drf({"cpus": 10}, demands).allocation("C") == {"cpus": Fraction(10, 3)}
    # Listed first, C gets two tasks and B none.
    reordered = {"C": demands["C"], "A": demands["A"], "B": demands["B"]}
    assert discrete_drf({"cpus": 10}, reordered).tasks == {"C": 2, "A": 1, "B": 0}


def test_whole_tasks_respect_weights_and_limits() -> None:
    # Equal tasks, weight 2:1: G gets two tasks for each of P's until P's limit.
    demands = {"G": {"cpus": 1}, "P": {"cpus": 1}}
    assert discrete_drf({"cpus": 12}, demands, weights={"G": 2}).tasks == {"G": 8, "P": 4}
    limited = discrete_drf({"cpus": 12}, demands, weights={"G": 2}, max_tasks={"P": 2})
    assert limited.tasks == {"G": 10, "P": 2}
    assert limited.finished == {"P"}
    assert limited.saturated == {"cpus"}


@pytest.mark.parametrize(
    "capacity, demands, weights, max_tasks, message",
    [
        ({"cpus": -1}, {"A": {"cpus": 1}}, None, None, "capacity of 'cpus' is negative"),
        ({"cpus": 1}, {"A": {"cpus": -1}}, None, None, "negative amount"),
        ({"cpus": 1}, {"A": {"cpus": 0}}, None, None, "demands nothing"),
        ({"cpus": 1}, {"A": {"cpus": 1}}, {"A": 0}, None, "must be positive"),
        ({"cpus": 1}, {"A": {"cpus": 1}}, {"Z": 1}, None, "unknown users"),
        ({"cpus": 1}, {"A": {"cpus": 1}}, None, {"A": -1}, "negative"),
        ({"cpus": float("nan")}, {"A": {"cpus": 1}}, None, None, "not finite"),
    ],
)
def test_bad_input_is_rejected(
    capacity: dict[str, Amount],
    demands: dict[str, dict[str, Amount]],
    weights: dict[str, Amount] | None,
    max_tasks: dict[str, Amount | None] | None,
    message: str,
) -> None:
    for policy in (drf, asset_fairness, discrete_drf):
        with pytest.raises(ValueError, match=message):
            policy(capacity, demands, weights, max_tasks)


def test_whole_tasks_need_a_whole_limit() -> None:
    with pytest.raises(ValueError, match="whole number"):
        discrete_drf({"cpus": 4}, {"A": {"cpus": 1}}, max_tasks={"A": Fraction(3, 2)})
    assert drf({"cpus": 4}, {"A": {"cpus": 1}}, max_tasks={"A": Fraction(3, 2)}).tasks == {
        "A": Fraction(3, 2)
    }


def test_amounts_must_be_numbers() -> None:
    with pytest.raises(TypeError):
        to_fraction(True)
    with pytest.raises(TypeError):
        to_fraction("1")  # type: ignore[arg-type]


# Weight vectors (the paper's weighted DRF: s_i = max_r(u_ir / w_ir)) -----------


def test_weight_vectors_on_the_paper_example() -> None:
    # A weighs 2 for memory, B 3 for CPUs. A's weighted dominant share is
    # max(x/9, (4x/18)/2) = x/9, B's max((3y/9)/3, y/18) = y/9: so x = y, and
    # CPUs bind first: x + 3x = 9, x = y = 9/4 (memory: 45/4 < 18).
    a = drf(PAPER_CAPACITY, PAPER_DEMANDS, weights={"A": {"mem": 2}, "B": {"cpus": 3}})
    assert a.tasks == {"A": Fraction(9, 4), "B": Fraction(9, 4)}
    assert a.shares == {"A": Fraction(1, 4), "B": Fraction(1, 4)}
    assert a.dominant_shares == {"A": Fraction(1, 2), "B": Fraction(3, 4)}
    assert a.weights == {"A": 1, "B": 1}
    assert a.resource_weights == {"A": {"mem": 2}, "B": {"cpus": 3}}
    assert a.saturated == {"cpus"}


def test_weight_vectors_of_the_end_to_end_test() -> None:
    # tests/test_roles_cluster.py: <12 CPUs, 36 GB>, A {mem: 3}, B {cpus: 4}.
    # A: max(x/12, (4x/36)/3) = x/12; B: max((3y/12)/4, y/36) = y/16; x/12 = y/16
    # and x + 3y = 5x = 12: x = 12/5, y = 16/5. Whole tasks, one at a time: 3 and 3.
    capacity = {"cpus": 12, "mem": 36}
    weights: dict[str, Weight] = {"A": {"mem": 3}, "B": {"cpus": 4}}
    a = drf(capacity, PAPER_DEMANDS, weights=weights)
    assert a.tasks == {"A": Fraction(12, 5), "B": Fraction(16, 5)}
    assert discrete_drf(capacity, PAPER_DEMANDS, weights=weights).tasks == {"A": 3, "B": 3}
    # Without the weights, or with each one on the other resource, it differs.
    assert discrete_drf(capacity, PAPER_DEMANDS).tasks == {"A": 6, "B": 2}
    swapped: dict[str, Weight] = {"A": {"cpus": 3}, "B": {"mem": 4}}
    assert discrete_drf(capacity, PAPER_DEMANDS, weights=swapped).tasks == {"A": 6, "B": 2}


def test_a_vector_of_equal_weights_is_that_weight() -> None:
    vector = drf(PAPER_CAPACITY, PAPER_DEMANDS, weights={"A": {"cpus": 2, "mem": 2}})
    scalar = drf(PAPER_CAPACITY, PAPER_DEMANDS, weights={"A": 2})
    assert vector.tasks == scalar.tasks == {"A": Fraction(54, 13), "B": Fraction(18, 13)}
    assert vector.shares == scalar.shares


def test_asset_fairness_divides_each_share_by_its_weight() -> None:
    # A spends 1/9 + 4/18 = 1/3 per task; weighted {mem: 2}, 1/9 + 1/9 = 2/9.
    # B spends 3/9 + 1/18 = 7/18. 2x/9 = 7y/18 gives x = 7y/4; CPUs bind first:
    # 7y/4 + 3y = 19y/4 = 9, y = 36/19, x = 63/19 (memory 288/19 < 18).
    a = asset_fairness(PAPER_CAPACITY, PAPER_DEMANDS, weights={"A": {"mem": 2}})
    assert a.tasks == {"A": Fraction(63, 19), "B": Fraction(36, 19)}


def test_each_weight_of_a_vector_must_be_positive() -> None:
    for policy in (drf, asset_fairness, discrete_drf):
        with pytest.raises(ValueError, match="weight of 'A' for 'mem' must be positive"):
            policy({"cpus": 1}, {"A": {"cpus": 1}}, {"A": {"mem": 0}})
