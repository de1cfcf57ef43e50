"""CEEI, the DRF paper's third policy: competitive equilibrium from equal incomes.

Each user starts with 1/n of every resource (an equal income) and trades in a
perfectly competitive market; with Leontief demands (user i's task needs d_i,
so x_i tasks need x_i d_i and anything beyond that is useless to it) the
equilibrium is the Nash bargaining solution, the optimum of the Eisenberg-Gale
convex program

    maximise    sum_i b_i log x_i
    subject to  sum_i x_i d_ir <= C_r   for every resource r,   x_i >= 0

with incomes b_i all equal (`weights` gives unequal incomes; a user's weight
is its income). The paper's example, <9 CPUs, 18 GB> with A <1 CPU, 4 GB> and
B <3 CPUs, 1 GB>, maximises x y subject to x + 3y <= 9 and 4x + y <= 18: both
constraints bind, x = 45/11 and y = 18/11.

**How it is solved.** The optimum is generally irrational, so it is found
numerically, with scipy: SLSQP on the program written in u_i = log x_i (a
linear objective under smooth convex constraints, started from the feasible
point where each user has 1/n of everything), then the market prices p_r >= 0
(the constraints' multipliers) by non-negative least squares on the
stationarity condition b_i = x_i sum_r p_r d_ir / C_r, refined by Newton steps
on the binding resources (numpy). None of that is trusted: the answer carries a
certificate.

**The certificate.** For prices p >= 0 the Lagrangian dual gives an upper
bound on the optimum, g(p) = sum_r p_r C_r + sum_i b_i (log(b_i / (d_i . p)) -
1), and any feasible x a lower bound f(x) = sum_i b_i log x_i; their gap
bounds how far f(x) is from the optimum. The objective is strongly concave on
the feasible set, where x_i <= U_i = min_r C_r / d_ir (what i could run with
the whole cluster), so (Taylor, and the optimum's first-order condition)

    sum_i b_i ((x_i - x*_i) / U_i)^2 <= 2 (f(x*) - f(x)) <= 2 gap,

hence |x_i - x*_i| <= U_i sqrt(2 gap / b_i). Incomes are normalised to sum 1.
Float rounding is accounted for: the gap is computed from a handful of correctly
rounded sums, so a margin of 4 (n + m + 4) machine epsilons covers its error,
and the returned x_i, one division and one scaling away from the x the
certificate speaks of, gets 4 (n + 2m + 4) epsilons of it added. The sum is
`error[i]`, a proven bound on the distance of each returned task count from the
exact equilibrium; on the paper's example and on random instances it is about
1e-7 of U_i. `ceei` raises `CEEIError` if a bound is above `tolerance` times U_i
(default 1e-5), and never returns an answer it cannot vouch for.

Users that need a resource with no capacity get 0 tasks (log 0 has no
optimum, and they cannot run anything); the others share the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.optimize import minimize, nnls

from mesolite.errors import MesoliteError
from mesolite.lab.drf_reference import Amount, Weight, _problem

__all__ = ["CEEIAllocation", "CEEIError", "ceei"]

DEFAULT_TOLERANCE = 1e-5
_EPS = float(np.finfo(float).eps)
_NEWTON_STEPS = 30


class CEEIError(MesoliteError, ArithmeticError):
    """The solver's answer could not be certified to the requested tolerance."""


@dataclass(frozen=True, slots=True)
class CEEIAllocation:
    """The CEEI allocation: tasks per user (floats), with a proven error bound each.

    `capacity` and `demands` are the input (demands: positive entries only).
    `tasks[u]` is within `error[u]` of the exact equilibrium's task count.
    `prices[r]` is the market price of all of resource r when the incomes add
    up to 1 (0 for a resource left over). `gap` is the certified duality gap.
    """

    capacity: Mapping[str, Fraction]
    demands: Mapping[str, Mapping[str, Fraction]]
    incomes: Mapping[str, float]
    tasks: Mapping[str, float]
    error: Mapping[str, float]
    prices: Mapping[str, float]
    gap: float

    def allocation(self, user: str) -> dict[str, float]:
        """The resources user `user` holds: tasks times demand."""
        n = self.tasks[user]
        return {r: n * float(d) for r, d in self.demands[user].items()}

    def usage(self) -> dict[str, float]:
        used = dict.fromkeys(self.capacity, 0.0)
        for user, demand in self.demands.items():
            for r, d in demand.items():
                used[r] += self.tasks[user] * float(d)
        return used

    def dominant_share(self, user: str) -> float:
        """max_r(tasks * d_r / C_r); 0 for a user that needs a resource with no capacity."""
        shares = [
            self.tasks[user] * float(d / self.capacity[r])
            for r, d in self.demands[user].items()
            if self.capacity[r]
        ]
        return max(shares, default=0.0)


def ceei(
    capacity: Mapping[str, Amount],
    demands: Mapping[str, Mapping[str, Amount]],
    weights: Mapping[str, Amount] | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> CEEIAllocation:
    """The CEEI allocation with divisible tasks (see the module docstring).

    Input as for `mesolite.lab.drf_reference.drf`: `weights` are incomes
    (default 1 each), numbers only. Raises `CEEIError` if the answer cannot be
    certified within `tolerance` (times what each user could run alone).
    """
    for user, weight in (weights or {}).items():
        if isinstance(weight, Mapping):
            raise ValueError(f"CEEI takes an income per user, not a weight vector ({user!r})")
    incomes_given: Mapping[str, Weight] | None = weights
    p = _problem(capacity, demands, incomes_given, None)
    users = [u for u in p.demands if p.unit_shares(u) is not None]
    tasks = dict.fromkeys(p.demands, 0.0)
    error = dict.fromkeys(p.demands, 0.0)
    incomes = {u: float(p.weights[u]) for u in p.demands}
    if not users:
        return CEEIAllocation(p.capacity, p.demands, incomes, tasks, error, {}, 0.0)
    resources = sorted({r for u in users for r in p.demands[u]})
    # One task's share of each resource: the program with every capacity 1.
    shares = np.array(
        [[float(p.demands[u].get(r, 0) / p.capacity[r]) for r in resources] for u in users]
    )
    budget = np.array([incomes[u] for u in users])
    budget = budget / budget.sum()
    x, prices, gap = _solve(shares, budget)
    n, m = shares.shape
    gap += 4 * (n + m + 4) * _EPS
    alone = 1.0 / shares.max(axis=1)  # U_i: tasks with the whole cluster
    bound = alone * np.sqrt(2 * gap / budget) + 4 * (n + 2 * m + 4) * _EPS * x
    worst = float(np.max(bound / alone))
    if not worst <= tolerance:
        raise CEEIError(
            f"CEEI not certified: duality gap {gap:.3g} bounds the error by {worst:.3g} of "
            f"what a user could run alone, above the tolerance {tolerance:g}"
        )
    for k, u in enumerate(users):
        tasks[u] = float(x[k])
        error[u] = float(bound[k])
    price_of = {r: float(prices[j]) for j, r in enumerate(resources)}
    return CEEIAllocation(p.capacity, p.demands, incomes, tasks, error, price_of, gap)


def _solve(shares: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(tasks, prices, certified gap) for capacities 1 and incomes summing to 1."""
    n = shares.shape[0]
    start = np.log(1.0 / (n * shares.max(axis=1)))  # 1/n of everything each: feasible

    def usage_slack(u: np.ndarray) -> np.ndarray:
        result: np.ndarray = 1.0 - shares.T @ np.exp(u)
        return result

    def usage_slack_jacobian(u: np.ndarray) -> np.ndarray:
        result: np.ndarray = -(shares * np.exp(u)[:, None]).T
        return result

    solved = minimize(
        lambda u: -float(budget @ u),
        start,
        jac=lambda u: -budget,
        method="SLSQP",
        constraints=[{"type": "ineq", "fun": usage_slack, "jac": usage_slack_jacobian}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    x = np.exp(solved.x)
    prices = _prices(shares, budget, x)
    best = _certify(shares, budget, prices)
    # Newton on the binding resources' prices: sum_i b_i a_ir / (a_i . p) = 1.
    for _ in range(_NEWTON_STEPS):
        binding = prices > 0
        if not binding.any():
            break
        sub = shares[:, binding]
        spend = shares @ prices
        residual = sub.T @ (budget / spend) - 1.0
        jacobian = -(sub.T * (budget / spend**2)) @ sub
        step = np.linalg.lstsq(jacobian, -residual, rcond=None)[0]
        trial = prices.copy()
        trial[binding] = np.maximum(prices[binding] + step, 0.0)
        candidate = _certify(shares, budget, trial)
        if candidate[2] >= best[2]:
            break
        prices, best = trial, candidate
    return best


def _prices(shares: np.ndarray, budget: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Prices p >= 0 with sum_r p_r a_ir as close to b_i / x_i as can be, on binding resources."""
    used = shares.T @ x
    binding = used >= used.max() * (1 - 1e-6)
    prices = np.zeros(shares.shape[1])
    prices[binding] = nnls(shares[:, binding], budget / x)[0]
    return prices


def _certify(
    shares: np.ndarray, budget: np.ndarray, prices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """(x, prices, gap): each user's best bundle at `prices`, scaled to fit, and the gap.

    At prices p each user buys x_i = b_i / (a_i . p); scaled by the largest
    usage s so that it fits exactly, f(x / s) = g(p) - (sum p - 1) - log s,
    so the gap g(p) - f(x / s) is (sum p - 1) + log s (without the rounding margin).
    """
    spend = shares @ prices
    if not np.all(spend > 0):
        return np.zeros(len(budget)), prices, math.inf
    x = budget / spend
    peak = float(np.max(shares.T @ x))
    gap = math.fsum([*prices.tolist(), -1.0]) + math.log(peak)
    return x / peak, prices, max(gap, 0.0)
