"""Exact reference allocations: DRF and asset fairness by progressive filling.

What the allocator approximates, computed exactly with `fractions.Fraction` on
small instances, so that tests can check fairness properties without rounding
and tools can print "the DRF equilibrium computed from the demands" next to
measured averages.

The model is the DRF paper's (Ghodsi et al., NSDI 2011): one pool of
resources with a `capacity` vector; each user runs identical tasks, each
needing a `demand` vector; a user may have a `weight` (default 1) and a
`max_tasks` (finite demand; default unbounded). User i given x_i tasks holds
x_i * demand_i. A weight is a number, or a weight vector (the paper's weighted
DRF: W_i = (w_i1, ..., w_im)) given as a mapping from resource to weight, the
resources it does not name weighing 1; each resource's share is divided by its
own weight, so the weighted dominant share is max_r(x_i d_ir / C_r / w_ir).

`drf` treats tasks as divisible (x_i may be any non-negative rational) and
runs progressive filling: the weighted dominant share x_i * max_r(d_ir / C_r)
/ w_i of every unfrozen user rises at the same rate until a resource is used
up or a user reaches its `max_tasks`; users that need a used-up resource, or
are done, freeze; the rest carry on. The result equalises weighted dominant
shares as far as capacity allows::

    >>> a = drf({"cpus": 9, "mem": 18}, {"A": {"cpus": 1, "mem": 4},
    ...                                  "B": {"cpus": 3, "mem": 1}})
    >>> a.tasks == {"A": 3, "B": 2}, a.dominant_shares["A"], sorted(a.saturated)
    (True, Fraction(2, 3), ['cpus'])

`asset_fairness` runs the same filling on each user's *sum* of shares instead
of the largest one (the paper's section 5.1 alternative, which breaks sharing
incentive). `discrete_drf` hands out whole tasks one at a time to the user
with the lowest weighted dominant share, as a single-agent cluster does; it is
what `master.allocator.Allocator` does on one agent with frameworks that
launch one task per offer.

Amounts may be `int`, `Fraction` or `float`; a float is read as the decimal it
prints as (0.1 means 1/10), which is exact for `Resources` amounts. Resources
missing from `capacity` have capacity 0. Every user must need some resource
(a task needing nothing would be infinitely many tasks). Everything is exact
rational arithmetic; progressive filling is O(n) rounds of O(n m) work, and
`discrete_drf` O(tasks * n), so keep instances small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "Amount",
    "FairAllocation",
    "Weight",
    "asset_fairness",
    "discrete_drf",
    "drf",
    "to_fraction",
]

Amount = int | float | Fraction


def to_fraction(amount: Amount) -> Fraction:
    """An exact Fraction; floats are read as the decimal they print as."""
    if isinstance(amount, bool) or not isinstance(amount, int | float | Fraction):
        raise TypeError(f"amount {amount!r} is not a number")
    if isinstance(amount, float):
        if not math.isfinite(amount):
            raise ValueError(f"amount {amount} is not finite")
        # repr is the shortest decimal that round-trips; Fraction(amount) would
        # give the binary value, so 0.1 would not be 1/10.
        return Fraction(repr(amount))
    return Fraction(amount)


@dataclass(frozen=True, slots=True)
class FairAllocation:
    """An allocation of tasks to users, with what is needed to read it.

    `capacity` and `demands` are the input as Fractions: `demands` keeps
    positive entries only, and `capacity` also lists demanded resources it
    lacked, at 0. `tasks[u]` is user u's number of tasks (an integer-valued
    Fraction for `discrete_drf`). `weights[u]` is u's weight for the resources
    `resource_weights[u]` does not name (1 for a weight vector), and
    `resource_weights[u]` its weight vector's entries (empty for a plain weight).
    `shares[u]` is the weighted quantity the policy equalises:
    the weighted dominant share for `drf` and `discrete_drf`, the weighted
    asset share (sum of shares over resources, divided by the weight) for
    `asset_fairness`. `dominant_shares[u]` is the unweighted dominant share
    max_r(tasks * demand_r / capacity_r). `saturated` holds the resources that
    some user needs and that are fully used; `finished` the users that reached
    their `max_tasks`.
    """

    capacity: Mapping[str, Fraction]
    demands: Mapping[str, Mapping[str, Fraction]]
    weights: Mapping[str, Fraction]
    resource_weights: Mapping[str, Mapping[str, Fraction]]
    tasks: Mapping[str, Fraction]
    shares: Mapping[str, Fraction]
    dominant_shares: Mapping[str, Fraction]
    saturated: frozenset[str]
    finished: frozenset[str]

    def allocation(self, user: str) -> dict[str, Fraction]:
        """The resources user `user` holds: tasks times demand."""
        n = self.tasks[user]
        return {r: n * d for r, d in self.demands[user].items()}

    def usage(self) -> dict[str, Fraction]:
        """Total use of every resource (capacity's and demanded ones)."""
        used = dict.fromkeys(self.capacity, Fraction(0))
        for user, demand in self.demands.items():
            for r, d in demand.items():
                used[r] = used.get(r, Fraction(0)) + self.tasks[user] * d
        return used


# Input ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Problem:
    capacity: dict[str, Fraction]  # every resource anyone demands has an entry
    demands: dict[str, dict[str, Fraction]]  # positive entries only
    weights: dict[str, Fraction]
    resource_weights: dict[str, dict[str, Fraction]]
    max_tasks: dict[str, Fraction | None]

    def weighted_unit_shares(self, user: str) -> dict[str, Fraction] | None:
        """`unit_shares`, each divided by the user's weight for that resource."""
        unit = self.unit_shares(user)
        if unit is None:
            return None
        named, weight = self.resource_weights[user], self.weights[user]
        return {r: share / named.get(r, weight) for r, share in unit.items()}

    def unit_shares(self, user: str) -> dict[str, Fraction] | None:
        """Share of each resource one task takes; None if it needs a resource with no capacity."""
        shares: dict[str, Fraction] = {}
        for r, d in self.demands[user].items():
            if self.capacity[r] == 0:
                return None
            shares[r] = d / self.capacity[r]
        return shares


Weight = Amount | Mapping[str, Amount]


def _problem(
    capacity: Mapping[str, Amount],
    demands: Mapping[str, Mapping[str, Amount]],
    weights: Mapping[str, Weight] | None,
    max_tasks: Mapping[str, Amount | None] | None,
) -> _Problem:
    cap: dict[str, Fraction] = {}
    for r, amount in capacity.items():
        cap[r] = to_fraction(amount)
        if cap[r] < 0:
            raise ValueError(f"capacity of {r!r} is negative: {amount}")
    dem: dict[str, dict[str, Fraction]] = {}
    for user, demand in demands.items():
        vector: dict[str, Fraction] = {}
        for r, amount in demand.items():
            d = to_fraction(amount)
            if d < 0:
                raise ValueError(f"user {user!r} demands a negative amount of {r!r}: {amount}")
            if d:
                vector[r] = d
                cap.setdefault(r, Fraction(0))
        if not vector:
            raise ValueError(
                f"user {user!r} demands nothing, so it would run infinitely many tasks"
            )
        dem[user] = vector
    w: dict[str, Fraction] = {}
    vectors: dict[str, dict[str, Fraction]] = {}
    mx: dict[str, Fraction | None] = {}
    for name, table in (("weights", weights), ("max_tasks", max_tasks)):
        unknown = set(table or {}) - set(dem)
        if unknown:
            raise ValueError(f"{name} names unknown users: {sorted(unknown)}")
    for user in dem:
        given = (weights or {}).get(user, 1)
        w[user], vectors[user] = Fraction(1), {}
        if isinstance(given, Mapping):
            for r, amount in given.items():
                vectors[user][r] = _positive_weight(user, amount, f" for {r!r}")
        else:
            w[user] = _positive_weight(user, given, "")
        limit = (max_tasks or {}).get(user)
        bound = None if limit is None else to_fraction(limit)
        if bound is not None and bound < 0:
            raise ValueError(f"max_tasks of {user!r} is negative: {limit}")
        mx[user] = bound
    return _Problem(cap, dem, w, vectors, mx)


def _positive_weight(user: str, amount: Amount, what: str) -> Fraction:
    weight = to_fraction(amount)
    if weight <= 0:
        raise ValueError(f"weight of {user!r}{what} must be positive, got {weight}")
    return weight


# Progressive filling --------------------------------------------------------


def _progressive_filling(
    p: _Problem, measure: Callable[[dict[str, Fraction]], Fraction]
) -> FairAllocation:
    """Raise every unfrozen user's weighted `measure` at the same rate.

    `measure` maps one task's per-resource shares to the share the policy
    counts for it (max for DRF, sum for asset fairness); dividing by the
    weight gives `cost[u]`, the weighted share one task adds. All unfrozen
    users sit at the same level t and hold t / cost[u] tasks, so each
    resource's use is linear in t between events and the next event is
    found exactly by one division per resource and per capped user.
    """
    tasks = {u: Fraction(0) for u in p.demands}
    cost: dict[str, Fraction] = {}
    active: list[str] = []
    for u in p.demands:
        unit = p.weighted_unit_shares(u)
        if unit is None:
            continue  # needs a resource with no capacity: frozen at zero tasks
        cost[u] = measure(unit)
        if p.max_tasks[u] != 0:
            active.append(u)
    # Use by frozen users, which no longer changes.
    frozen_use = dict.fromkeys(p.capacity, Fraction(0))
    level = Fraction(0)
    while active:
        # Use of resource r at level t is frozen_use[r] + t * rate[r].
        rate = dict.fromkeys(p.capacity, Fraction(0))
        for u in active:
            for r, d in p.demands[u].items():
                rate[r] += d / cost[u]
        events = [(p.capacity[r] - frozen_use[r]) / rate[r] for r in rate if rate[r]]
        for u in active:
            limit = p.max_tasks[u]
            if limit is not None:
                events.append(limit * cost[u])
        # Every active user needs some resource, so `events` is never empty.
        level = min(events)
        for u in active:
            tasks[u] = level / cost[u]
        full = {r for r in rate if rate[r] and frozen_use[r] + level * rate[r] == p.capacity[r]}
        still: list[str] = []
        for u in active:
            if tasks[u] == p.max_tasks[u] or not full.isdisjoint(p.demands[u]):
                for r, d in p.demands[u].items():
                    frozen_use[r] += tasks[u] * d
            else:
                still.append(u)
        active = still
    return _result(p, tasks, cost)


def _result(p: _Problem, tasks: dict[str, Fraction], cost: dict[str, Fraction]) -> FairAllocation:
    used = dict.fromkeys(p.capacity, Fraction(0))
    for u, demand in p.demands.items():
        for r, d in demand.items():
            used[r] += tasks[u] * d
    demanded = {r for demand in p.demands.values() for r in demand}
    saturated = frozenset(r for r in demanded if used[r] == p.capacity[r])
    dominant: dict[str, Fraction] = {}
    for u in p.demands:
        unit = p.unit_shares(u)
        dominant[u] = Fraction(0) if unit is None else tasks[u] * max(unit.values())
    return FairAllocation(
        capacity=p.capacity,
        demands=p.demands,
        weights=p.weights,
        resource_weights=p.resource_weights,
        tasks=tasks,
        shares={u: tasks[u] * cost[u] if u in cost else Fraction(0) for u in p.demands},
        dominant_shares=dominant,
        saturated=saturated,
        finished=frozenset(u for u in p.demands if tasks[u] == p.max_tasks[u]),
    )


def drf(
    capacity: Mapping[str, Amount],
    demands: Mapping[str, Mapping[str, Amount]],
    weights: Mapping[str, Weight] | None = None,
    max_tasks: Mapping[str, Amount | None] | None = None,
) -> FairAllocation:
    """Weighted DRF with divisible tasks, by progressive filling (exact).

    `demands` maps each user to its per-task demand vector; `weights` and
    `max_tasks` map users to their weight (default 1; a number or a weight
    vector) and task limit (default none). See the module docstring for the model.
    """
    return _progressive_filling(_problem(capacity, demands, weights, max_tasks), _largest)


def asset_fairness(
    capacity: Mapping[str, Amount],
    demands: Mapping[str, Mapping[str, Amount]],
    weights: Mapping[str, Weight] | None = None,
    max_tasks: Mapping[str, Amount | None] | None = None,
) -> FairAllocation:
    """Weighted asset fairness: progressive filling on the sum of a user's shares.

    Equal shares of different resources are worth the same, so each user's
    total "spend" sum_r(x_i d_ir / C_r / w_ir) is equalised as far as capacity
    allows. In the paper's example this gives A 63/25 and B 54/25 tasks.
    """
    return _progressive_filling(_problem(capacity, demands, weights, max_tasks), _total)


def _largest(unit: dict[str, Fraction]) -> Fraction:
    return max(unit.values())


def _total(unit: dict[str, Fraction]) -> Fraction:
    return sum(unit.values(), Fraction(0))


# Whole tasks ------------------------------------------------------------------


def discrete_drf(
    capacity: Mapping[str, Amount],
    demands: Mapping[str, Mapping[str, Amount]],
    weights: Mapping[str, Weight] | None = None,
    max_tasks: Mapping[str, Amount | None] | None = None,
) -> FairAllocation:
    """Weighted DRF with whole tasks on one pool, one task at a time (exact).

    Repeatedly take the user with the lowest weighted dominant share among
    those still running (ties go to the user listed first in `demands`, as the
    sorter breaks ties by subscription order); give it one task if the task
    fits in what is free, otherwise drop the user for good (what is free only
    shrinks, so it never fits later). A user that reaches `max_tasks` is
    dropped too. This is the allocator on one agent, with frameworks that
    launch one task per offer and decline an offer that fits no task.
    """
    p = _problem(capacity, demands, weights, max_tasks)
    for u, limit in p.max_tasks.items():
        if limit is not None and limit.denominator != 1:
            raise ValueError(f"max_tasks of {u!r} must be a whole number of tasks, got {limit}")
    tasks = {u: Fraction(0) for u in p.demands}
    cost: dict[str, Fraction] = {}
    for u in p.demands:
        unit = p.weighted_unit_shares(u)
        if unit is not None:
            cost[u] = max(unit.values())
    free = dict(p.capacity)
    order = {u: i for i, u in enumerate(p.demands)}
    # A user needing a resource with no capacity fits no task: never running.
    running = {u for u in cost if p.max_tasks[u] != 0}
    while running:
        u = min(running, key=lambda v: (tasks[v] * cost[v], order[v]))
        demand = p.demands[u]
        if all(free[r] >= d for r, d in demand.items()):
            for r, d in demand.items():
                free[r] -= d
            tasks[u] += 1
            if tasks[u] == p.max_tasks[u]:
                running.discard(u)
        else:
            running.discard(u)
    return _result(p, tasks, cost)
