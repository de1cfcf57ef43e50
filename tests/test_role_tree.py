"""Hierarchical allocation: the role tree's order, guarantees, limits and policies."""

from __future__ import annotations

import pytest

from mesolite.master.allocator import Allocation, Allocator, RoleSettings
from mesolite.master.policies import AssetPolicy, SlotsPolicy
from mesolite.master.role_tree import RoleTree
from mesolite.resources import Resources
from tests.simulate import FakeClock, run_one_task_per_offer

CPU = Resources(cpus=1, mem=64)
ONE_CPU_AGENT = Resources(cpus=1, mem=1024)


def cluster(agents: int, agent: Resources = ONE_CPU_AGENT) -> Allocator:
    allocator = Allocator(FakeClock())
    for i in range(agents):
        allocator.add_agent(f"s{i}", agent)
    return allocator


def test_weights_apply_at_every_level_of_the_tree() -> None:
    allocator = cluster(16)
    allocator.configure_roles({"eng": RoleSettings(weight=3.0)})
    for fid, role in [("ml", "eng/ml"), ("web", "eng/web"), ("ops", "ops")]:
        allocator.add_framework(fid, role)
    running = run_one_task_per_offer(allocator, dict.fromkeys(["ml", "web", "ops"], CPU))
    # eng (weight 3) : ops (weight 1) = 12 : 4, and eng's 12 split evenly below it.
    assert running == {"ml": 6, "web": 6, "ops": 4}
    tree = allocator.roles
    assert tree.role_allocation("eng")["cpus"] == 12
    assert tree.role_share("eng") == pytest.approx(tree.role_share("ops"))


def test_a_role_below_its_guarantee_is_served_first() -> None:
    allocator = cluster(8)
    allocator.configure_roles({"gold": RoleSettings(guarantee=Resources(cpus=6))})
    allocator.add_framework("other", "*")  # subscribed first: wins ties
    allocator.add_framework("g", "gold")
    running = run_one_task_per_offer(allocator, {"other": CPU, "g": CPU})
    assert running == {"g": 6, "other": 2}


def test_without_the_guarantee_the_same_cluster_splits_evenly() -> None:
    allocator = cluster(8)
    allocator.add_framework("other", "*")
    allocator.add_framework("g", "gold")
    assert run_one_task_per_offer(allocator, {"other": CPU, "g": CPU}) == {"g": 4, "other": 4}


def test_a_role_never_receives_more_than_its_limit() -> None:
    allocator = cluster(2, Resources(cpus=4, mem=4096, gpus=1))
    allocator.configure_roles({"capped": RoleSettings(limit={"cpus": 3, "gpus": 0})})
    allocator.add_framework("c", "capped/sub")  # the limit counts everything below it
    decisions = allocator.allocate()
    assert sum(d.resources.get_amount("cpus") for d in decisions) == 3
    assert all(d.resources.get_amount("mem") == 4096 for d in decisions)  # mem is not limited
    assert all("gpus" not in d.resources for d in decisions)  # a limit of 0 allows none
    # At its CPU limit it is still offered what it does not limit: the other agent's memory.
    assert sorted(str(d.resources) for d in decisions) == ["cpus:3;mem:4096", "mem:4096"]
    assert allocator.roles.role_allocation("capped")["cpus"] == 3
    # The rest goes to an unlimited role as soon as there is one.
    allocator.add_framework("free", "*")
    later = allocator.allocate()
    assert {d.framework_id for d in later} == {"free"}
    assert sum(d.resources["cpus"] for d in later) == 5
    assert sum(d.resources["gpus"] for d in later) == 2


def test_frameworks_of_an_inner_role_share_with_its_children() -> None:
    allocator = cluster(8)
    allocator.add_framework("own", "eng")
    allocator.add_framework("child", "eng/ml")
    allocator.add_framework("outside", "ops")
    running = run_one_task_per_offer(allocator, dict.fromkeys(["own", "child", "outside"], CPU))
    assert running == {"own": 2, "child": 2, "outside": 4}


def test_zero_weight_role_gets_only_what_nobody_else_wants() -> None:
    allocator = cluster(4)
    allocator.configure_roles({"scavenger": RoleSettings(weight=0.0)})
    allocator.add_framework("s", "scavenger")
    allocator.add_framework("a", "*")
    need = {"s": CPU, "a": Resources(cpus=1, mem=64)}
    running = run_one_task_per_offer(allocator, need)
    # Both start at share 0 and `*` (created first) wins the tie: a gets one
    # agent. The scavenger, still at 0, gets the next; from then on its
    # weighted share is infinite and it goes last, so a gets the other two.
    assert running == {"a": 3, "s": 1}


def test_reconfiguring_roles_takes_effect_and_forgets_old_settings() -> None:
    allocator = cluster(4)
    allocator.configure_roles({"a": RoleSettings(weight=3.0)})
    assert allocator.roles.role_weight("a") == 3.0
    allocator.configure_roles({})
    assert not allocator.roles.has_role("a")  # unused and no longer configured
    allocator.add_framework("f", "a")
    assert allocator.roles.role_weight("a") == 1.0


def test_activity_follows_frameworks_that_want_offers() -> None:
    tree = RoleTree()
    tree.set_total(Resources(cpus=4))
    tree.add_framework("f", "eng/ml", wants=True)
    assert tree.active_roles() == {"eng", "eng/ml"}
    tree.set_wants("f", False)
    assert tree.active_roles() == set()
    assert [fid for fid, _ in tree.candidates()] == []


@pytest.mark.parametrize(
    "policy, expected",
    [
        # The DRF paper's example scaled by 10 (<90 CPUs, 180 GB>; A <1 CPU, 4 GB>,
        # B <3 CPUs, 1 GB>). DRF's fractional answer (30, 20) is reached exactly.
        # Asset fairness' fractional answer is (25.2, 21.6); task by task B gets
        # 21 and A 25, leaving 2 CPUs that B (3 CPUs a task) cannot use, so A
        # takes them (Pareto efficiency): (27, 21).
        (None, (30, 20)),
        (AssetPolicy(), (27, 21)),
    ],
)
def test_policies_reach_their_own_equilibrium(
    policy: AssetPolicy | None, expected: tuple[int, int]
) -> None:
    allocator = Allocator(FakeClock(), policy=policy)
    allocator.add_agent("s1", Resources(cpus=90, mem=180 * 1024))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")
    demands = {"A": Resources(cpus=1, mem=4096), "B": Resources(cpus=3, mem=1024)}
    running = run_one_task_per_offer(allocator, demands)
    assert (running["A"], running["B"]) == expected


def test_slots_policy_counts_slots_not_resources() -> None:
    policy = SlotsPolicy(slot=Resources(cpus=1, mem=2048))
    total = Resources(cpus=8, mem=16384)  # 8 slots
    assert policy.slots(Resources(cpus=1, mem=10240)) == 5
    assert policy.share(Resources(cpus=0.1, mem=100), total) == pytest.approx(1 / 8)
    assert policy.share(Resources(cpus=2, mem=1024), total) == pytest.approx(2 / 8)


# Limits, guarantees and ties, each set up so that one known bug changes the answer.


def test_a_child_limit_above_its_parents_is_held_to_the_parents() -> None:
    # eng may hold 2 CPUs, eng/ml (alone in it) 3: ml is offered 2, the lower of
    # the two. A nested limit taking the larger headroom would offer 3.
    allocator = cluster(1, Resources(cpus=4, mem=4096))
    allocator.configure_roles(
        {"eng": RoleSettings(limit={"cpus": 2}), "eng/ml": RoleSettings(limit={"cpus": 3})}
    )
    allocator.add_framework("ml", "eng/ml")
    assert allocator.allocate() == [Allocation("ml", "s0", Resources(cpus=2, mem=4096))]


def test_a_child_gets_only_what_its_parent_has_left() -> None:
    # eng may hold 2 CPUs and eng/web already runs 1.5 of them, so eng/ml, whose
    # own limit (3) would allow all 2.5 free CPUs, is offered only 0.5: its
    # parent's headroom bounds it. A child ignoring its parent's headroom gets 2.5.
    allocator = cluster(1, Resources(cpus=4, mem=4096))
    allocator.configure_roles(
        {"eng": RoleSettings(limit={"cpus": 2}), "eng/ml": RoleSettings(limit={"cpus": 3})}
    )
    allocator.add_framework("web", "eng/web")
    allocator.grant("web", "s0", Resources(cpus=1.5, mem=512))  # tasks it runs
    allocator.suppress("web")
    allocator.add_framework("ml", "eng/ml")
    assert allocator.allocate() == [Allocation("ml", "s0", Resources(cpus=0.5, mem=3584))]
    tree = allocator.roles
    assert tree.role_allocation("eng")["cpus"] == 2
    # And nothing more for the subtree once the parent is at its limit, though the
    # child's own limit has room: the next offer of that agent holds no CPUs.
    allocator.recover("ml", "s0", Resources(mem=3584))
    assert allocator.allocate() == [Allocation("ml", "s0", Resources(mem=3584))]


def test_a_role_limited_to_no_gpus_still_gets_cpus_and_memory() -> None:
    # A limit caps what it names and nothing else (the tree once skipped such a
    # role altogether: every resource it limits was at its limit).
    allocator = cluster(1, Resources(cpus=4, mem=4096, gpus=2))
    allocator.configure_roles({"cpu-only": RoleSettings(limit={"gpus": 0})})
    allocator.add_framework("f", "cpu-only")
    assert allocator.allocate() == [Allocation("f", "s0", Resources(cpus=4, mem=4096))]


def test_no_offer_when_the_limits_leave_neither_cpus_nor_memory() -> None:
    allocator = cluster(1, Resources(cpus=4, mem=4096, disk=1000))
    allocator.configure_roles({"none": RoleSettings(limit={"cpus": 0, "mem": 0})})
    allocator.add_framework("f", "none/sub")
    assert allocator.allocate() == []  # disk alone is below the minimum offer
    allocator.configure_roles({"none": RoleSettings(limit={"cpus": 0, "mem": 32})})
    assert allocator.allocate() == [Allocation("f", "s0", Resources(mem=32, disk=1000))]


def test_a_guarantee_on_memory_is_served_first() -> None:
    # Four agents of <4 CPUs, 2 GB>. `gold` is guaranteed 6 GB of memory and no
    # CPUs; `*` was created first, so it wins ties. gold is below its guarantee
    # until it holds three agents (6 GB), and is served first until then; only
    # then does `*` get the fourth. A guarantee tier looking at CPUs only would
    # see gold as satisfied and split 2 : 2, leaving gold 4 GB.
    allocator = cluster(4, Resources(cpus=4, mem=2048))
    allocator.configure_roles({"gold": RoleSettings(guarantee=Resources(mem=6144))})
    allocator.add_framework("other", "*")
    allocator.add_framework("g", "gold")
    decisions = allocator.allocate()
    assert [d.framework_id for d in decisions] == ["g", "g", "g", "other"]
    assert allocator.roles.role_allocation("gold") == Resources(cpus=12, mem=6144)


def test_a_guarantee_counts_as_met_only_when_met_in_every_resource() -> None:
    # gold is guaranteed 2 CPUs and 3 GB. After one agent <4 CPUs, 2 GB> it has
    # the CPUs but not the memory, so it is still served before `*`.
    allocator = cluster(3, Resources(cpus=4, mem=2048))
    allocator.configure_roles({"gold": RoleSettings(guarantee=Resources(cpus=2, mem=3072))})
    allocator.add_framework("other", "*")
    allocator.add_framework("g", "gold")
    assert [d.framework_id for d in allocator.allocate()] == ["g", "g", "other"]


def test_framework_ties_go_by_subscription_order_not_by_id() -> None:
    # Ids sort the other way round from subscription order.
    allocator = cluster(4)
    subscribed = ["zulu", "yankee", "xray", "whiskey"]
    for framework_id in subscribed:
        allocator.add_framework(framework_id, "eng")
    # Identical agents: each goes to the lowest share, ties to the earliest.
    assert [d.framework_id for d in allocator.allocate()] == subscribed


def test_sibling_role_ties_go_by_creation_order_not_by_name() -> None:
    allocator = cluster(4)
    # Created in this order (eng with eng/zz), so at the top zz is older than
    # eng and below eng, eng/zz older than eng/aa: names sort the other way.
    allocator.configure_roles(
        {"zz": RoleSettings(), "eng/zz": RoleSettings(), "eng/aa": RoleSettings()}
    )
    allocator.add_framework("f-aa", "eng/aa")
    allocator.add_framework("f-zz", "eng/zz")
    allocator.add_framework("f-top", "zz")
    # Identical agents. zz and eng tie at 0: zz. eng is lower: eng/zz (tied with
    # eng/aa). zz and eng tie again: zz. eng is lower, and eng/aa below it.
    assert [d.framework_id for d in allocator.allocate()] == ["f-top", "f-zz", "f-top", "f-aa"]


def test_frameworks_of_an_inner_role_count_as_one_group() -> None:
    # eng's own frameworks own1 and own2 compete, together, with child eng/ml:
    # after own1 and ml hold an agent each, own2 wins the tie (the group was
    # created with eng, before eng/ml), and then the group holds two agents to
    # ml's one, so ml gets the fourth. Ranking the group by its biggest member
    # (one agent) instead of its total would tie again and give it to the group.
    allocator = cluster(4)
    allocator.add_framework("own1", "eng")
    allocator.add_framework("own2", "eng")
    allocator.add_framework("ml", "eng/ml")
    assert [d.framework_id for d in allocator.allocate()] == ["own1", "ml", "own2", "ml"]


def test_a_new_weight_applies_to_the_next_offer() -> None:
    allocator = cluster(6)
    allocator.deactivate_agent("s4")
    allocator.deactivate_agent("s5")
    allocator.add_framework("fa", "a")
    allocator.add_framework("fb", "b")
    assert [d.framework_id for d in allocator.allocate()] == ["fa", "fb", "fa", "fb"]
    # Both hold 2 of 6 agents. With weight 3, b's weighted share is 1/9 against
    # a's 1/3, so b gets both agents that come back (3/6 / 3 is still below 1/3).
    allocator.set_role_weight("b", 3.0)
    allocator.activate_agent("s4")
    allocator.activate_agent("s5")
    assert [d.framework_id for d in allocator.allocate()] == ["fb", "fb"]


def test_role_weight_and_activity_as_the_master_reads_them() -> None:
    allocator = cluster(1)
    assert allocator.role_weight("nobody") == 1.0  # not created yet: the default weight
    allocator.configure_roles({"gold": RoleSettings(weight=2.5)})
    assert allocator.role_weight("gold") == 2.5
    tree = allocator.roles
    allocator.add_framework("f", "gold/sub", connected=False)
    assert not tree.role_active("gold") and not tree.role_active("gold/sub")
    allocator.connect_framework("f")  # one framework wanting offers makes the path active
    assert tree.role_active("gold") and tree.role_active("gold/sub")
    assert not tree.role_active("*")
    allocator.add_framework("g", "gold/sub")
    allocator.suppress("f")
    assert tree.role_active("gold/sub")
    allocator.suppress("g")
    assert not tree.role_active("gold") and not tree.role_active("gold/sub")


@pytest.mark.parametrize("weight", [-1.0, float("nan")])
def test_a_role_weight_must_be_a_number_at_least_0(weight: float) -> None:
    with pytest.raises(ValueError, match=r"^weight of role 'r' must be >= 0, got "):
        RoleTree().configure_role("r", weight, Resources(), None)


def test_the_walk_goes_on_past_a_group_that_cannot_take_the_agent() -> None:
    # eng's own framework (its group comes first: created with eng) declined
    # the agent; the walk must go on to eng's child role.
    allocator = cluster(1)
    allocator.add_framework("own", "eng")
    [offer] = allocator.allocate()
    allocator.recover("own", "s0", offer.resources, refuse_seconds=100)
    allocator.add_framework("ml", "eng/ml")
    assert [d.framework_id for d in allocator.allocate()] == ["ml"]


def test_the_walk_goes_on_past_a_role_with_no_room_left() -> None:
    allocator = cluster(1)
    allocator.configure_roles(
        {"full": RoleSettings(limit={"cpus": 0, "mem": 0}), "open": RoleSettings()}
    )
    allocator.add_framework("f-full", "full")  # created first: wins the tie, but has no room
    allocator.add_framework("f-open", "open")
    assert [d.framework_id for d in allocator.allocate()] == ["f-open"]


def test_a_child_limit_below_its_parents_is_its_own() -> None:
    # eng limits CPUs to 3 and memory to 2 GB, eng/ml CPUs to 1: ml gets 1 CPU,
    # and memory up to its parent's limit.
    allocator = cluster(1, Resources(cpus=4, mem=4096))
    allocator.configure_roles(
        {
            "eng": RoleSettings(limit={"cpus": 3, "mem": 2048}),
            "eng/ml": RoleSettings(limit={"cpus": 1}),
        }
    )
    allocator.add_framework("ml", "eng/ml")
    assert allocator.allocate() == [Allocation("ml", "s0", Resources(cpus=1, mem=2048))]


def test_an_offer_is_cut_to_the_last_thousandth_of_room() -> None:
    allocator = cluster(1, Resources(cpus=4, mem=1024, gpus=2))
    allocator.configure_roles({"r": RoleSettings(limit={"gpus": 1.001})})
    allocator.add_framework("f", "r")
    allocator.grant("f", "s0", Resources(gpus=1))  # a task that holds one GPU
    assert allocator.allocate() == [Allocation("f", "s0", Resources(cpus=4, mem=1024, gpus=0.001))]


def test_a_group_that_comes_back_is_placed_by_what_it_holds_now() -> None:
    tree = RoleTree()
    tree.set_total(Resources(cpus=4))
    tree.add_framework("own", "eng", wants=False)
    tree.add_framework("ml", "eng/ml", wants=True)
    tree.allocated("ml", Resources(cpus=1))
    assert [fid for fid, _ in tree.candidates()] == ["ml"]  # (re)built while eng's own want nothing
    tree.allocated("own", Resources(cpus=2))  # tasks it runs
    tree.set_wants("own", True)
    # eng's group holds 2/4, eng/ml 1/4: ml first, then own, once each.
    assert [fid for fid, _ in tree.candidates()] == ["ml", "own"]


def test_adding_a_framework_twice_is_an_error() -> None:
    tree = RoleTree()
    tree.add_framework("f", "eng", wants=True)
    with pytest.raises(KeyError, match="framework f is already in the role tree"):
        tree.add_framework("f", "ops", wants=True)


def test_a_group_is_one_entry_however_many_of_its_frameworks_come_and_go() -> None:
    tree = RoleTree()
    tree.set_total(Resources(cpus=4))
    tree.add_framework("ml", "eng/ml", wants=True)
    assert [fid for fid, _ in tree.candidates()] == ["ml"]  # built; changes are incremental now
    tree.add_framework("own1", "eng", wants=True)
    tree.add_framework("own2", "eng", wants=True)
    tree.allocated("own1", Resources(cpus=1))
    tree.allocated("ml", Resources(cpus=0.5))
    # eng's group holds 1/4 and eng/ml 1/8: ml, then the group (own2 before own1).
    assert [fid for fid, _ in tree.candidates()] == ["ml", "own2", "own1"]
    tree.set_wants("own1", False)
    tree.set_wants("own2", False)
    assert [fid for fid, _ in tree.candidates()] == ["ml"]
    tree.set_wants("own2", True)
    assert [fid for fid, _ in tree.candidates()] == ["ml", "own2"]


def test_ensure_role_says_whether_the_role_is_new() -> None:
    tree = RoleTree()
    assert tree.ensure_role("a/b") is True
    assert tree.ensure_role("a/b") is False
    assert tree.ensure_role("a") is False  # created as a/b's parent
    assert tree.ensure_role("*") is False  # always there


# Weight vectors ------------------------------------------------------------------


def test_a_weight_vector_orders_roles_by_the_weighted_dominant_share() -> None:
    # One agent of <8 CPUs, 8 GB>; a's tasks take <1 CPU, 512 MB>, b's <1 CPU,
    # 1 GB>. Weighted 3 for cpus, a's weighted share max(cpu/3, mem) is its
    # memory share n/16, b's n/8: a gets about twice b's tasks (16/3 and 8/3
    # divisible), 5 and 3 whole ones (equal weights: 4 and 4).
    allocator = cluster(1, Resources(cpus=8, mem=8192))
    allocator.configure_roles(
        {"a": RoleSettings(resource_weights={"cpus": 3}), "b": RoleSettings()}
    )
    allocator.add_framework("fa", "a")
    allocator.add_framework("fb", "b")
    assert run_one_task_per_offer(allocator, VECTOR_DEMANDS) == {"fa": 5, "fb": 3}
    tree = allocator.roles
    assert tree.role_resource_weights("a") == {"cpus": 3.0}
    assert tree.role_weight("a") == 1.0
    assert tree.role_share("a") == max(5 / 8 / 3, 5 * 512 / 8192)
    assert allocator.framework_share("fa") == tree.role_share("a")
    assert allocator.role_resource_weights("a") == {"cpus": 3.0}
    assert allocator.role_resource_weights("b") is None
    assert allocator.role_resource_weights("nobody") is None


VECTOR_DEMANDS = {"fa": Resources(cpus=1, mem=512), "fb": Resources(cpus=1, mem=1024)}


@pytest.mark.parametrize(
    "weights, expected",
    [
        ({"mem": 3}, {"fa": 4, "fb": 4}),  # a's CPU share still dominates at weight 1
        ({"cpus": 3, "mem": 3}, {"fa": 6, "fb": 2}),  # as a scalar weight of 3
        ({"cpus": 3, "disk": 0}, {"fa": 5, "fb": 3}),  # a resource it never holds
    ],
)
def test_which_resource_a_weight_is_for_decides_the_split(
    weights: dict[str, float], expected: dict[str, int]
) -> None:
    allocator = cluster(1, Resources(cpus=8, mem=8192))
    allocator.configure_roles({"a": RoleSettings(resource_weights=weights)})
    allocator.add_framework("fa", "a")
    allocator.add_framework("fb", "b")
    assert run_one_task_per_offer(allocator, VECTOR_DEMANDS) == expected


def test_unconfiguring_or_a_scalar_weight_drops_the_vector() -> None:
    allocator = cluster(1)
    allocator.configure_roles({"a": RoleSettings(resource_weights={"cpus": 2})})
    allocator.set_role_weight("a", 2.0)
    assert allocator.role_resource_weights("a") is None
    allocator.configure_roles({"a": RoleSettings(resource_weights={"cpus": 2})})
    allocator.add_framework("f", "a")
    allocator.configure_roles({})
    assert allocator.role_resource_weights("a") is None
    assert allocator.role_weight("a") == 1.0


@pytest.mark.parametrize("weight", [-1.0, float("nan")])
def test_each_weight_of_a_vector_must_be_at_least_0(weight: float) -> None:
    with pytest.raises(ValueError, match=r"^weight of role 'r' for mem must be >= 0, got "):
        RoleTree().configure_role("r", 1.0, Resources(), None, {"cpus": 1, "mem": weight})
