"""The share policies on their own: what a holding counts as under drf, asset and slots."""

from __future__ import annotations

import math

import pytest

from mesolite.master.policies import (
    POLICIES,
    AssetPolicy,
    DRFPolicy,
    SharePolicy,
    SlotsPolicy,
    make_policy,
    weighted_share,
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


# Weight vectors: each resource's part divided by its own weight -----------------


def test_drf_with_a_weight_vector_takes_the_largest_share_over_its_weight() -> None:
    held = Resources(cpus=2, mem=8192)  # 1/4 of the CPUs, 1/2 of the memory
    # The paper's s_i = max_r(u_ir / w_ir): mem 1/2 / 4 = 1/8 < cpus 1/4 / 1.
    assert weighted_share(DRFPolicy(), held, CLUSTER, 1.0, {"mem": 4}) == 1 / 4
    # Favoured on CPUs instead, memory dominates: 1/2 against (1/4) / 4.
    assert weighted_share(DRFPolicy(), held, CLUSTER, 1.0, {"cpus": 4}) == 1 / 2
    # Unnamed resources weigh the scalar weight, 2 here: max(1/4 / 8, 1/2 / 2).
    assert weighted_share(DRFPolicy(), held, CLUSTER, 2.0, {"cpus": 8}) == 1 / 4
    # A resource the holding lacks, or the cluster lacks, counts for nothing.
    assert weighted_share(DRFPolicy(), Resources(cpus=2, gpus=1), CLUSTER, 1.0, {"gpus": 0}) == (
        1 / 4
    )


def test_asset_with_a_weight_vector_adds_each_share_over_its_weight() -> None:
    held = Resources(cpus=2, mem=8192)
    assert weighted_share(AssetPolicy(), held, CLUSTER, 1.0, {"cpus": 2}) == 1 / 8 + 1 / 2
    assert weighted_share(AssetPolicy(), held, CLUSTER, 4.0, {"cpus": 2}) == 1 / 8 + 1 / 8


def test_slots_with_a_weight_vector_divide_each_resource_s_slot_count() -> None:
    slots = SlotsPolicy(slot=Resources(cpus=1, mem=2048))
    # 8 slots in the cluster; the holding needs 2 slots of CPU and 4 of memory.
    held = Resources(cpus=2, mem=8192)
    assert weighted_share(slots, held, CLUSTER, 1.0, {"mem": 4}) == 2 / 8
    assert weighted_share(slots, held, CLUSTER, 1.0, {"cpus": 4}) == 4 / 8
    # Memory, unnamed, weighs the scalar weight 2: max(2 / 4, 4 / 2) slots of 8.
    assert weighted_share(slots, held, CLUSTER, 2.0, {"cpus": 4}) == 2 / 8
    assert weighted_share(slots, held, Resources(cpus=0.5, mem=8192), 1.0, {"mem": 2}) == 0.0
    # A cluster of exactly one slot: holding it is all of it, weighted.
    one = Resources(cpus=1, mem=2048)
    assert weighted_share(slots, one, one, 1.0, {"mem": 2}) == 1.0


@pytest.mark.parametrize("policy", [DRFPolicy(), AssetPolicy(), SlotsPolicy()])
def test_a_vector_of_equal_weights_is_the_scalar_weight(policy: SharePolicy) -> None:
    held = Resources(cpus=3, mem=5000, disk=7)
    total = Resources(cpus=8, mem=16384, disk=100)
    vector = {"cpus": 2.5, "mem": 2.5, "disk": 2.5}
    assert weighted_share(policy, held, total, 2.5, vector) == pytest.approx(
        weighted_share(policy, held, total, 2.5), rel=1e-15
    )
    assert weighted_share(policy, held, total, 2.5) == policy.share(held, total) / 2.5


@pytest.mark.parametrize("policy", [DRFPolicy(), AssetPolicy(), SlotsPolicy()])
def test_a_zero_weight_counts_only_for_resources_held(policy: SharePolicy) -> None:
    # Weight 0 for memory: any memory held makes the share infinite (last in
    # line), none held changes nothing, as a scalar weight of 0 does.
    assert weighted_share(policy, Resources(cpus=2, mem=1), CLUSTER, 1.0, {"mem": 0}) == math.inf
    assert weighted_share(policy, Resources(cpus=2), CLUSTER, 1.0, {"mem": 0}) == (
        weighted_share(policy, Resources(cpus=2), CLUSTER, 1.0)
    )
    assert weighted_share(policy, Resources(cpus=2), CLUSTER, 0.0) == math.inf
    assert weighted_share(policy, Resources(), CLUSTER, 0.0) == 0.0
    assert weighted_share(policy, Resources(), CLUSTER, 0.0, {"cpus": 0}) == 0.0
