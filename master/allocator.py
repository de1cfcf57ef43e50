"""The allocator: decides which framework is offered which agent's free resources.

Pure: plain data in, decisions out. No I/O, no asyncio, no wall clock (time
comes from an injected `clock`), so it can be unit-tested, benchmarked and
simulated without a network. The master tells it what happened (agents and
frameworks coming and going, resources recovered from declined offers and
finished tasks) and asks it for a round of allocations.

One allocation cycle, as in Mesos' hierarchical allocator:

    for each active agent with allocatable free resources (shuffled, seeded):
        walk frameworks in ascending weighted dominant share (the DRF sorter)
        and give the agent's whole free resources to the first one that
        neither has suppressed offers nor filters these resources.

Offered resources count as allocated, so a framework's share rises as soon as
it is offered something and the next agent goes to whoever is now lowest.

Cost per cycle: O(A) to visit the agents, plus O(log F) per grant to re-sort
the framework that received it, plus one step for each framework skipped
because it filtered that agent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from master.sorter import DRFSorter
from mesolite.model import DEFAULT_ROLE
from mesolite.resources import EMPTY, Resources

# Mesos offers nothing smaller than this: an offer of a few bytes is useless
# and would only be declined.
MIN_ALLOCATABLE_CPUS = 0.01
MIN_ALLOCATABLE_MEM = 32.0

MAX_REFUSE_SECONDS = 365 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Allocation:
    """A decision: offer `resources` on `agent_id` to `framework_id`."""

    framework_id: str
    agent_id: str
    resources: Resources


@dataclass(slots=True)
class _Agent:
    agent_id: str
    total: Resources
    allocated: Resources = EMPTY
    by_framework: dict[str, Resources] = field(default_factory=dict)
    active: bool = True

    @property
    def free(self) -> Resources:
        return self.total - self.allocated


@dataclass(slots=True)
class _Framework:
    framework_id: str
    role: str
    agents: set[str] = field(default_factory=set)
    connected: bool = True
    suppressed: bool = False

    @property
    def wants_offers(self) -> bool:
        return self.connected and not self.suppressed


@dataclass(frozen=True, slots=True)
class _Filter:
    """Keeps `resources` (or any subset of them) on one agent from one framework."""

    resources: Resources
    expires_at: float


def is_allocatable(free: Resources) -> bool:
    return (
        free.get_amount("cpus") >= MIN_ALLOCATABLE_CPUS
        or free.get_amount("mem") >= MIN_ALLOCATABLE_MEM
    )


class Allocator:
    def __init__(self, clock: Callable[[], float], seed: int = 0) -> None:
        self._clock = clock
        self._rng = random.Random(seed)
        self._agents: dict[str, _Agent] = {}
        self._frameworks: dict[str, _Framework] = {}
        self._weights: dict[str, float] = {DEFAULT_ROLE: 1.0}
        self._filters: dict[tuple[str, str], _Filter] = {}
        self._sorter = DRFSorter()
        self._total = EMPTY

    # Agents ----------------------------------------------------------------

    def add_agent(self, agent_id: str, total: Resources) -> None:
        if agent_id in self._agents:
            raise KeyError(f"agent {agent_id} is already known to the allocator")
        self._agents[agent_id] = _Agent(agent_id, total)
        self._set_total(self._total + total)

    def remove_agent(self, agent_id: str) -> None:
        agent = self._agents.pop(agent_id)
        for framework_id, resources in agent.by_framework.items():
            self._sorter.unallocated(framework_id, resources)
            self._frameworks[framework_id].agents.discard(agent_id)
        for framework_id in self._frameworks:
            self._filters.pop((framework_id, agent_id), None)
        self._set_total(self._total - agent.total)

    def activate_agent(self, agent_id: str) -> None:
        self._agents[agent_id].active = True

    def deactivate_agent(self, agent_id: str) -> None:
        """Make no offers for this agent (it is disconnected) but keep its allocations."""
        self._agents[agent_id].active = False

    # Frameworks ------------------------------------------------------------

    def add_framework(self, framework_id: str, role: str, connected: bool = True) -> None:
        if framework_id in self._frameworks:
            raise KeyError(f"framework {framework_id} is already known to the allocator")
        framework = _Framework(framework_id, role, connected=connected)
        self._frameworks[framework_id] = framework
        self._sorter.add(framework_id, self._weights.get(role, 1.0))
        if not framework.wants_offers:
            self._sorter.deactivate(framework_id)

    def remove_framework(self, framework_id: str) -> None:
        """Forget the framework and free everything allocated to it."""
        framework = self._frameworks.pop(framework_id)
        for agent_id in framework.agents:
            agent = self._agents[agent_id]
            agent.allocated = agent.allocated - agent.by_framework.pop(framework_id)
        for agent_id in self._agents:
            self._filters.pop((framework_id, agent_id), None)
        self._sorter.remove(framework_id)

    def connect_framework(self, framework_id: str) -> None:
        self._frameworks[framework_id].connected = True
        self._refresh(framework_id)

    def disconnect_framework(self, framework_id: str) -> None:
        self._frameworks[framework_id].connected = False
        self._refresh(framework_id)

    def suppress(self, framework_id: str) -> None:
        self._frameworks[framework_id].suppressed = True
        self._refresh(framework_id)

    def revive(self, framework_id: str) -> None:
        """Resume offers and drop the framework's filters, as Mesos' REVIVE does."""
        self._frameworks[framework_id].suppressed = False
        for agent_id in self._agents:
            self._filters.pop((framework_id, agent_id), None)
        self._refresh(framework_id)

    def set_role_weight(self, role: str, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"weight of role {role!r} must be positive, got {weight}")
        self._weights[role] = weight
        for framework in self._frameworks.values():
            if framework.role == role:
                self._sorter.set_weight(framework.framework_id, weight)

    # Resources -------------------------------------------------------------

    def recover(
        self, framework_id: str, agent_id: str, resources: Resources, refuse_seconds: float = 0.0
    ) -> None:
        """Give back resources (a declined offer, a finished task) and maybe filter them.

        With `refuse_seconds` > 0 the framework is not offered these resources,
        or any subset of them, on this agent until the filter expires. A larger
        offer (say, after a task on the agent ended) passes the filter, as in Mesos.
        """
        if resources.is_empty():
            return
        agent = self._agents[agent_id]
        held = agent.by_framework[framework_id]
        remaining = held - resources  # raises if more is recovered than was allocated
        if remaining.is_empty():
            del agent.by_framework[framework_id]
            self._frameworks[framework_id].agents.discard(agent_id)
        else:
            agent.by_framework[framework_id] = remaining
        agent.allocated = agent.allocated - resources
        self._sorter.unallocated(framework_id, resources)
        if refuse_seconds > 0:
            seconds = min(refuse_seconds, MAX_REFUSE_SECONDS)
            self._filters[(framework_id, agent_id)] = _Filter(resources, self._clock() + seconds)

    def grant(self, framework_id: str, agent_id: str, resources: Resources) -> None:
        """Record resources already in use by a framework (tasks an agent reports)."""
        agent = self._agents[agent_id]
        if not agent.free.contains(resources):
            raise ValueError(f"agent {agent_id} has only {agent.free} free, not {resources}")
        self._grant(framework_id, agent, resources)

    def allocate(self) -> list[Allocation]:
        """Run one allocation cycle and return the offers to make."""
        now = self._clock()
        decisions: list[Allocation] = []
        agents = [a for a in self._agents.values() if a.active]
        self._rng.shuffle(agents)
        for agent in agents:
            free = agent.free
            if not is_allocatable(free):
                continue
            framework_id = self._first_unfiltered(agent.agent_id, free, now)
            if framework_id is None:
                continue
            self._grant(framework_id, agent, free)
            decisions.append(Allocation(framework_id, agent.agent_id, free))
        return decisions

    # Reading ---------------------------------------------------------------

    @property
    def total(self) -> Resources:
        return self._total

    def framework_allocation(self, framework_id: str) -> Resources:
        return self._sorter.allocation(framework_id)

    def framework_share(self, framework_id: str) -> float:
        """Weighted dominant share."""
        return self._sorter.share(framework_id)

    def agent_allocated(self, agent_id: str) -> Resources:
        return self._agents[agent_id].allocated

    def role_weight(self, role: str) -> float:
        return self._weights.get(role, 1.0)

    def framework_ids(self) -> Iterable[str]:
        return self._frameworks.keys()

    # Internals -------------------------------------------------------------

    def _first_unfiltered(self, agent_id: str, free: Resources, now: float) -> str | None:
        for framework_id in self._sorter.sorted():
            key = (framework_id, agent_id)
            refused = self._filters.get(key)
            if refused is not None:
                if refused.expires_at <= now:
                    del self._filters[key]
                elif refused.resources.contains(free):
                    continue
            return framework_id
        return None

    def _grant(self, framework_id: str, agent: _Agent, resources: Resources) -> None:
        agent.allocated = agent.allocated + resources
        held = agent.by_framework.get(framework_id, EMPTY)
        agent.by_framework[framework_id] = held + resources
        self._frameworks[framework_id].agents.add(agent.agent_id)
        self._sorter.allocated(framework_id, resources)

    def _refresh(self, framework_id: str) -> None:
        if self._frameworks[framework_id].wants_offers:
            self._sorter.activate(framework_id)
        else:
            self._sorter.deactivate(framework_id)

    def _set_total(self, total: Resources) -> None:
        self._total = total
        self._sorter.set_total(total)
