"""Reservations (issue 18): an agent held for a task shape too large for what is free.

With packing (`Allocator(packing=True)`, the master's `--packing`), a framework that
declared a demand is offered one task where its shape fits. A large shape behind a
stream of small ones then starves: its tasks need, say, 2 CPUs on one agent, CPUs free
one at a time, and each freed CPU goes to the small shape. As YARN's Fair and Capacity
schedulers reserve a node for a container that does not fit yet, the allocator may
reserve an agent for such a framework. The rules (the allocator applies them; this
module holds the pieces, pure):

* Made only for the framework first in order (the lowest share, under DRF) when no
  shape of its demand fits any agent's free resources in the cycle, on the agent
  closest to fitting one (`shortfall`: the least missing, counted as fractions of the
  cluster) among those where the shape would fit once other frameworks' tasks there
  end (waiting for its own to end gains it nothing: it would only idle what frees
  meanwhile), that it has not filtered, and that did not time out on it within the
  last `RESERVATION_TIMEOUT`.
* At most `MAX_PER_FRAMEWORK` per framework, `cluster_bound(agents)` in all, one per
  agent.
* While it lasts, frameworks behind the reserver in order are offered only the agent's
  `surplus`: what is free beyond what the shape still lacks, so what frees there
  accumulates for the reserver and is never handed on. Frameworks ahead of it (a lower
  share) see everything free there, as without a reservation: a reservation never
  takes anything from a framework DRF would serve first. An agent's reservation does
  not move its resources anywhere; nothing is allocated while it waits.
* It ends (`Outcome`): `fitted` when the walk reaches the reserver with the shape
  fitting, and the agent is offered to it; `demand_changed` when its demand no longer
  names the shape; `timeout` after `RESERVATION_TIMEOUT`; `filtered` when the reserver
  declined the agent; `agent_removed`, `agent_inactive`; `framework_removed`,
  `not_wanting` (suppressed, disconnected, an empty demand).

The allocator reports each start and end as a `ReservationEvent`; the master logs them
and counts them in /metrics (the allocator does no I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from mesolite.resources import Resources

# Per framework: enough that a large shape gains tasks while agents drain, few enough
# that what waits idle on reserved agents stays small (README, issue 18: 1 to 48 tried
# on the simulator's phase 2 and 3).
MAX_PER_FRAMEWORK = 8
# A reservation that has not fitted by then ends: tasks that never end (services)
# must not hold an agent forever. The framework may not reserve that agent again for as
# long. The dynamic-sharing experiment's tasks run 4-8 s.
RESERVATION_TIMEOUT = 30.0

Outcome = Literal[
    "fitted",
    "demand_changed",
    "timeout",
    "filtered",
    "agent_removed",
    "agent_inactive",
    "framework_removed",
    "not_wanting",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


@dataclass(frozen=True, slots=True)
class Reservation:
    """`agent_id` is held for one task of `shape` of `framework_id`, since `since` (the
    allocator's clock)."""

    framework_id: str
    agent_id: str
    shape: Resources
    since: float


@dataclass(frozen=True, slots=True)
class ReservationEvent:
    """A reservation made (`outcome` None) or ended, `held` seconds after it was made."""

    reservation: Reservation
    outcome: Outcome | None = None
    held: float = 0.0


def cluster_bound(agents: int) -> int:
    """How many agents may be reserved at once: an eighth of them, at least one."""
    return max(1, agents // 8)


def surplus(free: Resources, shape: Resources) -> Resources:
    """What a reserved agent with `free` still offers those behind its reserver: each
    resource beyond what `shape` needs of it. Giving it away never delays the fit."""
    claimed = Resources({n: min(free.get_amount(n), shape.get_amount(n)) for n in shape})
    return free - claimed


def shortfall(free: Resources, shape: Resources, total: Resources) -> float:
    """How far `shape` is from fitting in `free`: what it lacks of each resource, as a
    fraction of the cluster's `total`, summed (0: it fits)."""
    missing = 0.0
    for name in shape:
        whole = total.get_amount(name)
        lack = shape.get_amount(name) - free.get_amount(name)
        if lack > 0:
            missing += lack / whole if whole > 0 else float("inf")
    return missing
