"""The share policies on their own: what a holding counts as under drf, asset and slots."""

from __future__ import annotations

import pytest

from mesolite.master.policies import (
    POLICIES,
    AssetPolicy,
    DRFPolicy,
    SharePolicy,
    SlotsPolicy,
    make_policy,
)
from mesolite.resources import Resources

CLUSTER = Resources(cpus=8, mem=16384)


@pytest.mark.parametrize(
    "name, kind", [("drf", DRFPolicy), ("asset", AssetPolicy), ("slots", SlotsPolicy)]
)
def test_make_policy_by_name(name: str, kind: type[SharePolicy]) -> None:
    policy = make_policy(name)
    assert isinstance(policy, kind)
    assert policy.name == name
    assert name in POLICIES


@pytest.mark.parametrize("name", ["", "DRF", "slot", "fair"])
def test_an_unknown_policy_is_refused_with_the_choices(name: str) -> None:
    with pytest.raises(ValueError) as raised:
        make_policy(name)
    assert str(raised.value) == f"unknown policy {name!r}; choose one of drf, asset, slots"


def test_drf_counts_the_largest_fraction() -> None:
    drf = DRFPolicy()
    assert drf.share(Resources(cpus=2, mem=2048), CLUSTER) == 2 / 8
    assert drf.share(Resources(cpus=1, mem=8192), CLUSTER) == 8192 / 16384
    assert drf.share(Resources(), CLUSTER) == 0.0
    # A resource the cluster lacks (or has none of) does not count.
    assert drf.share(Resources(cpus=1, gpus=4), CLUSTER) == 1 / 8


def test_asset_adds_the_fractions() -> None:
    asset = AssetPolicy()
    assert asset.share(Resources(cpus=2, mem=4096), CLUSTER) == 2 / 8 + 4096 / 16384
    assert asset.share(Resources(cpus=1, gpus=4), CLUSTER) == 1 / 8
    assert asset.share(Resources(), CLUSTER) == 0.0


def test_a_slot_must_have_a_size() -> None:
    with pytest.raises(ValueError, match=r"^a slot must have a size$"):
        SlotsPolicy(slot=Resources())


def test_slots_round_each_resource_up_and_take_the_largest() -> None:
    slots = SlotsPolicy(slot=Resources(cpus=1, mem=2048))
    assert slots.slots(Resources()) == 0
    assert slots.slots(Resources(cpus=1)) == 1  # no memory at all: 0 slots of it
    assert slots.slots(Resources(mem=2049)) == 2
    assert slots.slots(Resources(cpus=2.5, mem=100)) == 3
    assert slots.slots(Resources(cpus=0.001, disk=10**6)) == 1  # disk is not in the slot


def test_slots_share_is_slots_over_whole_slots_in_the_cluster() -> None:
    slots = SlotsPolicy(slot=Resources(cpus=1, mem=2048))
    # 2.5 CPUs and 8 GB hold min(2, 4) = 2 whole slots (not 2.5).
    assert slots.share(Resources(cpus=1, mem=10), Resources(cpus=2.5, mem=8192)) == 1 / 2
    # Exactly one slot: a holding of one slot is all of it.
    assert slots.share(Resources(cpus=1, mem=2048), Resources(cpus=1, mem=2048)) == 1.0
    # Less than one slot (or none of a slot's resources): every share is 0.
    assert slots.share(Resources(cpus=0.5), Resources(cpus=0.5, mem=4096)) == 0.0
    assert slots.share(Resources(cpus=1), Resources(cpus=8)) == 0.0


def test_a_missing_resource_counts_as_none_of_it() -> None:
    # A slot with a tiny amount of a resource the cluster lacks: 0 such slots,
    # so the cluster holds no whole slot at all.
    slots = SlotsPolicy(slot=Resources(cpus=1, mem=0.001))
    assert slots.share(Resources(cpus=1), Resources(cpus=4)) == 0.0
