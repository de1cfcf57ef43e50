"""The allocator: decides which framework is offered which agent's free resources.

Pure: plain data in, decisions out. No I/O, no asyncio, no wall clock (time
comes from an injected `clock`), so it can be unit-tested, benchmarked and
simulated without a network. The master tells it what happened (agents and
frameworks coming and going, resources recovered from declined offers and
finished tasks, the roles configuration) and asks it for a round of allocations.

One allocation cycle, as in Mesos' hierarchical allocator:

    for each active agent with allocatable free resources (shuffled, seeded):
        walk the role tree in order (roles below their guarantee first, then
        lowest weighted share; see `role_tree`) down to the frameworks, and
        give the agent's free resources, cut to what the framework's roles'
        limits still allow, to the first framework that wants offers, has
        not filtered them and, if it declared a demand, has a task shape
        that fits them (MESOS-6111: no offers made only to be declined).

Offered resources count as allocated, so a framework's share rises as soon as
it is offered something and the next agent goes to whoever is now lowest.

Cost per cycle: O(A) to visit the agents; per grant, O(depth x log(siblings))
to re-sort the framework and its roles; plus one step per framework skipped
because it filtered the agent. An agent whose current free resources every
framework wanting offers has filtered is skipped in O(1) (see `_Agent.blocked_by`),
so a cluster where everything was declined costs no more than one where
everything is offered.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mesolite.master.policies import DRFPolicy, SharePolicy
from mesolite.master.role_tree import RoleTree, clip
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
class _Filter:
    """Keeps `resources` (or any subset of them) on one agent from one framework."""

    resources: Resources
    expires_at: float
    block_gen: int = -1  # the agent's block generation this filter counts in, if any


@dataclass(frozen=True, slots=True)
class RoleSettings:
    """A role's weight, guarantee and limit in absolute amounts.

    The limit maps resource names to the most the role may hold (0 allows
    none); names it leaves out, or a limit of None, are unlimited.
    `resource_weights` gives the resources it names a weight of their own (the
    DRF paper's weight vector); the others weigh `weight`.
    """

    weight: float = 1.0
    guarantee: Resources = EMPTY
    limit: Mapping[str, float] | None = None
    resource_weights: Mapping[str, float] | None = None


@dataclass(slots=True)
class _Agent:
    agent_id: str
    total: Resources
    allocated: Resources = EMPTY
    by_framework: dict[str, Resources] = field(default_factory=dict)
    filters: dict[str, _Filter] = field(default_factory=dict)  # by framework id
    active: bool = True
    # How many frameworks wanting offers have filtered exactly `blocked_free`
    # (their filters carry `block_gen`); when that is all of them the agent is
    # skipped without a walk. `blocked_until` may be early, never late.
    blocked_free: Resources | None = None
    block_gen: int = 0
    blocked_by: int = 0
    blocked_until: float = float("inf")

    @property
    def free(self) -> Resources:
        return self.total - self.allocated

    def is_blocked(self, free: Resources, wanting: int, now: float) -> bool:
        return self.blocked_by >= wanting and now < self.blocked_until and free == self.blocked_free


@dataclass(slots=True)
class _Framework:
    framework_id: str
    agents: set[str] = field(default_factory=set)
    filtered_agents: set[str] = field(default_factory=set)
    connected: bool = True
    suppressed: bool = False
    # The task shapes it declared it waits for (None: it declared nothing, and is
    # offered anything); an offer must fit one of them. An empty tuple wants nothing.
    demand: tuple[Resources, ...] | None = None

    @property
    def wants_offers(self) -> bool:
        return self.connected and not self.suppressed and self.demand != ()


def is_allocatable(free: Resources) -> bool:
    return (
        free.get_amount("cpus") >= MIN_ALLOCATABLE_CPUS
        or free.get_amount("mem") >= MIN_ALLOCATABLE_MEM
    )


class Allocator:
    def __init__(
        self, clock: Callable[[], float], seed: int = 0, policy: SharePolicy | None = None
    ) -> None:
        self._clock = clock
        self._rng = random.Random(seed)
        self._agents: dict[str, _Agent] = {}
        self._frameworks: dict[str, _Framework] = {}
        self._tree = RoleTree(policy or DRFPolicy())
        self._total = EMPTY

    @property
    def policy(self) -> SharePolicy:
        return self._tree.policy

    # Roles -----------------------------------------------------------------

    def configure_roles(self, roles: Mapping[str, RoleSettings]) -> None:
        """Apply a roles configuration; roles it no longer names go back to the defaults."""
        for path in self._tree.role_paths():
            if self._tree.role_configured(path) and path not in roles:
                self._tree.unconfigure_role(path)
        for path, settings in roles.items():
            self._tree.configure_role(
                path, settings.weight, settings.guarantee, settings.limit, settings.resource_weights
            )
        self._tree.prune()
        self._forget_blocked()

    def set_role_weight(self, role: str, weight: float) -> None:
        """One weight for every resource (a weight vector the role had is dropped)."""
        if not weight > 0:
            raise ValueError(f"weight of role {role!r} must be positive, got {weight}")
        self._tree.ensure_role(role)
        self._tree.configure_role(
            role, weight, self._tree.role_guarantee(role), self._tree.role_limit(role)
        )

    @property
    def roles(self) -> RoleTree:
        """The role tree, for reading shares, allocations and activity."""
        return self._tree

    # Agents ----------------------------------------------------------------

    def add_agent(self, agent_id: str, total: Resources) -> None:
        if agent_id in self._agents:
            raise KeyError(f"agent {agent_id} is already known to the allocator")
        self._agents[agent_id] = _Agent(agent_id, total)
        self._set_total(self._total + total)

    def remove_agent(self, agent_id: str) -> None:
        agent = self._agents.pop(agent_id)
        for framework_id, resources in agent.by_framework.items():
            self._tree.unallocated(framework_id, resources)
            self._frameworks[framework_id].agents.discard(agent_id)
        for framework_id in agent.filters:
            self._frameworks[framework_id].filtered_agents.discard(agent_id)
        self._set_total(self._total - agent.total)

    def activate_agent(self, agent_id: str) -> None:
        self._agents[agent_id].active = True

    def deactivate_agent(self, agent_id: str) -> None:
        """Make no offers for this agent (it is disconnected) but keep its allocations."""
        self._agents[agent_id].active = False

    # Frameworks ------------------------------------------------------------

    def add_framework(self, framework_id: str, role: str, connected: bool = True) -> bool:
        """Add a framework; returns True when its role did not exist before."""
        if framework_id in self._frameworks:
            raise KeyError(f"framework {framework_id} is already known to the allocator")
        framework = _Framework(framework_id, connected=connected)
        self._frameworks[framework_id] = framework
        new_role = not self._tree.has_role(role)
        self._tree.add_framework(framework_id, role, framework.wants_offers)
        return new_role

    def remove_framework(self, framework_id: str) -> None:
        """Forget the framework and free everything allocated to it."""
        framework = self._frameworks[framework_id]
        self._clear_filters(framework)
        for agent_id in framework.agents:
            agent = self._agents[agent_id]
            agent.allocated = agent.allocated - agent.by_framework.pop(framework_id)
        self._tree.remove_framework(framework_id)
        del self._frameworks[framework_id]
        self._tree.prune()

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
        framework = self._frameworks[framework_id]
        framework.suppressed = False
        self._clear_filters(framework)
        self._refresh(framework_id)

    def set_demand(self, framework_id: str, shapes: Iterable[Resources] | None) -> None:
        """Offer the framework only agents where one of `shapes` fits (None: anything,
        as before it declared; no shapes: nothing, like `suppress`)."""
        framework = self._frameworks[framework_id]
        framework.demand = None if shapes is None else tuple(shapes)
        self._refresh(framework_id)

    # Resources -------------------------------------------------------------

    def grant(self, framework_id: str, agent_id: str, resources: Resources) -> None:
        """Record resources already in use by a framework (tasks an agent reports)."""
        agent = self._agents[agent_id]
        if not agent.free.contains(resources):
            raise ValueError(f"agent {agent_id} has only {agent.free} free, not {resources}")
        self._grant(framework_id, agent, resources)

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
        self._tree.unallocated(framework_id, resources)
        if refuse_seconds > 0:
            self._add_filter(framework_id, agent, resources, refuse_seconds)

    def hold(self, framework_id: str, agent_id: str, seconds: float) -> None:
        """Offer the framework nothing on the agent for `seconds` (preemption took
        resources from it there, for another role): a filter over the agent's total, so
        no offer passes it, whatever else is free there or becomes free (a filter over
        only what it gave back is passed by any larger offer: the agent's other free
        resources, an earlier victim's, an offer declined by the starved role)."""
        if seconds > 0:
            agent = self._agents[agent_id]
            self._add_filter(framework_id, agent, agent.total, seconds)

    def allocate(self) -> list[Allocation]:
        """Run one allocation cycle and return the offers to make."""
        now = self._clock()
        decisions: list[Allocation] = []
        wanting = self._tree.wanting_count()
        if wanting == 0:
            return decisions
        agents = [a for a in self._agents.values() if a.active]
        self._rng.shuffle(agents)
        for agent in agents:
            free = agent.free
            if not is_allocatable(free):
                continue
            if agent.is_blocked(free, wanting, now):
                continue
            choice = self._choose(agent, free, now)
            if choice is not None:
                framework_id, offered = choice
                self._grant(framework_id, agent, offered)
                decisions.append(Allocation(framework_id, agent.agent_id, offered))
            elif agent.blocked_by:
                # A full walk found everyone filtered: refresh the (possibly early) expiry.
                agent.blocked_until = min(
                    (
                        f.expires_at
                        for f in agent.filters.values()
                        if f.block_gen == agent.block_gen
                    ),
                    default=float("inf"),
                )
        return decisions

    # Reading ---------------------------------------------------------------

    @property
    def total(self) -> Resources:
        return self._total

    def framework_allocation(self, framework_id: str) -> Resources:
        return self._tree.framework_allocation(framework_id)

    def framework_share(self, framework_id: str) -> float:
        """The framework's share under the policy, divided by its role's weight."""
        return self._tree.framework_share(framework_id)

    def agent_allocated(self, agent_id: str) -> Resources:
        return self._agents[agent_id].allocated

    def role_weight(self, role: str) -> float:
        return self._tree.role_weight(role) if self._tree.has_role(role) else 1.0

    def role_resource_weights(self, role: str) -> dict[str, float] | None:
        """The role's weight per resource it names (None: `role_weight` for all)."""
        return self._tree.role_resource_weights(role) if self._tree.has_role(role) else None

    def framework_ids(self) -> Iterable[str]:
        return self._frameworks.keys()

    # Internals -------------------------------------------------------------

    def _choose(self, agent: _Agent, free: Resources, now: float) -> tuple[str, Resources] | None:
        filters = agent.filters
        for framework_id, headroom in self._tree.candidates():
            refused = filters.get(framework_id)
            if refused is not None:
                if refused.expires_at <= now:
                    self._drop_filter(framework_id, agent)
                elif refused.resources.contains(free):
                    continue
            offered = clip(free, headroom)
            if is_allocatable(offered) and self._fits_demand(framework_id, offered):
                return framework_id, offered
        return None

    def _fits_demand(self, framework_id: str, offered: Resources) -> bool:
        demand = self._frameworks[framework_id].demand
        return demand is None or any(offered.contains(shape) for shape in demand)

    def _grant(self, framework_id: str, agent: _Agent, resources: Resources) -> None:
        agent.allocated = agent.allocated + resources
        held = agent.by_framework.get(framework_id, EMPTY)
        agent.by_framework[framework_id] = held + resources
        self._frameworks[framework_id].agents.add(agent.agent_id)
        self._tree.allocated(framework_id, resources)

    def _add_filter(
        self, framework_id: str, agent: _Agent, resources: Resources, refuse_seconds: float
    ) -> None:
        expires_at = self._clock() + min(refuse_seconds, MAX_REFUSE_SECONDS)
        previous = agent.filters.get(framework_id)
        if previous is not None:
            self._drop_filter(framework_id, agent)
        refused = _Filter(resources, expires_at)
        agent.filters[framework_id] = refused
        framework = self._frameworks[framework_id]
        framework.filtered_agents.add(agent.agent_id)
        free = agent.free
        if framework.wants_offers and resources.contains(free):
            if agent.blocked_free != free:
                agent.blocked_free = free
                agent.block_gen += 1
                agent.blocked_by = 0
                agent.blocked_until = float("inf")
            refused.block_gen = agent.block_gen
            agent.blocked_by += 1
            agent.blocked_until = min(agent.blocked_until, expires_at)

    def _drop_filter(self, framework_id: str, agent: _Agent) -> None:
        refused = agent.filters.pop(framework_id)
        self._frameworks[framework_id].filtered_agents.discard(agent.agent_id)
        self._unblock(agent, refused)

    @staticmethod
    def _unblock(agent: _Agent, refused: _Filter) -> None:
        if refused.block_gen == agent.block_gen:
            agent.blocked_by -= 1
        refused.block_gen = -1

    def _clear_filters(self, framework: _Framework) -> None:
        for agent_id in list(framework.filtered_agents):
            self._drop_filter(framework.framework_id, self._agents[agent_id])

    def _forget_blocked(self) -> None:
        for agent in self._agents.values():
            agent.blocked_free = None
            agent.block_gen += 1
            agent.blocked_by = 0

    def _refresh(self, framework_id: str) -> None:
        framework = self._frameworks[framework_id]
        if not framework.wants_offers:
            # It no longer counts toward blocking any agent.
            for agent_id in framework.filtered_agents:
                agent = self._agents[agent_id]
                self._unblock(agent, agent.filters[framework_id])
        self._tree.set_wants(framework_id, framework.wants_offers)

    def _set_total(self, total: Resources) -> None:
        self._total = total
        self._tree.set_total(total)
