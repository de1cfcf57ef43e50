"""The preemption planner: which tasks to take back, for whom. Pure: data in, victims out.

A role is **starved** in one of two ways (the Fair Scheduler's two kinds of
preemption):

- *below its guarantee*: it wants offers and holds less than its guarantee of
  some resource (min-share starvation), for longer than its `min_share_timeout`;
- *below a fraction of its fair share*: it wants offers and its share of what it
  holds is below `threshold` x the share of its instantaneous fair share
  (`master/fair_levels.py`), for longer than its `fair_share_timeout`.

For each starved role, the one below its guarantee first and then the most
starved, the planner takes running tasks back from roles above it until the
starved role, credited with what it is given, reaches its guarantee (min-share)
or its fair share (fair-share). A victim task is allowed only if

1. its role is **above** the starved one in the allocator's order, so the freed
   resources are offered to the starved role before they could go back: a role
   below its guarantee comes before every role at or above theirs (the role
   tree's order), so for min-share preemption rule 2 implies it; for fair-share
   preemption the victim's weighted share must be higher (rule 2 keeps it so);
2. taking it **creates no new deficit**: after this and every victim chosen
   before it, its role still holds all of its guarantee and is not below its own
   threshold of its fair share (so it is not starved itself, and can never take
   the task back), and under fair-share preemption its weighted share is still
   at least the starved role's (credited with the task);
3. it is **useful**: it holds some resource the starved role is short of.

Among allowed victims the most recently launched go first (the least work lost),
then the smallest (the least taken). The starved role is credited with each
victim's resources in full, which overstates what it gains when it needs less
of some resource: the planner errs toward taking too little, never too much,
and the next check takes more if the role is still starved.

Free resources count as already given to the starved role: nothing is
preempted for what the cluster holds unallocated.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mesolite.master.policies import SharePolicy
from mesolite.master.policies.base import weighted_share
from mesolite.resources import EMPTY, Resources


class Kind(enum.Enum):
    MIN_SHARE = "min_share"  # below its guarantee
    FAIR_SHARE = "fair_share"  # below a fraction of its fair share


@dataclass(frozen=True, slots=True)
class RoleState:
    """One role as the planner sees it."""

    allocation: Resources  # what its frameworks' tasks hold (outstanding offers aside)
    fair_share: Resources  # instantaneous, demand-capped
    guarantee: Resources = EMPTY
    weight: float = 1.0
    resource_weights: Mapping[str, float] | None = None
    wants: bool = True  # a framework of the role wants offers
    # How long it has been starved of each kind (None: it is not), and how long it may be.
    below_guarantee_for: float | None = None
    below_fair_share_for: float | None = None
    min_share_timeout: float | None = None  # None: never preempt for its guarantee
    fair_share_timeout: float | None = None  # None: never preempt for its fair share
    threshold: float = 0.5


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running task that could be taken back."""

    framework_id: str
    task_id: str
    role: str
    agent_id: str
    resources: Resources
    launched_at: float


@dataclass(frozen=True, slots=True)
class Victim:
    task: Candidate
    for_role: str
    kind: Kind


def below_guarantee(allocation: Resources, guarantee: Resources) -> bool:
    return any(allocation.get_amount(n) < guarantee.get_amount(n) for n in guarantee)


def below_fair_share(
    state: RoleState, total: Resources, policy: SharePolicy, threshold: float | None = None
) -> bool:
    """Its share of what it holds is below `threshold` (default: its own) x its fair
    share's (both as the policy measures them, unweighted)."""
    limit = state.threshold if threshold is None else threshold
    fair = policy.share(state.fair_share, total)
    return fair > 0 and policy.share(state.allocation, total) < limit * fair


def starvation(state: RoleState, total: Resources, policy: SharePolicy) -> tuple[bool, bool]:
    """(below its guarantee, below its threshold of its fair share), for a role that
    wants offers (one that does not is never starved)."""
    if not state.wants:
        return False, False
    return (
        below_guarantee(state.allocation, state.guarantee),
        below_fair_share(state, total, policy),
    )


def plan(
    roles: Mapping[str, RoleState],
    tasks: Sequence[Candidate],
    free: Resources,
    total: Resources,
    policy: SharePolicy,
) -> list[Victim]:
    """The tasks to preempt now, and for whom (see the module docstring)."""
    held = {path: s.allocation for path, s in roles.items()}

    def share(path: str, allocation: Resources) -> float:
        s = roles[path]
        return weighted_share(policy, allocation, total, s.weight, s.resource_weights)

    due: list[tuple[int, float, str, Kind]] = []
    for path, s in roles.items():
        if not s.wants:
            continue
        if (
            s.min_share_timeout is not None
            and s.below_guarantee_for is not None
            and s.below_guarantee_for >= s.min_share_timeout
            and below_guarantee(s.allocation, s.guarantee)
        ):
            due.append((0, share(path, s.allocation), path, Kind.MIN_SHARE))
        elif (
            s.fair_share_timeout is not None
            and s.below_fair_share_for is not None
            and s.below_fair_share_for >= s.fair_share_timeout
            and below_fair_share(s, total, policy)
        ):
            fair = policy.share(s.fair_share, total)
            due.append((1, policy.share(s.allocation, total) / fair, path, Kind.FAIR_SHARE))
    due.sort()
    # Newest first (ties: the later in `tasks`, which lists them in launch order), then
    # the smallest.
    order = sorted(
        reversed(tasks), key=lambda t: (-t.launched_at, policy.share(t.resources, total))
    )
    taken: set[tuple[str, str]] = set()
    victims: list[Victim] = []
    unallocated = free
    for _, _, starved, kind in due:
        s = roles[starved]
        target = s.guarantee if kind is Kind.MIN_SHARE else s.fair_share
        # What the cluster holds unallocated goes to the starved role first.
        credit = _clip(unallocated, _short(held[starved], target))
        held[starved] = held[starved] + credit
        unallocated = unallocated - credit
        for task in order:
            if not _still_short(kind, held[starved], s, total, policy):
                break
            key = (task.framework_id, task.task_id)
            victim = task.role
            if key in taken or victim == starved or victim not in roles:
                continue
            if not _overlaps(_short(held[starved], target), task.resources):
                continue  # holds nothing the starved role lacks
            after = held[victim] - task.resources
            v = roles[victim]
            if kind is Kind.FAIR_SHARE and share(victim, after) < share(
                starved, held[starved] + task.resources
            ):
                continue  # it would end below the starved role: not above it
            if below_guarantee(after, v.guarantee) or below_fair_share(
                _with(v, after), total, policy
            ):
                continue  # it would be starved itself
            taken.add(key)
            held[victim] = after
            held[starved] = held[starved] + task.resources
            victims.append(Victim(task, starved, kind))
    return victims


def _still_short(
    kind: Kind, held: Resources, state: RoleState, total: Resources, policy: SharePolicy
) -> bool:
    if kind is Kind.MIN_SHARE:
        return below_guarantee(held, state.guarantee)
    return policy.share(held, total) < policy.share(state.fair_share, total)


def _short(held: Resources, target: Resources) -> Resources:
    """What `held` lacks of `target`, per resource (0 where it has enough)."""
    return Resources(
        {
            n: target.get_amount(n) - held.get_amount(n)
            for n in target
            if target.get_amount(n) > held.get_amount(n)
        }
    )


def _with(state: RoleState, allocation: Resources) -> RoleState:
    return dataclasses.replace(state, allocation=allocation)


def _overlaps(a: Resources, b: Resources) -> bool:
    return any(b.get_amount(n) > 0 for n in a)


def _clip(amounts: Resources, cap: Resources) -> Resources:
    return Resources(
        {n: min(amounts.get_amount(n), cap.get_amount(n)) for n in cap if n in amounts}
    )
