"""Drive the pure allocator with simple simulated frameworks, no network.

The frameworks launch ONE task per offer and hand the rest of the offer back
unfiltered; an offer that fits no task is declined with a long filter. With
whole-agent offers this turns the allocator into task-by-task progressive
filling: after each launch the agent's remainder goes back to whoever now has
the lowest share. A framework that reaches its task limit suppresses offers.
Tasks never finish, so what is free on an agent only shrinks: a declined
agent is declined for good.

`simulate` returns every offer in order, so tests can replay the run and check
each decision, not just the end state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mesolite.master.allocator import Allocator, RoleSettings
from mesolite.master.policies import SharePolicy
from mesolite.resources import Resources

# Longer than any simulated run: a decline holds until the end.
LONG_FILTER_SECONDS = 1e6


class FakeClock:
    """Time stands still unless a test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class Offer:
    """One offer of an allocation cycle and what the framework did with it."""

    cycle: int
    framework_id: str
    agent_id: str
    resources: Resources
    launched: bool  # one task launched, the rest returned unfiltered
    declined: bool  # no task fitted: all returned with a long filter
    # Neither: the framework had reached its task limit earlier in the same
    # cycle (one cycle can offer it several agents) and returned it unfiltered.


@dataclass(frozen=True, slots=True)
class Run:
    tasks: dict[str, int]  # tasks per framework when the allocator had nothing more to offer
    offers: list[Offer]  # in the order the allocator made them
    cycles: int  # allocation cycles, counting the last, empty one


def role_of(framework_id: str) -> str:
    """Each simulated framework has a role of its own.

    Role and framework shares are then the same, so a flat DRF allocator and a
    hierarchical one (roles first, then frameworks within a role) must decide
    alike, and weights are plain role weights.
    """
    return f"role-{framework_id}"


def build_allocator(
    agents: Mapping[str, Resources],
    weights: Mapping[str, float | Mapping[str, float]],
    seed: int = 0,
    policy: SharePolicy | None = None,
) -> Allocator:
    """An allocator with these agents and frameworks (subscribed in `weights` order).

    A weight is a number or a weight vector (resource -> weight, others 1).
    Each role is created just before its framework subscribes, so role order
    (the tie-break) is subscription order.
    """
    allocator = Allocator(FakeClock(), seed=seed, policy=policy)
    for agent_id, total in agents.items():
        allocator.add_agent(agent_id, total)
    vectors = any(isinstance(w, Mapping) for w in weights.values())
    settings: dict[str, RoleSettings] = {}  # with vectors: every role so far, configured
    for framework_id, weight in weights.items():
        role = role_of(framework_id)
        if isinstance(weight, Mapping):
            settings[role] = RoleSettings(resource_weights=weight)
        elif vectors:
            settings[role] = RoleSettings(weight=weight)
        elif weight != 1:
            allocator.set_role_weight(role, weight)
        if vectors:
            allocator.configure_roles(settings)
        allocator.add_framework(framework_id, role)
    return allocator


def simulate(
    allocator: Allocator,
    demands: Mapping[str, Resources],
    max_tasks: Mapping[str, int] | None = None,
    max_cycles: int = 10_000,
) -> Run:
    """Run allocation cycles until the allocator offers nothing; see the module docstring."""
    limits = dict(max_tasks or {})
    tasks = dict.fromkeys(demands, 0)
    offers: list[Offer] = []
    for framework_id, limit in limits.items():
        if limit == 0:
            allocator.suppress(framework_id)
    for cycle in range(max_cycles):
        decisions = allocator.allocate()
        if not decisions:
            return Run(tasks, offers, cycle + 1)
        for d in decisions:
            need = demands[d.framework_id]
            finished = tasks[d.framework_id] == limits.get(d.framework_id)
            launched = not finished and d.resources.contains(need)
            declined = not finished and not launched
            offers.append(Offer(cycle, d.framework_id, d.agent_id, d.resources, launched, declined))
            if launched:
                tasks[d.framework_id] += 1
                allocator.recover(d.framework_id, d.agent_id, d.resources - need)
                if tasks[d.framework_id] == limits.get(d.framework_id):
                    allocator.suppress(d.framework_id)
            else:
                refuse = LONG_FILTER_SECONDS if declined else 0.0
                allocator.recover(d.framework_id, d.agent_id, d.resources, refuse_seconds=refuse)
    raise AssertionError(f"allocation did not settle in {max_cycles} cycles")


def run_one_task_per_offer(
    allocator: Allocator, demands: dict[str, Resources], max_cycles: int = 1000
) -> dict[str, int]:
    """Tasks per framework once the allocator has nothing more to offer.

    The same loop as `simulate` without task limits or the offer log (the
    signature `tests/test_allocator.py` uses).
    """
    return simulate(allocator, demands, max_cycles=max_cycles).tasks
