"""DRF's fairness properties: exact on the reference, within proved bounds on the allocator.

Notation. Capacity C (the cluster total); user (framework) i has per-task
demand D_i, weight w_i, W = sum of all weights. One task of i takes
u_ir = D_ir / C_r of resource r; delta_i = max_r u_ir is one task's dominant
share and d_i = delta_i / w_i its weighted dominant share. With n_i tasks,
i's weighted dominant share is s_i = n_i d_i. "Unfinished": i has not reached
its task limit (finished users want nothing more, so no property constrains
them beyond getting their limit).

Part A: the fractional reference `mesolite.lab.drf_reference.drf`, checked EXACTLY
(Fractions, no tolerance) on random instances (2-5 users, 1-3 resources, some
resources demanded by no one or only some users, zero capacities, weights,
task limits). Weights are read from the input, never from the result.

A1 test_reference_is_feasible_and_pareto_efficient: use <= capacity, and
   every unfinished user needs a saturated resource, so no one can get more
   without taking from another.
A2 test_reference_gives_sharing_incentive: x_i >= min(limit_i, min_r
   (w_i / W) C_r / D_ir), the tasks i could run alone on its weighted slice.
A3 test_reference_is_envy_free: for unfinished i and any j,
   (w_i / w_j) * (tasks of i that fit in j's bundle) <= x_i.
A4 test_reference_is_strategy_proof: declaring D' >= D (componentwise, so
   also asking for resources one does not need) never yields more true
   tasks, min over r with D_ir > 0 of x'_i D'_ir / D_ir (capped at the limit).
A5 test_reference_with_one_resource_is_weighted_max_min: equals weighted
   water-filling, computed independently below.
A6 test_reference_is_max_min_on_a_common_bottleneck: if one resource is every
   user's dominant one, its allocation is weighted water-filling on it.
A7 test_reference_is_population_monotone_when_all_need_the_same_resources:
   removing a user never lowers another's tasks. Only when all users need
   the same resources: with zero demands progressive filling is NOT
   population monotone (test_drf_reference pins an instance), because the
   paper's argument needs every saturation to freeze every user.
A8 test_reference_equalises_weighted_dominant_shares_when_all_need_everything:
   with no limits, weighted dominant shares are equal, so dominant shares go
   as the weights.

Part B: the allocator, task by task. `tests/simulate.py` drives it with
frameworks that launch one task per offer and return the rest unfiltered,
decline (with a long filter) an offer that fits no task, and suppress offers
at their task limit. Each framework has a role of its own, so role and
framework shares coincide and weights are role weights. Every generated task
needs >= 1 cpu or >= 128 MB, so whenever a task fits, the agent's free
resources are above the allocator's minimum offer size.

B1 test_allocator_follows_the_choice_rule (1-4 agents; `drf` and `asset`
   policies; weights are numbers or weight vectors, one weight per resource),
   exactly up to float rounding (1e-9): every offer is the agent's
   whole free resources, made to a framework with the least weighted share
   (largest fraction for drf, sum of fractions for asset, each fraction over
   its resource's weight under a weight vector) among those not
   suppressed and not filtering the agent, counting this cycle's earlier
   offers as allocated (as the allocator documents); and no agent on which an
   eligible framework's task fits is skipped. The bounds below follow from it.
B2 test_allocator_is_pareto_efficient (1-4 agents; both policies), exactly:
   when the allocator stops, no unfinished framework's task fits on any agent.
   Declines filter only what was offered, free space only shrinks, and a task
   that fits makes the agent offerable, so the loop cannot stop earlier.
B3 test_allocator_on_one_agent_is_discrete_drf (one agent, equal weights),
   exactly: same task counts as `discrete_drf`. With equal weights a share is
   one correctly rounded division, so equal rational shares are equal floats
   and ties go by subscription order in both. With weights, x / w rounds
   differently for different w and an exact tie may break the other way, so
   weights are left to B1.

B4-B6 are for ONE agent. Lemma: let T_i be the moment unfinished i's task
stopped fitting; after it i gets nothing (free space only shrinks). Before it
i was eligible at every offer, so a task j got before T_i went to j when
s_j <= s_i: s_j(T_i) <= s_i + d_j (L1). At T_i some resource r has
free_r < D_ir, so all users together get less than D_ir more of r (L2).

B4 test_allocator_shares_stay_within_one_task_on_one_agent, the paper's
   discrete bound: for unfinished i and every j, s_j(T_i) <= s_i + d_j (L1,
   measured at T_i because j may keep growing afterwards on resources i
   cannot use, as Pareto efficiency wants). NOT "s_i >= reference share -
   d_i", which is false even with one resource
   (test_discrete_share_can_fall_more_than_a_task_below_the_reference).
B5 test_allocator_gives_sharing_incentive_within_one_task_per_user: for
   unfinished i, W s_i > 1 - delta_i - (sum of delta_j, other j with tasks).
   Proof: at T_i, sum_j n_j u_jr > 1 - u_ir and n_j u_jr <= w_j s_j(T_i)
   <= w_j s_i + delta_j by L1 (0 <= w_j s_i for j without tasks).
   Unweighted: s_i > 1/n minus at most the mean task's dominant share, so
   less than one largest task short of 1/n: the paper's bound.
B6 test_allocator_is_envy_free_within_one_task_of_each: for unfinished i and
   j with tasks, (w_i / w_j) * (tasks of i fitting in j's bundle)
   < n_i + (w_i / w_j)(1 + delta_j / delta_i). Proof: let a = n_j(T_i) and m
   be j's tasks after T_i; L1 gives a delta_j <= (w_j / w_i) n_i delta_i +
   delta_j, L2 gives m u_jr < u_ir. With alpha = delta_i / u_ir >= 1 and
   beta = u_jr / delta_j <= 1, counting i's tasks in j's bundle through r
   gives the bound when alpha beta <= 1, and through i's dominant resource
   when alpha beta > 1. Neither term alone suffices: on 2 cpus with u0 <2>
   and u1 <1>, u1 envies u0 by 2 of its tasks; with u0 <1> and u1 <2>, by 1
   while delta_j / delta_i = 1/2.
   Single-resource and bottleneck fairness on the allocator are B4-B6 on
   those shapes, which `clusters` generates: there dominant shares are
   shares of the one (bottleneck) resource, and B4 reads "max-min fair up
   to one task".

Strategy-proofness and population monotonicity have NO bound on the
allocator: whole-task DRF breaks both by more than a task (a bigger declared
task can take the space another user's big task needed). The pinned tests
test_whole_tasks_are_not_strategy_proof and
test_whole_tasks_are_not_population_monotone show it on the real allocator;
by B3 that is DRF with whole tasks, not an allocator bug (A4, A7 check the
fractional reference).

Why B4-B6 are for one agent: with several agents (1) fragmentation: a task
may fit on no agent while the total free space would hold many
(test_fragmentation_breaks_the_one_agent_bounds_on_several_agents: B5 fails),
and (2) one cycle offers several agents, each to the lowest framework
counting whole agents offered earlier in the cycle, so L1 holds only among
frameworks not yet offered in the cycle and unfiltered on that agent. B1 and
B2, which hold exactly, are checked with 1-4 agents.

Hypothesis runs derandomized with no example database, so CI is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesolite.lab.drf_reference import FairAllocation, discrete_drf, drf, to_fraction
from mesolite.master.policies import make_policy
from mesolite.resources import Resources
from tests.simulate import Run, build_allocator, simulate

REFERENCE = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
ALLOCATOR = REFERENCE

# The allocator compares float shares: an exact tie may be broken by the last
# bit, so a choice may look wrong by about 1e-16. Anything larger is a bug.
TOL = Fraction(1, 10**9)

Vector = dict[str, Fraction]
RESOURCES = ("cpus", "mem", "disk")


# Part A: the fractional reference --------------------------------------------


@dataclass(frozen=True)
class Instance:
    capacity: dict[str, int]
    demands: dict[str, dict[str, int]]
    weights: dict[str, int] | None
    max_tasks: dict[str, Fraction] | None

    def solve(self) -> FairAllocation:
        return drf(self.capacity, self.demands, self.weights, self.max_tasks)

    def weight(self, user: str) -> Fraction:
        return Fraction((self.weights or {}).get(user, 1))

    def all_weights(self) -> dict[str, Fraction]:
        """From the input, never from the result: a reference ignoring weights must fail."""
        return {u: self.weight(u) for u in self.demands}

    def limit(self, user: str) -> Fraction | None:
        return (self.max_tasks or {}).get(user)


@st.composite
def instances(
    draw: st.DrawFn,
    resources: tuple[int, int] = (1, 3),
    weighted: bool = True,
    limited: bool = True,
    common_support: bool = False,
) -> Instance:
    names = [f"r{k}" for k in range(draw(st.integers(*resources)))]
    capacity = {r: draw(st.integers(0, 24)) for r in names}
    support = names
    if common_support:
        support = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    demands: dict[str, dict[str, int]] = {}
    for k in range(draw(st.integers(2, 5))):
        low = 1 if common_support else 0
        demand = {r: draw(st.integers(low, 6)) if r in support else 0 for r in names}
        if not any(demand.values()):
            demand[draw(st.sampled_from(names))] = draw(st.integers(1, 6))
        demands[f"u{k}"] = demand
    weights = None
    if weighted and draw(st.booleans()):
        weights = {u: draw(st.integers(1, 4)) for u in demands}
    max_tasks = None
    if limited and draw(st.booleans()):
        # Half tasks too: the reference takes any rational limit.
        max_tasks = {
            u: Fraction(draw(st.integers(1, 16)), 2) for u in demands if draw(st.booleans())
        }
    return Instance(capacity, demands, weights, max_tasks)


def capped(tasks: Fraction, limit: Fraction | None) -> Fraction:
    return tasks if limit is None else min(tasks, limit)


def tasks_in(bundle: Mapping[str, Fraction], demand: Mapping[str, Fraction]) -> Fraction:
    """How many tasks of `demand` fit in `bundle` (divisible tasks)."""
    return min(bundle.get(r, Fraction(0)) / d for r, d in demand.items())


def water_fill(
    capacity: Fraction, caps: Mapping[str, Fraction | None], weights: Mapping[str, Fraction]
) -> dict[str, Fraction]:
    """Weighted max-min split of one resource: min(cap_i, w_i L) for the largest feasible L.

    Written independently of the reference (the textbook loop: give everyone
    its weighted equal split, settle those whose cap is below it, repeat).
    """
    result: dict[str, Fraction] = {}
    left = dict(caps)
    remaining = capacity
    while left:
        level = remaining / sum(weights[u] for u in left)
        settled = [u for u, c in left.items() if c is not None and c <= weights[u] * level]
        if not settled:
            result.update({u: weights[u] * level for u in left})
            break
        for u in settled:
            cap = left.pop(u)
            assert cap is not None
            result[u] = cap
            remaining -= cap
    return result


@REFERENCE
@given(instances())
def test_reference_is_feasible_and_pareto_efficient(inst: Instance) -> None:
    a = inst.solve()
    used = a.usage()
    assert all(used[r] <= a.capacity[r] for r in used)
    demanded = {r for d in a.demands.values() for r in d}
    assert a.saturated == {r for r in demanded if used[r] == a.capacity[r]}
    for u, demand in a.demands.items():
        limit = inst.limit(u)
        assert limit is None or a.tasks[u] <= limit
        if u not in a.finished:
            assert not a.saturated.isdisjoint(demand), f"{u} could get more: {a}"


@REFERENCE
@given(instances())
def test_reference_gives_sharing_incentive(inst: Instance) -> None:
    a = inst.solve()
    total_weight = sum(inst.all_weights().values())
    for u, demand in a.demands.items():
        slice_ = inst.weight(u) / total_weight
        alone = min(slice_ * a.capacity[r] / d for r, d in demand.items())
        assert a.tasks[u] >= capped(alone, inst.limit(u)), u


@REFERENCE
@given(instances())
def test_reference_is_envy_free(inst: Instance) -> None:
    a = inst.solve()
    for i, demand in a.demands.items():
        if i in a.finished:
            continue
        for j in a.demands:
            envy = inst.weight(i) / inst.weight(j) * tasks_in(a.allocation(j), demand)
            assert envy <= a.tasks[i], (i, j)


@st.composite
def lies(draw: st.DrawFn) -> tuple[Instance, str, dict[str, int]]:
    inst = draw(instances())
    liar = draw(st.sampled_from(sorted(inst.demands)))
    declared = {r: d + draw(st.integers(0, 4)) for r, d in inst.demands[liar].items()}
    return inst, liar, declared


@REFERENCE
@given(lies())
def test_reference_is_strategy_proof(case: tuple[Instance, str, dict[str, int]]) -> None:
    inst, liar, declared = case
    truthful = inst.solve()
    lying = drf(inst.capacity, {**inst.demands, liar: declared}, inst.weights, inst.max_tasks)
    true_demand = truthful.demands[liar]  # positive entries only
    got = tasks_in(lying.allocation(liar), true_demand)
    assert capped(got, inst.limit(liar)) <= truthful.tasks[liar]


@REFERENCE
@given(instances(resources=(1, 1)))
def test_reference_with_one_resource_is_weighted_max_min(inst: Instance) -> None:
    a = inst.solve()
    [r] = inst.capacity
    caps = {u: None if (m := inst.limit(u)) is None else m * d[r] for u, d in a.demands.items()}
    expected = water_fill(a.capacity[r], caps, inst.all_weights())
    assert {u: a.allocation(u)[r] for u in a.demands} == expected


@st.composite
def bottleneck_instances(draw: st.DrawFn) -> Instance:
    """Instances where r0 is every user's dominant resource."""
    inst = draw(instances())
    capacity = {r: max(c, 1) for r, c in inst.capacity.items()}
    demands = {}
    for u, d in inst.demands.items():
        # Raise the r0 demand until its share is at least any other's.
        need = max(math.ceil(Fraction(d[r] * capacity["r0"], capacity[r])) for r in d)
        demands[u] = {**d, "r0": max(need, d["r0"], 1)}
    return Instance(capacity, demands, inst.weights, inst.max_tasks)


@REFERENCE
@given(bottleneck_instances())
def test_reference_is_max_min_on_a_common_bottleneck(inst: Instance) -> None:
    a = inst.solve()
    for u, d in a.demands.items():
        assert a.dominant_shares[u] == a.tasks[u] * d["r0"] / a.capacity["r0"]
    caps = {u: None if (m := inst.limit(u)) is None else m * d["r0"] for u, d in a.demands.items()}
    expected = water_fill(a.capacity["r0"], caps, inst.all_weights())
    assert {u: a.allocation(u)["r0"] for u in a.demands} == expected


@REFERENCE
@given(instances(common_support=True), st.data())
def test_reference_is_population_monotone_when_all_need_the_same_resources(
    inst: Instance, data: st.DataObject
) -> None:
    a = inst.solve()
    leaver = data.draw(st.sampled_from(sorted(inst.demands)))
    rest = {u: d for u, d in inst.demands.items() if u != leaver}
    weights = None if inst.weights is None else {u: inst.weights[u] for u in rest}
    limits = None if inst.max_tasks is None else dict(inst.max_tasks)
    if limits is not None:
        limits.pop(leaver, None)
    b = drf(inst.capacity, rest, weights, limits)
    assert all(b.tasks[u] >= a.tasks[u] for u in rest), (leaver, a.tasks, b.tasks)


@REFERENCE
@given(instances(limited=False))
def test_reference_equalises_weighted_dominant_shares_when_all_need_everything(
    inst: Instance,
) -> None:
    capacity = {r: max(c, 1) for r, c in inst.capacity.items()}
    demands = {u: {r: max(x, 1) for r, x in d.items()} for u, d in inst.demands.items()}
    a = drf(capacity, demands, inst.weights)
    weighted = {u: a.dominant_shares[u] / inst.weight(u) for u in demands}
    assert len(set(weighted.values())) == 1, weighted
    assert a.shares == weighted


# Part B: the allocator, task by task -----------------------------------------


@dataclass(frozen=True)
class Cluster:
    agents: dict[str, Resources]
    demands: dict[str, Resources]  # in subscription order
    weights: dict[str, int | dict[str, int]]  # a number, or a weight vector (others 1)
    max_tasks: dict[str, int]

    def run(self, seed: int = 0, policy: str = "drf") -> Run:
        allocator = build_allocator(self.agents, self.weights, seed, make_policy(policy))
        return simulate(allocator, self.demands, self.max_tasks)

    def total(self) -> Vector:
        total: Vector = {}
        for resources in self.agents.values():
            total = plus(total, exact(resources))
        return total


def exact(resources: Resources) -> Vector:
    return {r: to_fraction(resources[r]) for r in resources}


def plus(a: Mapping[str, Fraction], b: Mapping[str, Fraction], times: int = 1) -> Vector:
    out = dict(a)
    for r, x in b.items():
        out[r] = out.get(r, Fraction(0)) + times * x
    return {r: x for r, x in out.items() if x}


def fits(demand: Mapping[str, Fraction], free: Mapping[str, Fraction]) -> bool:
    return all(free.get(r, Fraction(0)) >= x for r, x in demand.items())


Weight = Fraction | Mapping[str, Fraction]


def weighted_share(
    held: Mapping[str, Fraction], total: Vector, weight: Weight, policy: str = "drf"
) -> Fraction:
    """The policy's share over the weight; resources absent from the total are skipped.

    "drf" counts the largest fraction of any resource, "asset" their sum. A
    weight vector divides each resource's fraction by its weight (others 1).
    """
    if isinstance(weight, Mapping):
        shares = [x / total[r] / weight.get(r, 1) for r, x in held.items() if total.get(r)]
    else:
        shares = [x / total[r] / weight for r, x in held.items() if total.get(r)]
    if policy == "asset":
        return sum(shares, Fraction(0))
    return max(shares, default=Fraction(0))


@st.composite
def clusters(
    draw: st.DrawFn,
    agents: tuple[int, int] = (1, 1),
    weighted: bool = True,
    limited: bool = True,
    vectors: bool = False,
) -> Cluster:
    one = agents == (1, 1)
    nodes: dict[str, Resources] = {}
    for k in range(draw(st.integers(*agents))):
        # Mostly room for several tasks, so the bounds have bite; disk may be
        # missing, so some tasks never fit.
        nodes[f"s{k}"] = Resources(
            cpus=draw(st.integers(8, 48) if one else st.integers(4, 16)),
            mem=256 * draw(st.integers(4, 48) if one else st.integers(2, 24)),
            disk=100 * draw(st.integers(0, 10 if one else 4)),
        )
    total = {r: sum(to_fraction(n.get_amount(r)) for n in nodes.values()) for r in RESOURCES}
    shape = draw(st.sampled_from(["any", "any", "one resource", "bottleneck"]))
    demands: dict[str, Resources] = {}
    for k in range(draw(st.integers(2, 5))):
        cpus = draw(st.integers(0, 4))
        mem = 128 * draw(st.integers(0, 8))
        disk = 100 * draw(st.integers(0, 2))
        if shape == "one resource":
            cpus, mem, disk = max(cpus, 1), 0, 0
        if shape == "bottleneck":
            # Raise cpus until they are this task's dominant resource.
            mem = mem if total["mem"] else 0
            disk = disk if total["disk"] else 0
            shares = [Fraction(x) / total[r] for r, x in (("mem", mem), ("disk", disk)) if x]
            cpus = max([cpus] + [math.ceil(share * total["cpus"]) for share in shares])
        if cpus == 0 and mem == 0:
            cpus = 1  # a task that fits must make the agent offerable
        demands[f"f{k}"] = Resources(cpus=cpus, mem=mem, disk=disk)
    weights: dict[str, int | dict[str, int]] = {
        f: draw(st.integers(1, 3)) if weighted else 1 for f in demands
    }
    if vectors:
        for f in demands:
            if draw(st.booleans()):
                weights[f] = draw(st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 4)))
    max_tasks: dict[str, int] = {}
    if limited:
        max_tasks = {f: draw(st.integers(1, 6)) for f in demands if draw(st.booleans())}
    return Cluster(nodes, demands, weights, max_tasks)


def scalar(weight: int | dict[str, int]) -> int:
    assert not isinstance(weight, dict), "B3-B6 are for scalar weights"
    return weight


def replay_choices(cluster: Cluster, run: Run, policy: str = "drf") -> dict[str, Vector]:
    """Check every decision of `run` against the choice rule (B1); return free space."""
    total = cluster.total()
    need = {f: exact(d) for f, d in cluster.demands.items()}
    weight: dict[str, Weight] = {
        f: {r: Fraction(x) for r, x in w.items()} if isinstance(w, dict) else Fraction(w)
        for f, w in cluster.weights.items()
    }
    free = {a: exact(r) for a, r in cluster.agents.items()}
    held: dict[str, Vector] = {f: {} for f in need}
    tasks = dict.fromkeys(need, 0)
    done: set[str] = set()
    declined: dict[tuple[str, str], Vector] = {}
    by_cycle: dict[int, list[int]] = {}
    for k, offer in enumerate(run.offers):
        by_cycle.setdefault(offer.cycle, []).append(k)

    def eligible(agent: str) -> list[str]:
        return [
            f
            for f in need
            if f not in done
            and not ((f, agent) in declined and fits(free[agent], declined[(f, agent)]))
        ]

    for cycle in range(run.cycles):
        offers = [run.offers[k] for k in by_cycle.get(cycle, [])]
        offered = [o.agent_id for o in offers]
        assert len(set(offered)) == len(offered), f"cycle {cycle} offers an agent twice"
        for agent in free.keys() - set(offered):
            hungry = [f for f in eligible(agent) if fits(need[f], free[agent])]
            assert not hungry, f"cycle {cycle} skipped {agent} though {hungry} fit on it"
        pending: dict[str, Vector] = {f: {} for f in need}
        for o in offers:
            assert exact(o.resources) == free[o.agent_id], "an offer must be the whole free space"
            candidates = eligible(o.agent_id)
            assert o.framework_id in candidates, f"{o} went to a filtered or suppressed framework"
            share = {
                f: weighted_share(plus(held[f], pending[f]), total, weight[f], policy)
                for f in candidates
            }
            lowest = min(share.values())
            assert share[o.framework_id] <= lowest + TOL, (
                f"{o} went to share {float(share[o.framework_id])}, lowest {float(lowest)}"
            )
            pending[o.framework_id] = plus(pending[o.framework_id], free[o.agent_id])
        for o in offers:
            f, agent = o.framework_id, o.agent_id
            if o.launched:
                held[f] = plus(held[f], need[f])
                free[agent] = plus(free[agent], need[f], times=-1)
                tasks[f] += 1
                if tasks[f] == cluster.max_tasks.get(f):
                    done.add(f)
            elif o.declined:
                declined[(f, agent)] = exact(o.resources)
    assert tasks == run.tasks
    return free


POLICIES = pytest.mark.parametrize("policy", ["drf", "asset"])


@POLICIES
@ALLOCATOR
@given(clusters(agents=(1, 4), vectors=True), st.integers(0, 3))
def test_allocator_follows_the_choice_rule(policy: str, cluster: Cluster, seed: int) -> None:
    replay_choices(cluster, cluster.run(seed, policy), policy)


@POLICIES
@ALLOCATOR
@given(clusters(agents=(1, 4), vectors=True), st.integers(0, 3))
def test_allocator_is_pareto_efficient(policy: str, cluster: Cluster, seed: int) -> None:
    run = cluster.run(seed, policy)
    free = {a: exact(r) for a, r in cluster.agents.items()}
    for o in run.offers:
        if o.launched:
            free[o.agent_id] = plus(free[o.agent_id], exact(cluster.demands[o.framework_id]), -1)
    for f, demand in cluster.demands.items():
        if run.tasks[f] == cluster.max_tasks.get(f):
            continue
        for agent, space in free.items():
            assert not fits(exact(demand), space), f"{f}'s task still fits on {agent}"


@ALLOCATOR
@given(clusters(weighted=False))
def test_allocator_on_one_agent_is_discrete_drf(cluster: Cluster) -> None:
    [capacity] = cluster.agents.values()
    expected = discrete_drf(capacity, cluster.demands, max_tasks=cluster.max_tasks)
    assert cluster.run().tasks == expected.tasks


@dataclass(frozen=True)
class OneAgentOutcome:
    """A one-agent run in the notation of the module docstring, exactly."""

    n: dict[str, int]
    delta: dict[str, Fraction | None]  # None: needs a resource the agent lacks
    w: dict[str, Fraction]
    unfinished: list[str]  # ... with a task that could ever fit: the claims are about them
    at_stop: dict[str, dict[str, int]]  # task counts at T_i, for each unfinished i

    def s(self, f: str, n: int | None = None) -> Fraction:
        delta = self.delta[f]
        count = self.n[f] if n is None else n
        return Fraction(0) if count == 0 or delta is None else count * delta / self.w[f]


def one_agent_outcome(cluster: Cluster) -> OneAgentOutcome:
    run = cluster.run()
    [capacity_resources] = cluster.agents.values()
    capacity = exact(capacity_resources)
    need = {f: exact(d) for f, d in cluster.demands.items()}
    delta: dict[str, Fraction | None] = {}
    for f, d in need.items():
        lacking = any(not capacity.get(r) for r in d)
        delta[f] = None if lacking else max(x / capacity[r] for r, x in d.items())
    # Task counts after each launch, in order; state 0 is the start.
    counts = [dict.fromkeys(need, 0)]
    for o in run.offers:
        if o.launched:
            counts.append({**counts[-1], o.framework_id: counts[-1][o.framework_id] + 1})
    assert counts[-1] == run.tasks

    def free(state: Mapping[str, int]) -> Vector:
        used: Vector = {}
        for f, k in state.items():
            used = plus(used, need[f], times=k)
        return plus(capacity, used, times=-1)

    unfinished = [
        f for f in need if run.tasks[f] != cluster.max_tasks.get(f) and delta[f] is not None
    ]
    at_stop = {}
    for f in unfinished:
        stop = next(c for c in counts if not fits(need[f], free(c)))
        assert stop[f] == run.tasks[f]  # nothing for f after its task stopped fitting
        at_stop[f] = stop
    weights = {f: Fraction(scalar(w)) for f, w in cluster.weights.items()}
    return OneAgentOutcome(run.tasks, delta, weights, unfinished, at_stop)


@ALLOCATOR
@given(clusters())
def test_allocator_shares_stay_within_one_task_on_one_agent(cluster: Cluster) -> None:
    out = one_agent_outcome(cluster)
    for i in out.unfinished:
        for j, n_j in out.at_stop[i].items():
            if j == i or n_j == 0:
                continue
            task = out.s(j, 1)
            assert out.s(j, n_j) <= out.s(i) + task + TOL, (
                f"when {i} stopped, {j} was {float(out.s(j, n_j) - out.s(i))} above it, "
                f"more than its task {float(task)}"
            )


@ALLOCATOR
@given(clusters())
def test_allocator_gives_sharing_incentive_within_one_task_per_user(cluster: Cluster) -> None:
    out = one_agent_outcome(cluster)
    total_weight = sum(out.w.values())
    for i in out.unfinished:
        delta_i = out.delta[i]
        assert delta_i is not None
        others = sum(
            (d for j, d in out.delta.items() if j != i and out.n[j] and d is not None),
            Fraction(0),
        )
        assert total_weight * out.s(i) > 1 - delta_i - others - TOL, i


@ALLOCATOR
@given(clusters())
def test_allocator_is_envy_free_within_one_task_of_each(cluster: Cluster) -> None:
    out = one_agent_outcome(cluster)
    need = {f: exact(d) for f, d in cluster.demands.items()}
    for i in out.unfinished:
        delta_i = out.delta[i]
        assert delta_i is not None
        for j in need:
            delta_j = out.delta[j]
            if j == i or out.n[j] == 0 or delta_j is None:
                continue
            ratio = out.w[i] / out.w[j]
            envy = ratio * tasks_in(plus({}, need[j], times=out.n[j]), need[i])
            assert envy < out.n[i] + ratio * (1 + delta_j / delta_i) + TOL, (i, j)


# Pinned instances: what whole tasks cannot do -----------------------------------


def one_agent(cpus: int, demands: Mapping[str, int]) -> dict[str, int]:
    cluster = Cluster(
        agents={"s0": Resources(cpus=cpus)},
        demands={f: Resources(cpus=c) for f, c in demands.items()},
        weights=dict.fromkeys(demands, 1),
        max_tasks={},
    )
    return cluster.run().tasks


def test_whole_tasks_are_not_strategy_proof() -> None:
    # A, subscribed first, needs 1 cpu per task; B needs 2. Truthful, A runs
    # 1 task and B fills the rest. Declaring 3-cpu tasks, A takes the agent
    # before B can fit, and runs 3 real tasks in its one "task".
    assert one_agent(3, {"A": 1, "B": 2}) == {"A": 1, "B": 1}
    assert one_agent(3, {"A": 3, "B": 2}) == {"A": 1, "B": 0}
    assert discrete_drf({"cpus": 3}, {"A": {"cpus": 3}, "B": {"cpus": 2}}).tasks["A"] == 1


def test_whole_tasks_are_not_population_monotone() -> None:
    # With u0 there, u1's 4-cpu task never fits and u2 gets 2 tasks; without
    # u0, u1 takes the whole agent first and u2 gets none.
    assert one_agent(4, {"u0": 1, "u1": 4, "u2": 1}) == {"u0": 2, "u1": 0, "u2": 2}
    assert one_agent(4, {"u1": 4, "u2": 1}) == {"u1": 1, "u2": 0}


def test_discrete_share_can_fall_more_than_a_task_below_the_reference() -> None:
    # The fractional reference gives each of three users a third of 10 cpus.
    # With whole tasks C gets nothing: 1/3 short, more than its task's 3/10.
    demands = {"A": {"cpus": 4}, "B": {"cpus": 4}, "C": {"cpus": 3}}
    reference = drf({"cpus": 10}, demands)
    assert reference.dominant_shares["C"] == Fraction(1, 3)
    assert one_agent(10, {u: d["cpus"] for u, d in demands.items()}) == {"A": 1, "B": 1, "C": 0}
    # B4 still holds: A and B are each one task (4/10) above C.


def test_fragmentation_breaks_the_one_agent_bounds_on_several_agents() -> None:
    # Four 2-cpu agents: B's 3-cpu task fits on none, though 8 cpus are in the
    # cluster and B alone on half of it could run 4/3 tasks.
    cluster = Cluster(
        agents={f"s{k}": Resources(cpus=2, mem=1024) for k in range(4)},
        demands={"A": Resources(cpus=1, mem=256), "B": Resources(cpus=3, mem=256)},
        weights={"A": 1, "B": 1},
        max_tasks={},
    )
    assert cluster.run().tasks == {"A": 8, "B": 0}
    # B5's bound would need 2 * s_B > 1 - 3/8 - 1/8 = 1/2.
    delta = {"A": Fraction(1, 8), "B": Fraction(3, 8)}
    assert not 2 * Fraction(0) > 1 - delta["B"] - delta["A"]
