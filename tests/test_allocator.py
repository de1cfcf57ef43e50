"""The allocator on its own: plain data in, offers out, no network."""

from __future__ import annotations

import pytest

from mesolite.master.allocator import Allocation, Allocator, RoleSettings
from mesolite.resources import Resources
from tests.simulate import FakeClock, run_one_task_per_offer


def test_drf_paper_example_settles_at_three_and_two_tasks() -> None:
    # DRF paper, section 4: <9 CPUs, 18 GB>; A needs <1 CPU, 4 GB>, B <3 CPUs, 1 GB>.
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=9, mem=18 * 1024))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")
    demands = {"A": Resources(cpus=1, mem=4096), "B": Resources(cpus=3, mem=1024)}
    assert run_one_task_per_offer(allocator, demands) == {"A": 3, "B": 2}
    # Both dominant shares are 2/3: A's memory, B's CPU.
    assert allocator.framework_share("A") == pytest.approx(2 / 3)
    assert allocator.framework_share("B") == pytest.approx(2 / 3)


def test_whole_free_resources_of_an_agent_go_to_the_lowest_share() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_agent("s2", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")
    decisions = allocator.allocate()
    # Each framework gets one whole agent: after the first grant the other is lowest.
    assert sorted(d.framework_id for d in decisions) == ["A", "B"]
    assert all(d.resources == Resources(cpus=4, mem=4096) for d in decisions)
    assert allocator.allocate() == []  # nothing left: offers count as allocated


def test_weighted_drf_gives_shares_in_proportion_to_weights() -> None:
    allocator = Allocator(FakeClock())
    for i in range(12):
        allocator.add_agent(f"s{i}", Resources(cpus=1, mem=1024))
    allocator.set_role_weight("gold", 2.0)
    allocator.add_framework("G", "gold")
    allocator.add_framework("P", "*")
    demands = {"G": Resources(cpus=1, mem=512), "P": Resources(cpus=1, mem=512)}
    running = run_one_task_per_offer(allocator, demands)
    assert running == {"G": 8, "P": 4}
    assert allocator.framework_share("G") == pytest.approx(allocator.framework_share("P"))


def test_ties_are_broken_by_subscription_order() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("first", "*")
    allocator.add_framework("second", "*")
    assert allocator.allocate() == [Allocation("first", "s1", Resources(cpus=1, mem=1024))]


def test_declined_resources_are_filtered_until_the_filter_expires() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=2, mem=2048))
    allocator.add_framework("A", "*")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=5.0)
    assert allocator.allocate() == []  # A alone, and filtered
    allocator.add_framework("B", "*")
    assert [d.framework_id for d in allocator.allocate()] == ["B"]
    allocator.recover("B", "s1", offer.resources)  # B returns it unfiltered
    clock.now = 4.9
    assert [d.framework_id for d in allocator.allocate()] == ["B"]
    allocator.recover("B", "s1", offer.resources, refuse_seconds=100)
    clock.now = 5.0
    assert [d.framework_id for d in allocator.allocate()] == ["A"]


def test_a_filter_does_not_hold_back_more_resources_than_were_declined() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    [whole] = allocator.allocate()
    task = Resources(cpus=2, mem=2048)
    allocator.recover("A", "s1", whole.resources - task, refuse_seconds=60)
    assert allocator.allocate() == []  # the remainder is filtered
    allocator.recover("A", "s1", task)  # the task ends: more is free than was declined
    assert allocator.allocate() == [Allocation("A", "s1", whole.resources)]


def test_a_hold_keeps_the_whole_agent_from_the_framework_for_its_seconds() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    [whole] = allocator.allocate()
    task = Resources(cpus=1, mem=512)
    allocator.recover("A", "s1", whole.resources - task)
    allocator.recover("A", "s1", task)  # preempted: then held for half a second
    allocator.hold("A", "s1", 0.5)
    assert allocator.allocate() == []  # not even the rest of the agent
    clock.now = 0.5
    assert allocator.allocate() == [Allocation("A", "s1", whole.resources)]


def test_a_hold_of_no_time_leaves_the_frameworks_filter_alone() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    [whole] = allocator.allocate()
    allocator.recover("A", "s1", whole.resources, refuse_seconds=60)
    allocator.hold("A", "s1", 0.0)  # an ordinary task end elsewhere: nothing held
    assert allocator.allocate() == []  # the decline's filter still holds


def test_suppress_stops_offers_and_revive_clears_filters() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    allocator.suppress("A")
    assert allocator.allocate() == []
    allocator.revive("A")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=1e6)
    assert allocator.allocate() == []
    allocator.revive("A")
    assert len(allocator.allocate()) == 1


def test_disconnected_frameworks_and_inactive_agents_get_no_offers() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    allocator.disconnect_framework("A")
    assert allocator.allocate() == []
    allocator.connect_framework("A")
    allocator.deactivate_agent("s1")
    assert allocator.allocate() == []
    allocator.activate_agent("s1")
    assert len(allocator.allocate()) == 1


def test_removing_an_agent_takes_its_resources_out_of_the_cluster() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_agent("s2", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    allocator.allocate()
    assert allocator.framework_allocation("A") == Resources(cpus=8, mem=8192)
    allocator.remove_agent("s1")
    assert allocator.total == Resources(cpus=4, mem=4096)
    assert allocator.framework_allocation("A") == Resources(cpus=4, mem=4096)
    assert allocator.framework_share("A") == pytest.approx(1.0)


def test_removing_a_framework_frees_its_resources() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=4, mem=4096))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")
    [offer] = allocator.allocate()
    allocator.remove_framework(offer.framework_id)
    assert allocator.agent_allocated("s1").is_empty()
    assert [d.framework_id for d in allocator.allocate()] == ["B"]


def test_tiny_leftovers_are_not_offered() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=0.005, mem=16, disk=100))
    allocator.add_framework("A", "*")
    assert allocator.allocate() == []


def test_recovering_more_than_allocated_is_an_error() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    allocator.allocate()
    with pytest.raises(ValueError):
        allocator.recover("A", "s1", Resources(cpus=2))


def test_the_seed_decides_the_agent_order_and_nothing_else() -> None:
    def decisions(seed: int) -> list[Allocation]:
        allocator = Allocator(FakeClock(), seed=seed)
        for i in range(20):
            allocator.add_agent(f"s{i}", Resources(cpus=1 + i % 3, mem=1024))
        for f in "ABCD":
            allocator.add_framework(f, "*")
        return allocator.allocate()

    runs = {seed: decisions(seed) for seed in range(20)}
    # The same seed, on a new allocator, makes the same offers in the same order.
    assert all(decisions(seed) == runs[seed] for seed in (0, 7, 19))
    # Another seed visits the agents in another order: 20 agents have 20! orders.
    orders = {tuple(d.agent_id for d in run) for run in runs.values()}
    assert len(orders) == len(runs)
    # Every seed offers every agent once, whatever the order.
    assert all(
        sorted(d.agent_id for d in run) == sorted(f"s{i}" for i in range(20))
        for run in runs.values()
    )
    # Without a seed the allocator uses seed 0 (the master's default too).
    allocator = Allocator(FakeClock())
    for i in range(20):
        allocator.add_agent(f"s{i}", Resources(cpus=1 + i % 3, mem=1024))
    for f in "ABCD":
        allocator.add_framework(f, "*")
    assert allocator.allocate() == runs[0]


def test_an_agent_lost_with_offers_and_filters_leaves_nothing_behind() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=2, mem=2048))
    allocator.add_agent("s2", Resources(cpus=2, mem=2048))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")
    offers = {d.agent_id: d for d in allocator.allocate()}
    assert {d.framework_id for d in offers.values()} == {"A", "B"}
    on_s1 = offers["s1"]
    other = "B" if on_s1.framework_id == "A" else "A"
    # The holder of s1 keeps its offer; the other declines s1 with a long filter
    # (it is offered s1 once the holder gives it back, and says no).
    allocator.recover(on_s1.framework_id, "s1", on_s1.resources)
    allocator.suppress(on_s1.framework_id)
    [again] = allocator.allocate()
    assert (again.framework_id, again.agent_id) == (other, "s1")
    allocator.recover(other, "s1", again.resources, refuse_seconds=3600)
    allocator.revive(on_s1.framework_id)
    [held] = allocator.allocate()
    assert (held.framework_id, held.agent_id) == (on_s1.framework_id, "s1")

    allocator.remove_agent("s1")  # with an offer outstanding and a filter on it
    assert allocator.total == Resources(cpus=2, mem=2048)
    assert allocator.framework_allocation(on_s1.framework_id).is_empty()
    # The filter went with the agent: reviving, suppressing and removing the
    # framework that set it do not trip over it...
    allocator.revive(other)
    allocator.suppress(other)
    allocator.revive(other)
    # ...and an agent that joins again under the same id is a new agent: no filter.
    allocator.recover(other, "s2", offers["s2"].resources)
    allocator.add_agent("s1", Resources(cpus=2, mem=2048))
    allocator.suppress(on_s1.framework_id)
    decisions = allocator.allocate()
    assert {(d.framework_id, d.agent_id) for d in decisions} == {(other, "s1"), (other, "s2")}
    allocator.remove_framework(other)
    assert allocator.agent_allocated("s1").is_empty()


def test_suppress_revive_and_filter_expiry_on_a_fake_clock() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=5)
    clock.now = 1.0
    allocator.suppress("A")
    clock.now = 6.0  # the filter has expired, but A is suppressed
    assert allocator.allocate() == []
    allocator.revive("A")
    [offer] = allocator.allocate()
    # Filtered from 6 s until 11 s: not at 10.999, at 11.
    allocator.recover("A", "s1", offer.resources, refuse_seconds=5)
    clock.now = 10.999
    assert allocator.allocate() == []
    clock.now = 11.0
    [offer] = allocator.allocate()
    # A suppressed framework keeps its filters; revive drops them at once.
    allocator.recover("A", "s1", offer.resources, refuse_seconds=1000)
    allocator.suppress("A")
    clock.now = 12.0
    assert allocator.allocate() == []
    allocator.revive("A")
    assert len(allocator.allocate()) == 1


def test_a_filter_lasts_at_most_a_year() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=1e12)
    year = 365 * 24 * 3600.0
    clock.now = year - 1
    assert allocator.allocate() == []
    clock.now = year
    assert len(allocator.allocate()) == 1


def test_a_new_filter_replaces_the_old_one() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=100)
    allocator.add_framework("B", "*")
    [to_b] = allocator.allocate()
    allocator.recover("B", "s1", to_b.resources, refuse_seconds=1000)
    allocator.remove_framework("B")
    clock.now = 50.0
    assert allocator.allocate() == []  # A's filter holds until 100
    allocator.revive("A")
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=10)  # shorter than before
    clock.now = 60.0
    assert len(allocator.allocate()) == 1


def test_the_smallest_offer_is_0_01_cpus_or_32_mb() -> None:
    def offered(free: Resources) -> list[Allocation]:
        allocator = Allocator(FakeClock())
        allocator.add_agent("s1", free)
        allocator.add_framework("A", "*")
        return allocator.allocate()

    assert len(offered(Resources(cpus=0.01))) == 1
    assert len(offered(Resources(mem=32))) == 1
    assert offered(Resources(cpus=0.009, mem=31.999, disk=1e6)) == []


def test_a_decline_without_a_filter_keeps_an_earlier_filter() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=3, mem=3072))
    allocator.add_framework("A", "*")
    allocator.grant("A", "s1", Resources(cpus=0.5, mem=512))  # a task A runs there
    [offer] = allocator.allocate()
    allocator.recover("A", "s1", offer.resources, refuse_seconds=100)  # 2.5 CPUs, 2.5 GB
    allocator.add_framework("B", "*")
    [to_b] = allocator.allocate()
    allocator.recover("B", "s1", to_b.resources - Resources(cpus=1, mem=1024))  # B keeps 1 CPU
    allocator.suppress("B")
    assert allocator.allocate() == []  # 1.5 CPUs free, within what A declined
    # A's task ends (no filter): 2 CPUs free, still within A's filter of 2.5.
    allocator.recover("A", "s1", Resources(cpus=0.5, mem=512))
    assert allocator.allocate() == []
    clock.now = 100.0
    assert [d.framework_id for d in allocator.allocate()] == ["A"]


def test_a_second_partial_decline_replaces_the_first_filter() -> None:
    # A declines an offer in two parts with filters; only the second filter
    # stands. When what is free is the first part (which the second filter does
    # not cover), A is offered it.
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=2, mem=2048))
    allocator.add_framework("B", "*", connected=False)  # subscribed first
    allocator.add_framework("A", "*")
    [offer] = allocator.allocate()
    assert offer.framework_id == "A"
    allocator.recover("A", "s1", Resources(cpus=1, mem=1536), refuse_seconds=100)
    allocator.recover("A", "s1", Resources(cpus=1, mem=512), refuse_seconds=100)
    allocator.connect_framework("B")
    [to_b] = allocator.allocate()  # both hold nothing: B, subscribed first
    assert to_b.framework_id == "B"
    allocator.recover("B", "s1", Resources(cpus=1, mem=1536))  # B keeps <1 CPU, 512 MB>
    allocator.suppress("B")
    assert allocator.allocate() == [Allocation("A", "s1", Resources(cpus=1, mem=1536))]


def test_an_agent_everyone_declined_is_offered_again_when_anything_changes() -> None:
    clock = FakeClock()
    allocator = Allocator(clock)
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    allocator.add_framework("B", "*")

    def decline_all(seconds: float) -> None:
        while decisions := allocator.allocate():
            for d in decisions:
                allocator.recover(d.framework_id, d.agent_id, d.resources, seconds)

    decline_all(10)
    assert allocator.allocate() == []  # both declined it
    allocator.add_framework("C", "*")  # a newcomer has not
    assert [d.framework_id for d in allocator.allocate()] == ["C"]
    allocator.remove_framework("C")
    assert allocator.allocate() == []
    allocator.revive("B")  # B takes its decline back
    assert [d.framework_id for d in allocator.allocate()] == ["B"]
    allocator.recover("B", "s1", Resources(cpus=1, mem=1024), refuse_seconds=10)
    allocator.suppress("A")  # B alone wants offers, and has declined
    assert allocator.allocate() == []
    allocator.configure_roles({"*": RoleSettings(weight=2.0)})
    assert allocator.allocate() == []  # a reconfiguration changes no filter
    clock.now = 10.0  # both filters expire (B's was set at 0, like A's)
    assert [d.framework_id for d in allocator.allocate()] == ["B"]


def test_a_framework_that_declined_part_of_an_agent_is_offered_all_of_it_later() -> None:
    # X declines the whole agent; Y takes it, runs a task and declines the rest. When
    # the task ends the agent is free again, more than Y declined: Y is offered it.
    agent = Resources(cpus=4, mem=4096)
    task = Resources(cpus=1, mem=1024)
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", agent)
    allocator.add_framework("X", "*")
    allocator.add_framework("Y", "*")
    assert allocator.allocate() == [Allocation("X", "s1", agent)]
    allocator.recover("X", "s1", agent, refuse_seconds=100)
    assert allocator.allocate() == [Allocation("Y", "s1", agent)]
    allocator.recover("Y", "s1", agent - task, refuse_seconds=100)
    allocator.recover("Y", "s1", task)  # the task ends, before the next cycle
    assert allocator.allocate() == [Allocation("Y", "s1", agent)]


def test_a_filter_over_less_than_is_free_never_hides_the_agent() -> None:
    # Z declined <3 CPUs, 3 GB>, X the whole agent. While W's task runs, <3 CPUs, 3 GB>
    # are free and both have declined that; when it ends, Z is offered the whole agent.
    agent = Resources(cpus=4, mem=4096)
    task = Resources(cpus=1, mem=1024)
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", agent)
    for name in ("W", "X", "Z"):
        allocator.add_framework(name, "*")
    allocator.grant("W", "s1", task)
    allocator.suppress("W")
    allocator.grant("Z", "s1", agent - task)
    allocator.recover("Z", "s1", agent - task, refuse_seconds=100)
    allocator.recover("W", "s1", task)
    allocator.grant("X", "s1", agent)
    allocator.recover("X", "s1", agent, refuse_seconds=100)
    allocator.grant("W", "s1", task)  # W runs a task again
    assert allocator.allocate() == []
    allocator.recover("W", "s1", task)
    assert allocator.allocate() == [Allocation("Z", "s1", agent)]


def test_set_role_weight_wants_a_positive_weight_and_keeps_the_limit() -> None:
    allocator = Allocator(FakeClock())
    with pytest.raises(ValueError, match=r"^weight of role 'r' must be positive, got 0$"):
        allocator.set_role_weight("r", 0)
    allocator.configure_roles({"r": RoleSettings(limit={"cpus": 1, "gpus": 0})})
    allocator.set_role_weight("r", 2.0)
    assert allocator.roles.role_limit("r") == {"cpus": 1.0, "gpus": 0.0}
    allocator.add_agent("s1", Resources(cpus=4, mem=1024, gpus=1))
    allocator.add_framework("f", "r")
    assert allocator.allocate() == [Allocation("f", "s1", Resources(cpus=1, mem=1024))]


def test_granting_more_than_is_free_is_an_error() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1, mem=1024))
    allocator.add_framework("A", "*")
    with pytest.raises(ValueError, match=r"^agent s1 has only cpus:1;mem:1024 free, not cpus:2$"):
        allocator.grant("A", "s1", Resources(cpus=2))


def test_adding_an_agent_or_a_framework_twice_is_an_error() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("s1", Resources(cpus=1))
    with pytest.raises(KeyError, match="agent s1 is already known to the allocator"):
        allocator.add_agent("s1", Resources(cpus=2))
    assert allocator.total == Resources(cpus=1)
    assert allocator.add_framework("A", "eng") is True  # a new role
    assert allocator.add_framework("B", "eng") is False
    with pytest.raises(KeyError, match="framework A is already known to the allocator"):
        allocator.add_framework("A", "ops")
    assert allocator.roles.framework_role("A") == "eng"


def test_a_framework_is_offered_only_agents_where_a_shape_it_declared_fits() -> None:
    # MESOS-6111: "big" (share 0, first in order) waits for 4 CPUs; the agent has 2 free.
    allocator = Allocator(FakeClock())
    allocator.add_agent("a1", Resources(cpus=2, mem=1024))
    allocator.add_framework("big", "r1")
    allocator.add_framework("small", "r2")
    allocator.set_demand("big", [(Resources(cpus=4), 1), (Resources(cpus=3, mem=512), 1)])
    [offer] = allocator.allocate()
    assert offer.framework_id == "small"  # no offer to big only for it to decline
    allocator.recover("small", "a1", offer.resources)
    allocator.set_demand("big", [(Resources(cpus=4), 1), (Resources(cpus=2, mem=1024), 1)])
    assert [d.framework_id for d in allocator.allocate()] == ["big"]  # one now fits exactly


def test_an_empty_demand_wants_nothing_and_none_restores_every_offer() -> None:
    allocator = Allocator(FakeClock())
    allocator.add_agent("a1", Resources(cpus=2, mem=1024))
    allocator.add_framework("f", "r1")
    allocator.set_demand("f", [])
    assert allocator.allocate() == []
    allocator.set_demand("f", None)
    assert [d.framework_id for d in allocator.allocate()] == ["f"]
