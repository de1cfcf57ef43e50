import math

import pytest

from mesolite.resources import InvalidResources, Resources


def test_parse_mesos_flag_format() -> None:
    r = Resources.parse("cpus:4;mem:14336; disk:100 ;gpus:1")
    assert r.to_dict() == {"cpus": 4.0, "disk": 100.0, "gpus": 1.0, "mem": 14336.0}


@pytest.mark.parametrize(
    "text, reason",
    [
        ("cpus:-1", "negative"),
        ("cpus:nan", "not finite"),
        ("cpus:inf", "not finite"),
        ("cpus", "NAME:AMOUNT"),
        ("cpus:many", "not a number"),
        ("9lives:1", "invalid resource name"),
        ("cpus:1;cpus:2", "twice"),
    ],
)
def test_parse_rejects_bad_input_with_a_clear_message(text: str, reason: str) -> None:
    with pytest.raises(InvalidResources, match=reason):
        Resources.parse(text)


@pytest.mark.parametrize("amount", [-0.5, math.nan, math.inf, -math.inf])
def test_constructor_rejects_bad_amounts(amount: float) -> None:
    with pytest.raises(InvalidResources):
        Resources(cpus=amount)


def test_arithmetic_is_exact_in_thousandths() -> None:
    total = Resources(cpus=1.0)
    tenth = Resources(cpus=0.1)
    left = total
    for _ in range(10):
        left = left - tenth
    assert left.is_empty()
    assert sum((tenth for _ in range(10)), Resources()) == total


def test_subtracting_more_than_held_raises() -> None:
    with pytest.raises(InvalidResources, match="negative"):
        Resources(cpus=1) - Resources(cpus=2)
    with pytest.raises(InvalidResources):
        Resources(cpus=1) - Resources(mem=1)


def test_contains_and_zero_amounts() -> None:
    big = Resources(cpus=4, mem=1024)
    assert big.contains(Resources(cpus=4))
    assert not big.contains(Resources(cpus=4, gpus=1))
    assert Resources(cpus=0, mem=0).is_empty()
    assert Resources(cpus=1, mem=0) == Resources(cpus=1)


def test_remainder_is_what_whole_copies_leave() -> None:
    agent = Resources(cpus=4, mem=14336, gpus=1)
    # Three <1 CPU, 4 GB> fit (memory runs out first): <1 CPU, 2 GB, 1 GPU> are left.
    assert agent.remainder(Resources(cpus=1, mem=4096)) == Resources(cpus=1, mem=2048, gpus=1)
    # Exact in thousandths: ten 0.1 CPUs fill 1 CPU (1 // 0.1 == 9.0 in floats).
    assert Resources(cpus=1).remainder(Resources(cpus=0.1)).is_empty()
    assert Resources(cpus=1.05).remainder(Resources(cpus=0.1)) == Resources(cpus=0.05)
    # No copy fits: all is left; copies of nothing take nothing.
    assert agent.remainder(Resources(cpus=1, disk=1)) == agent
    assert agent.remainder(Resources()) == agent


def test_shares_of_total() -> None:
    used = Resources(cpus=3, mem=1024)
    assert used.shares(Resources(cpus=9, mem=18432)) == pytest.approx(
        {"cpus": 1 / 3, "mem": 1024 / 18432}
    )
