"""The DRF paper's fairness properties, as checks on one instance of one policy.

The model is the paper's analysis (section 6): one pool of resources with
capacities C_r, n users each running identical divisible tasks with demand
vector d_i (some entries may be 0), wanting as many tasks as they can get
(Leontief preferences: a user values a bundle by the tasks it can run in it).
A policy maps (C, d) to task counts x_i. Three policies, each with a reference
implementation: asset fairness and DRF exactly (`drf_reference`, rational
arithmetic), CEEI to a proven error bound per user (`ceei`).

Each check takes a case and returns None if the property holds on it, else a
sentence saying how it fails. With CEEI a difference counts only beyond the
error bounds of the task counts involved, so a failure reported is a real
failure of the exact CEEI allocation, and a pass means "holds to within the
bounds" (about 1e-7 of what a user could run alone). The properties, as the
paper defines them (section 3), for unweighted users:

- sharing incentive: x_i >= what i could run alone on 1/n of every resource;
- strategy-proofness: declaring another demand vector d' never gets i more
  true tasks (tasks of d_i that fit in what it is given, x'_i d');
- envy-freeness: no i could run more tasks in j's bundle than in its own;
- Pareto efficiency: no user can be given more without taking from another,
  i.e. every user needs some resource that is used up;
- single-resource fairness: with one resource, max-min fairness (each user
  gets C / n of it);
- bottleneck fairness: if one resource is every user's dominant resource (the
  largest share per task), max-min fairness on it (C_r / n each);
- population monotonicity: when a user leaves, no other user's tasks decrease;
- resource monotonicity: when capacities grow, no user's tasks decrease.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from mesolite.lab.drf_reference import asset_fairness, drf

__all__ = [
    "PROPERTIES",
    "Growth",
    "Instance",
    "Lie",
    "Outcome",
    "Policy",
    "Property",
    "policies",
]

Capacity = dict[str, int]
Demands = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Task counts, each within `error[u]` of the policy's exact allocation (0: exact)."""

    tasks: Mapping[str, Fraction]
    error: Mapping[str, Fraction]


Policy = Callable[[Capacity, Demands], Outcome]


def _exact(solve: Callable[[Capacity, Demands], object]) -> Policy:
    def policy(capacity: Capacity, demands: Demands) -> Outcome:
        tasks = solve(capacity, demands).tasks  # type: ignore[attr-defined]
        return Outcome(dict(tasks), dict.fromkeys(tasks, Fraction(0)))

    return policy


def _ceei(capacity: Capacity, demands: Demands) -> Outcome:
    from mesolite.lab.ceei import ceei  # scipy: only when CEEI is asked for

    a = ceei(capacity, demands)
    # Fraction(float) is the float's exact value: the checks below stay exact.
    return Outcome(
        {u: Fraction(x) for u, x in a.tasks.items()},
        {u: Fraction(e) for u, e in a.error.items()},
    )


def policies() -> dict[str, Policy]:
    """The three policies of the paper's table, in its column order."""
    return {"asset": _exact(asset_fairness), "ceei": _ceei, "drf": _exact(drf)}


# Cases ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instance:
    """Capacities and each user's per-task demand (whole numbers, as the search draws them)."""

    capacity: Capacity
    demands: Demands

    def __str__(self) -> str:
        users = ", ".join(f"{u} {_vector(d, self.capacity)}" for u, d in self.demands.items())
        return f"capacity {_vector(self.capacity, self.capacity)}; {users}"


@dataclass(frozen=True, slots=True)
class Lie:
    instance: Instance
    liar: str
    declared: dict[str, int]

    def __str__(self) -> str:
        return (
            f"{self.instance}; {self.liar} declares "
            f"{_vector(self.declared, self.instance.capacity)}"
        )


@dataclass(frozen=True, slots=True)
class Growth:
    """An instance, and what is added to its capacities (resource monotonicity)."""

    instance: Instance
    added: dict[str, int]

    def __str__(self) -> str:
        return f"{self.instance}; then {_vector(self.added, self.instance.capacity)} more"


def _vector(amounts: Mapping[str, int], order: Mapping[str, int]) -> str:
    return "<" + ", ".join(f"{amounts.get(r, 0)}" for r in order) + ">"


# Helpers --------------------------------------------------------------------------


def _tasks_in(bundle: Mapping[str, Fraction], demand: Mapping[str, int]) -> Fraction:
    """How many tasks of `demand` fit in `bundle` (divisible tasks)."""
    return min(bundle.get(r, Fraction(0)) / d for r, d in demand.items() if d)


def _bundle(tasks: Fraction, demand: Mapping[str, int]) -> dict[str, Fraction]:
    return {r: tasks * d for r, d in demand.items() if d}


def _ratio(top: Mapping[str, int], bottom: Mapping[str, int]) -> Fraction:
    """max over r needed by `bottom` of top_r / bottom_r: how an error in `top` tasks scales."""
    return max(Fraction(top.get(r, 0), d) for r, d in bottom.items() if d)


def _fmt(x: Fraction) -> str:
    return f"{float(x):.4g}"


# The properties -------------------------------------------------------------------


def sharing_incentive(policy: Policy, case: Instance) -> str | None:
    out = policy(case.capacity, case.demands)
    n = len(case.demands)
    for u, d in case.demands.items():
        alone = min(Fraction(case.capacity[r], n * x) for r, x in d.items() if x)
        if out.tasks[u] + out.error[u] < alone:
            return f"{u} gets {_fmt(out.tasks[u])} tasks, {_fmt(alone)} alone on 1/{n}"
    return None


def strategy_proofness(policy: Policy, case: Lie) -> str | None:
    inst = case.instance
    truthful = policy(inst.capacity, inst.demands)
    lying = policy(inst.capacity, {**inst.demands, case.liar: case.declared})
    true_demand = inst.demands[case.liar]
    got = lying.tasks[case.liar]
    real = _tasks_in(_bundle(got, case.declared), true_demand)
    allowance = lying.error[case.liar] * _ratio(case.declared, true_demand)
    honest = truthful.tasks[case.liar] + truthful.error[case.liar]
    if real - allowance > honest:
        return (
            f"{case.liar} runs {_fmt(real)} real tasks lying, "
            f"{_fmt(truthful.tasks[case.liar])} truthful"
        )
    return None


def envy_freeness(policy: Policy, case: Instance) -> str | None:
    out = policy(case.capacity, case.demands)
    for i, di in case.demands.items():
        for j, dj in case.demands.items():
            if i == j:
                continue
            envied = _tasks_in(_bundle(out.tasks[j], dj), di)
            allowance = out.error[i] + out.error[j] * _ratio(dj, di)
            if envied - allowance > out.tasks[i]:
                mine = _fmt(out.tasks[i])
                return f"{i} could run {_fmt(envied)} tasks in {j}'s bundle, {mine} in its own"
    return None


def pareto_efficiency(policy: Policy, case: Instance) -> str | None:
    out = policy(case.capacity, case.demands)
    used: dict[str, Fraction] = dict.fromkeys(case.capacity, Fraction(0))
    slack: dict[str, Fraction] = dict.fromkeys(case.capacity, Fraction(0))
    for u, d in case.demands.items():
        for r, x in d.items():
            if x:
                used[r] += out.tasks[u] * x
                slack[r] += out.error[u] * x
    for u, d in case.demands.items():
        # u could get more if every resource it needs has room left.
        if all(used[r] + slack[r] < case.capacity[r] for r, x in d.items() if x):
            return f"{u} could get more: every resource it needs has room left"
    return None


def _max_min_on(policy: Policy, case: Instance, r: str) -> str | None:
    out = policy(case.capacity, case.demands)
    fair = Fraction(case.capacity[r], len(case.demands))
    for u, d in case.demands.items():
        if abs(out.tasks[u] * d[r] - fair) > out.error[u] * d[r]:
            return f"{u} gets {_fmt(out.tasks[u] * d[r])} of {r}, max-min gives {_fmt(fair)}"
    return None


def single_resource_fairness(policy: Policy, case: Instance) -> str | None:
    if len(case.capacity) != 1:
        return None  # the property says nothing about several resources
    [r] = case.capacity
    return _max_min_on(policy, case, r)


def common_bottleneck(case: Instance) -> str | None:
    """A resource every user needs the largest share of per task, if there is one."""
    for r, c in case.capacity.items():
        if all(
            d.get(r, 0)
            and all(Fraction(x, case.capacity[s]) <= Fraction(d[r], c) for s, x in d.items())
            for d in case.demands.values()
        ):
            return r
    return None


def bottleneck_fairness(policy: Policy, case: Instance) -> str | None:
    r = common_bottleneck(case)
    return None if r is None else _max_min_on(policy, case, r)


def population_monotonicity(policy: Policy, case: Instance) -> str | None:
    before = policy(case.capacity, case.demands)
    for leaver in case.demands:
        rest = {u: d for u, d in case.demands.items() if u != leaver}
        if not rest:
            continue
        after = policy(case.capacity, rest)
        for u in rest:
            if after.tasks[u] + after.error[u] < before.tasks[u] - before.error[u]:
                return (
                    f"when {leaver} leaves, {u} goes from {_fmt(before.tasks[u])} "
                    f"to {_fmt(after.tasks[u])} tasks"
                )
    return None


def resource_monotonicity(policy: Policy, case: Growth) -> str | None:
    inst = case.instance
    before = policy(inst.capacity, inst.demands)
    grown = {r: c + case.added.get(r, 0) for r, c in inst.capacity.items()}
    after = policy(grown, inst.demands)
    for u in inst.demands:
        if after.tasks[u] + after.error[u] < before.tasks[u] - before.error[u]:
            return f"{u} goes from {_fmt(before.tasks[u])} to {_fmt(after.tasks[u])} tasks"
    return None


@dataclass(frozen=True, slots=True)
class Property:
    """One row of the paper's table: its check, its case kind, the paper's verdicts."""

    name: str
    check: Callable[[Policy, object], str | None]
    case: str  # "instance", "one resource", "bottleneck", "lie" or "growth"
    paper: Mapping[str, bool]  # policy -> does the paper say it has the property


def _row(name: str, check: object, case: str, asset: bool, ceei: bool, drf: bool) -> Property:
    verdicts = {"asset": asset, "ceei": ceei, "drf": drf}
    return Property(name, check, case, verdicts)  # type: ignore[arg-type]


# The paper's Table 2 (Ghodsi et al., NSDI 2011, section 6), row by row.
PROPERTIES = (
    _row("Sharing incentive", sharing_incentive, "instance", False, True, True),
    _row("Strategy-proofness", strategy_proofness, "lie", True, False, True),
    _row("Envy-freeness", envy_freeness, "instance", True, True, True),
    _row("Pareto efficiency", pareto_efficiency, "instance", True, True, True),
    _row("Single resource fairness", single_resource_fairness, "one resource", True, True, True),
    _row("Bottleneck fairness", bottleneck_fairness, "bottleneck", False, True, True),
    _row("Population monotonicity", population_monotonicity, "instance", True, False, True),
    _row("Resource monotonicity", resource_monotonicity, "growth", False, False, False),
)
