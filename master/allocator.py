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

Packing (`packing=True`, the master's `--packing`; off by default). Fairness
still decides *who* is offered next, as above; packing decides *where*, for a
framework that declared a demand. When the walk at an agent picks such a
framework, it is offered one task of its demanded shapes, on the agent of the
cycle where a shape fits best (`fit_score`: the least room stranded were the
agent filled with that shape, then best fit), which may be another agent than
the one walked; then the walk at the agent starts again, so the rest of its
free resources stays for others.
It is offered no more tasks in a cycle than it declared. A framework that
declared nothing is offered a whole agent as without packing, and a cycle in
which no framework wanting offers declared a demand is exactly the cycle
without packing.

Reservations (with packing, unless `reservations=False`; the rules are in
`master/reservations.py`): when no shape of the demand of the framework first
in order fits any agent, it may reserve the agents closest to fitting one; a
reserved agent is kept out of the pool and walked on its own, and frameworks
behind the reserver see only its surplus (`_choose`), so what frees there
accumulates until the walk offers the reserver its task.

Cost per cycle: O(A) to visit the agents; per grant, O(depth x log(siblings))
to re-sort the framework and its roles; plus one step per framework skipped
because it filtered the agent or its demand does not fit it. An agent whose
current free resources every framework wanting offers has filtered, or cannot
use because no shape of its demand fits them, is skipped in O(1) (see
`_Agent.blocked_by`), so a cluster where everything was declined costs no more
than one where everything is offered. With packing, each task offered to a
framework with a demand also costs O(B x S): B distinct free vectors among the
cycle's agents (agents alike share one), S the framework's shapes.
Reservations add O(R) a cycle to end those that timed out (R reserved agents,
at most an eighth of the agents), one walk of every framework at each reserved
agent (no O(1) skip there), and, in a cycle where the first framework may
reserve more, O(B x S log(B x S)) to find that none of its shapes fits and rank
the agents (B over every agent, blocked ones too).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mesolite.master.policies import DRFPolicy, SharePolicy
from mesolite.master.reservations import (
    MAX_PER_FRAMEWORK,
    RESERVATION_TIMEOUT,
    Outcome,
    Reservation,
    ReservationEvent,
    cluster_bound,
    shortfall,
    surplus,
)
from mesolite.master.role_tree import Headroom, RoleTree, clip
from mesolite.resources import EMPTY, Resources

# Mesos offers nothing smaller than this: an offer of a few bytes is useless
# and would only be declined.
MIN_ALLOCATABLE_CPUS = 0.01
MIN_ALLOCATABLE_MEM = 32.0

MAX_REFUSE_SECONDS = 365 * 24 * 3600.0

# With packing, how many frameworks ahead in order (their demand did not fit the
# walked agent) a task placed elsewhere must leave room for: bounds `_place`'s cost.
MAX_PASSED = 8


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
    # Frameworks counted in `blocked_by` because no shape of their demand fits
    # `blocked_free` (cleared with each new block generation).
    unfit: set[str] = field(default_factory=set)

    @property
    def free(self) -> Resources:
        return self.total - self.allocated

    def is_blocked(self, free: Resources, wanting: int, now: float) -> bool:
        return self.blocked_by >= wanting and now < self.blocked_until and free == self.blocked_free


@dataclass(frozen=True, slots=True)
class _Wish:
    """The framework first in order may reserve `room` more agents, for the `wanted`
    shapes of its demand (index, shape), `counts[index]` more of each at most."""

    framework: _Framework
    headroom: Headroom
    wanted: list[tuple[int, Resources]]
    counts: list[int]
    room: int


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
    counts: tuple[int, ...] = ()  # tasks of each shape; packing offers no more a cycle
    unfit_agents: set[str] = field(default_factory=set)  # where it may be in `_Agent.unfit`
    reserved: set[str] = field(default_factory=set)  # agents reserved for it
    barred: dict[str, float] = field(default_factory=dict)  # agent -> no reserving until

    @property
    def wants_offers(self) -> bool:
        return self.connected and not self.suppressed and self.demand != ()


def fit_score(free: Resources, shape: Resources, total: Resources) -> tuple[float, float]:
    """How badly `shape` fits in `free` (lower is better), each resource counted as a
    fraction of the cluster's `total`, summed over the resources `free` holds:

    1. what would be stranded if the agent were filled with tasks of this shape
       alone (its free resources less as many whole tasks as fit): this keeps a
       shape with its own kind, where whole agents of one shape pack best;
    2. then the room left after this one task (best fit: the fullest agent that
       still holds it, so emptier agents stay whole for larger shapes).

    `shape` must fit in `free`."""
    rest, after = free.remainder(shape), free - shape
    stranded = left = 0.0
    for name in free:
        whole = total.get_amount(name)
        if whole > 0:
            stranded += rest.get_amount(name) / whole
            left += after.get_amount(name) / whole
    return stranded, left


def _spoils(
    free: Resources, shape: Resources, ahead: list[_Framework], left: dict[str, list[int]]
) -> bool:
    """Whether taking `shape` out of `free` leaves no room for a task that one of the
    frameworks `ahead` waits for and that fits `free` now."""
    rest = free - shape
    for framework in ahead:
        assert framework.demand is not None
        counts = left[framework.framework_id]
        for index, wanted in enumerate(framework.demand):
            if counts[index] > 0 and free.contains(wanted) and not rest.contains(wanted):
                return True
    return False


def is_allocatable(free: Resources) -> bool:
    return (
        free.get_amount("cpus") >= MIN_ALLOCATABLE_CPUS
        or free.get_amount("mem") >= MIN_ALLOCATABLE_MEM
    )


class Allocator:
    def __init__(
        self,
        clock: Callable[[], float],
        seed: int = 0,
        policy: SharePolicy | None = None,
        packing: bool = False,
        reservations: bool = True,
        max_reservations: int = MAX_PER_FRAMEWORK,
        reservation_timeout: float = RESERVATION_TIMEOUT,
    ) -> None:
        """`reservations` (with `packing` only): agents may be reserved for a large shape
        (master/reservations.py), at most `max_reservations` per framework, each for at
        most `reservation_timeout` seconds."""
        self._clock = clock
        self.packing = packing
        self.reserving = packing and reservations
        self.max_reservations = max_reservations
        self.reservation_timeout = reservation_timeout
        self._reservations: dict[str, Reservation] = {}  # by agent id
        self._reservation_events: list[ReservationEvent] = []
        self._rng = random.Random(seed)
        self._agents: dict[str, _Agent] = {}
        self._frameworks: dict[str, _Framework] = {}
        self._tree = RoleTree(policy or DRFPolicy())
        self._total = EMPTY
        self._declared: set[str] = set()  # frameworks with a demand (not None)

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
        if agent_id in self._reservations:
            self._end_reservation(agent_id, "agent_removed")
        agent = self._agents.pop(agent_id)
        for framework_id, resources in agent.by_framework.items():
            self._tree.unallocated(framework_id, resources)
            self._frameworks[framework_id].agents.discard(agent_id)
        for framework_id in agent.filters:
            self._frameworks[framework_id].filtered_agents.discard(agent_id)
        for framework_id in agent.unfit:
            self._frameworks[framework_id].unfit_agents.discard(agent_id)
        self._set_total(self._total - agent.total)

    def activate_agent(self, agent_id: str) -> None:
        self._agents[agent_id].active = True

    def deactivate_agent(self, agent_id: str) -> None:
        """Make no offers for this agent (it is disconnected) but keep its allocations."""
        self._agents[agent_id].active = False
        if agent_id in self._reservations:
            self._end_reservation(agent_id, "agent_inactive")

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
        for agent_id in list(framework.reserved):
            self._end_reservation(agent_id, "framework_removed")
        self._clear_filters(framework)
        self._clear_unfit(framework)
        self._declared.discard(framework_id)
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

    def set_demand(self, framework_id: str, demand: Iterable[tuple[Resources, int]] | None) -> None:
        """Offer the framework only agents where one of the demand's shapes fits (None:
        anything, as before it declared; no shapes: nothing, like `suppress`). Each
        shape comes with the count of tasks of it the framework waits for."""
        framework = self._frameworks[framework_id]
        self._clear_unfit(framework)
        if demand is None:
            framework.demand, framework.counts = None, ()
            self._declared.discard(framework_id)
        else:
            pairs = tuple(demand)
            framework.demand = tuple(shape for shape, _ in pairs)
            framework.counts = tuple(count for _, count in pairs)
            self._declared.add(framework_id)
        wanted = {s for s, n in zip(framework.demand or (), framework.counts, strict=True) if n > 0}
        for agent_id in list(framework.reserved):
            if self._reservations[agent_id].shape not in wanted:
                self._end_reservation(agent_id, "demand_changed")
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
        if self._reservations:
            self._expire_reservations(now)
        wanting = self._tree.wanting_count()
        if wanting == 0:
            return decisions
        agents = [a for a in self._agents.values() if a.active]
        self._rng.shuffle(agents)
        if self.packing and any(self._frameworks[f].wants_offers for f in self._declared):
            return self._allocate_packed(agents, now, wanting)
        for agent in agents:
            free = agent.free
            if not is_allocatable(free):
                continue
            if agent.is_blocked(free, wanting, now):
                continue
            choice = self._choose(agent, free, now)
            if choice is not None:
                framework_id, offered, _ = choice
                self._grant(framework_id, agent, offered)
                decisions.append(Allocation(framework_id, agent.agent_id, offered))
            elif agent.blocked_by:
                self._walked_blocked(agent)
        return decisions

    def _allocate_packed(self, agents: list[_Agent], now: float, wanting: int) -> list[Allocation]:
        """The cycle with packing (see the module): the same walk at each agent, but a
        framework with a demand is offered one task at a time where it fits best."""
        pool: dict[Resources, dict[str, _Agent]] = {}  # free -> the cycle's agents with it
        reserved = self._reservations  # not in the pool: walked only, see `_choose`
        left = {f: list(self._frameworks[f].counts) for f in self._declared}
        wish = self._reservation_wish(left) if self.reserving else None
        spare: dict[Resources, list[_Agent]] = {}  # with `wish`: blocked agents too
        for agent in agents:
            free = agent.free
            if is_allocatable(free) and agent.agent_id not in reserved:
                if wish is not None:
                    spare.setdefault(free, []).append(agent)
                if not agent.is_blocked(free, wanting, now):
                    pool.setdefault(free, {})[agent.agent_id] = agent
        if wish is not None:
            self._reserve(wish, spare, pool, now)
        declaring = [self._frameworks[f] for f in self._declared]
        declaring = [f for f in declaring if f.wants_offers]
        # An agent none of these fits is not walked, when every framework that wants
        # offers declared a demand: one full walk each for agents that packing left
        # with crumbs would make the cycle O(agents x frameworks).
        shapes = {shape for f in declaring for shape in f.demand or ()}
        crumbs_skipped = len(declaring) == wanting
        granted: dict[tuple[str, str], Resources] = {}
        # Frameworks offered all they declared: out of the walk for the rest of the cycle.
        done: list[str] = []
        try:
            self._packed_walks(
                agents, pool, left, granted, done, now, shapes if crumbs_skipped else None
            )
        finally:
            for framework_id in done:
                self._tree.set_wants(framework_id, self._frameworks[framework_id].wants_offers)
        return [Allocation(f, a, r) for (f, a), r in granted.items()]

    def _packed_walks(
        self,
        agents: list[_Agent],
        pool: dict[Resources, dict[str, _Agent]],
        left: dict[str, list[int]],
        granted: dict[tuple[str, str], Resources],
        done: list[str],
        now: float,
        shapes: set[Resources] | None,
    ) -> None:
        for agent in agents:
            if self._tree.wanting_count() == 0:
                return
            while True:
                free = agent.free
                reservation = self._reservations.get(agent.agent_id)
                if reservation is not None:
                    if not is_allocatable(free):
                        break
                elif agent.agent_id not in pool.get(free, ()):
                    break  # not allocatable, blocked, or given away whole
                elif shapes is not None and not any(free.contains(s) for s in shapes):
                    break
                passed: list[_Framework] = []
                choice = self._choose(agent, free, now, left, passed, reservation)
                if choice is None:
                    if agent.blocked_by:
                        self._walked_blocked(agent)
                    break
                framework_id, offered, headroom = choice
                framework = self._frameworks[framework_id]
                if framework.demand is None:
                    if reservation is None:
                        self._pool_move(pool, agent, free, offered, whole=True)
                    self._grant(framework_id, agent, offered)
                    key = (framework_id, agent.agent_id)
                    granted[key] = granted.get(key, EMPTY) + offered
                    break
                if (
                    reservation is not None
                    and framework_id == reservation.framework_id
                    and self._fulfils(reservation, offered, left)
                ):
                    # The shape fits at last: the agent is offered to the framework.
                    target, index = agent, framework.demand.index(reservation.shape)
                    self._end_reservation(agent.agent_id, "fitted", now)
                    pool.setdefault(free, {})[agent.agent_id] = agent
                else:
                    target, index = self._place(
                        framework, headroom, agent, free, offered, pool, left, passed, now
                    )
                shape = framework.demand[index]
                left[framework_id][index] -= 1
                if not any(n > 0 for n in left[framework_id]):
                    self._tree.set_wants(framework_id, False)
                    done.append(framework_id)
                if target.agent_id not in self._reservations:
                    self._pool_move(pool, target, target.free, shape, whole=False)
                self._grant(framework_id, target, shape)
                key = (framework_id, target.agent_id)
                granted[key] = granted.get(key, EMPTY) + shape

    def _place(
        self,
        framework: _Framework,
        headroom: Headroom,
        walked: _Agent,
        walked_free: Resources,
        offered: Resources,
        pool: dict[Resources, dict[str, _Agent]],
        left: dict[str, list[int]],
        passed: list[_Framework],
        now: float,
    ) -> tuple[_Agent, int]:
        """Where (and which shape) to offer `framework` one task: the best fit among the
        cycle's agents it may be offered; the walked agent, where one fits, breaks ties.

        Another agent is chosen only if the task takes no room there that a framework
        ahead of it in order (`passed`: the walk passed them, their demand does not fit
        the walked agent) could use: packing must not starve a larger shape, ahead of
        it, of the agents where it would fit."""
        assert framework.demand is not None
        counts = left[framework.framework_id]
        best: tuple[tuple[float, float], int] | None = None
        best_agent = walked
        for index, shape in enumerate(framework.demand):
            if counts[index] > 0 and offered.contains(shape):
                score = fit_score(walked_free, shape, self._total)
                if best is None or score < best[0]:
                    best = (score, index)
        assert best is not None, "the walk picked a framework none of whose shapes fits"
        for free, members in pool.items():
            if free == walked_free:
                continue
            view = clip(free, headroom)
            for index, shape in enumerate(framework.demand):
                if counts[index] <= 0 or not view.contains(shape):
                    continue
                score = fit_score(free, shape, self._total)
                if score < best[0] and not _spoils(free, shape, passed, left):
                    agent = self._first_unfiltered(framework.framework_id, members, free, now)
                    if agent is not None:
                        best, best_agent = (score, index), agent
        return best_agent, best[1]

    # Reservations (master/reservations.py) ----------------------------------------

    def _reservation_wish(self, left: dict[str, list[int]]) -> _Wish | None:
        """Whether the framework first in order may reserve agents this cycle, and for
        which of its shapes (those its roles' limits allow). O(S)."""
        first = next(self._tree.candidates(), None)
        if first is None:
            return None
        framework_id, headroom = first
        framework = self._frameworks[framework_id]
        if framework.demand is None:
            return None
        room = min(
            self.max_reservations - len(framework.reserved),
            cluster_bound(len(self._agents)) - len(self._reservations),
        )
        counts = list(left[framework_id])
        for agent_id in framework.reserved:  # a task of each is waited for already
            counts[framework.demand.index(self._reservations[agent_id].shape)] -= 1
        wanted = [
            (i, shape)
            for i, shape in enumerate(framework.demand)
            if counts[i] > 0 and clip(shape, headroom) == shape
        ]
        if room <= 0 or not wanted:
            return None
        return _Wish(framework, headroom, wanted, counts, room)

    def _reserve(
        self,
        wish: _Wish,
        spare: dict[Resources, list[_Agent]],
        pool: dict[Resources, dict[str, _Agent]],
        now: float,
    ) -> None:
        """Reserve agents for `wish`'s framework (first in order) if no shape of its
        demand fits any agent's free resources (`spare`: every agent not reserved with
        allocatable free resources, blocked or not): those closest to fitting a shape.
        O(B x S) to see that nothing fits (B distinct free vectors, S shapes), then
        O(B x S log(B x S)) to rank them, and a scan of the best ranked agents."""
        framework, headroom, wanted = wish.framework, wish.headroom, wish.wanted
        frees = [*spare, *(self._agents[a].free for a in self._reservations)]
        for free in frees:
            view = clip(free, headroom)
            if any(view.contains(shape) for _, shape in wanted):
                return  # it is offered a task this cycle
        ranked: list[tuple[float, int, int, Resources]] = []
        for free in spare:  # in the walk's order of agents, for ties
            for i, shape in wanted:
                ranked.append((shortfall(free, shape, self._total), len(ranked), i, free))
        ranked.sort()
        framework_id = framework.framework_id
        counts, room, shapes = wish.counts, wish.room, dict(wanted)
        for _, _, i, free in ranked:
            shape = shapes[i]
            for agent in spare[free]:
                if counts[i] <= 0:
                    break
                if agent.agent_id in self._reservations:
                    continue
                others = agent.total - agent.by_framework.get(framework_id, EMPTY)
                if not others.contains(shape) or framework.barred.get(agent.agent_id, 0) > now:
                    continue  # it fits there only once its own tasks end, or it timed out
                refused = agent.filters.get(framework_id)
                if refused is not None and refused.expires_at > now:
                    continue
                reservation = Reservation(framework_id, agent.agent_id, shape, now)
                self._reservations[agent.agent_id] = reservation
                framework.reserved.add(agent.agent_id)
                self._reservation_events.append(ReservationEvent(reservation))
                if agent.agent_id in pool.get(free, ()):
                    self._pool_move(pool, agent, free, free, whole=True)
                counts[i] -= 1
                room -= 1
                if room == 0:
                    return

    def _fulfils(
        self, reservation: Reservation, offered: Resources, left: dict[str, list[int]]
    ) -> bool:
        """Whether the reserver, offered `offered` on the agent, gets its reserved task."""
        if not offered.contains(reservation.shape):
            return False
        demand = self._frameworks[reservation.framework_id].demand
        assert demand is not None, "a reserver's demand names the reserved shape"
        return left[reservation.framework_id][demand.index(reservation.shape)] > 0

    def _expire_reservations(self, now: float) -> None:
        """End reservations held too long, and those whose framework declined the agent.
        O(reservations)."""
        for agent_id, reservation in list(self._reservations.items()):
            if now - reservation.since >= self.reservation_timeout:
                framework = self._frameworks[reservation.framework_id]
                framework.barred = {a: t for a, t in framework.barred.items() if t > now}
                framework.barred[agent_id] = now + self.reservation_timeout
                self._end_reservation(agent_id, "timeout", now)
                continue
            refused = self._agents[agent_id].filters.get(reservation.framework_id)
            if refused is not None and refused.expires_at > now:
                self._end_reservation(agent_id, "filtered", now)

    def _end_reservation(self, agent_id: str, outcome: Outcome, now: float | None = None) -> None:
        reservation = self._reservations.pop(agent_id)
        self._frameworks[reservation.framework_id].reserved.discard(agent_id)
        held = (self._clock() if now is None else now) - reservation.since
        self._reservation_events.append(ReservationEvent(reservation, outcome, held))

    def _first_unfiltered(
        self, framework_id: str, members: dict[str, _Agent], free: Resources, now: float
    ) -> _Agent | None:
        for agent in members.values():
            refused = agent.filters.get(framework_id)
            if refused is None or refused.expires_at <= now or not refused.resources.contains(free):
                return agent
        return None

    @staticmethod
    def _pool_move(
        pool: dict[Resources, dict[str, _Agent]],
        agent: _Agent,
        free: Resources,
        taken: Resources,
        whole: bool,
    ) -> None:
        """Take `taken` out of the agent's free resources in the cycle's pool (all of
        the agent, for an offer of what is left of it)."""
        members = pool[free]
        del members[agent.agent_id]
        if not members:
            del pool[free]
        rest = free - taken
        if not whole and is_allocatable(rest):
            pool.setdefault(rest, {})[agent.agent_id] = agent

    def _walked_blocked(self, agent: _Agent) -> None:
        """A full walk found everyone filtered or unfit: refresh the (possibly early) expiry."""
        agent.blocked_until = min(
            (f.expires_at for f in agent.filters.values() if f.block_gen == agent.block_gen),
            default=float("inf"),
        )

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

    def reservations(self) -> Iterable[Reservation]:
        """The agents reserved now (master/reservations.py), one each."""
        return self._reservations.values()

    def take_reservation_events(self) -> list[ReservationEvent]:
        """The reservations made and ended since the last call, in order."""
        events, self._reservation_events = self._reservation_events, []
        return events

    # Internals -------------------------------------------------------------

    def _choose(
        self,
        agent: _Agent,
        free: Resources,
        now: float,
        left: dict[str, list[int]] | None = None,
        passed: list[_Framework] | None = None,
        reservation: Reservation | None = None,
    ) -> tuple[str, Resources, Headroom] | None:
        """The first framework in order that may be offered the agent's `free`
        resources, what it is offered and its roles' headroom. With `left` (packing),
        a framework with a demand must also still wait, this cycle, for a task of a
        shape that fits, and the first `MAX_PASSED` frameworks skipped because no
        shape of their demand fits `free` are appended to `passed`.

        Each framework skipped because it filtered `free` or because no shape of its
        demand fits `free` is counted toward the agent's block (`blocked_by`).

        With the agent's `reservation`, frameworks behind the reserver in order see
        only the `surplus` of `free` (a block counted against the surplus holds for an
        agent whose free resources are that surplus: the same frameworks refuse it)."""
        filters = agent.filters
        whole = free
        reserver = None if reservation is None else reservation.framework_id
        behind = False
        for framework_id, headroom in self._tree.candidates():
            if behind:  # the reserver was the one before: from here on, the surplus
                behind = False
                free = surplus(whole, reservation.shape)  # type: ignore[union-attr]
                if not is_allocatable(free):
                    return None
            if framework_id == reserver:
                behind = True
            refused = filters.get(framework_id)
            if refused is not None:
                if refused.expires_at <= now:
                    self._drop_filter(framework_id, agent)
                elif refused.resources.contains(free):
                    if agent.blocked_free != free:
                        self._new_block(agent, free)
                    if refused.block_gen != agent.block_gen and framework_id not in agent.unfit:
                        refused.block_gen = agent.block_gen
                        agent.blocked_by += 1
                        agent.blocked_until = min(agent.blocked_until, refused.expires_at)
                    continue
            framework = self._frameworks[framework_id]
            demand = framework.demand
            if demand is not None and not any(free.contains(shape) for shape in demand):
                if agent.blocked_free != free:
                    self._new_block(agent, free)
                if framework_id not in agent.unfit:
                    agent.unfit.add(framework_id)
                    framework.unfit_agents.add(agent.agent_id)
                    agent.blocked_by += 1
                if passed is not None and len(passed) < MAX_PASSED:
                    passed.append(framework)
                continue
            offered = clip(free, headroom)
            if is_allocatable(offered) and self._fits_demand(framework, offered, left):
                return framework_id, offered, headroom
        return None

    @staticmethod
    def _fits_demand(
        framework: _Framework, offered: Resources, left: dict[str, list[int]] | None
    ) -> bool:
        demand = framework.demand
        if demand is None:
            return True
        if left is None:
            return any(offered.contains(shape) for shape in demand)
        counts = left[framework.framework_id]
        return any(counts[i] > 0 and offered.contains(shape) for i, shape in enumerate(demand))

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
                self._new_block(agent, free)
            if framework_id not in agent.unfit:  # else it is counted already
                refused.block_gen = agent.block_gen
                agent.blocked_by += 1
                agent.blocked_until = min(agent.blocked_until, expires_at)

    def _drop_filter(self, framework_id: str, agent: _Agent) -> None:
        refused = agent.filters.pop(framework_id)
        self._frameworks[framework_id].filtered_agents.discard(agent.agent_id)
        self._unblock(agent, refused)

    @staticmethod
    def _new_block(agent: _Agent, free: Resources) -> None:
        """Count blocks against `free` from now on (the old ones no longer count)."""
        agent.blocked_free = free
        agent.block_gen += 1
        agent.blocked_by = 0
        agent.blocked_until = float("inf")
        agent.unfit.clear()

    def _clear_unfit(self, framework: _Framework) -> None:
        """Its demand changed or it stopped wanting offers: it blocks no agent as unfit."""
        framework_id = framework.framework_id
        for agent_id in framework.unfit_agents:
            agent = self._agents.get(agent_id)
            if agent is not None and framework_id in agent.unfit:
                agent.unfit.discard(framework_id)
                agent.blocked_by -= 1
        framework.unfit_agents.clear()

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
            agent.unfit.clear()
        for framework in self._frameworks.values():
            framework.unfit_agents.clear()

    def _refresh(self, framework_id: str) -> None:
        framework = self._frameworks[framework_id]
        if not framework.wants_offers:
            # It no longer counts toward blocking any agent, nor holds one.
            for agent_id in list(framework.reserved):
                self._end_reservation(agent_id, "not_wanting")
            for agent_id in framework.filtered_agents:
                agent = self._agents[agent_id]
                self._unblock(agent, agent.filters[framework_id])
            self._clear_unfit(framework)
        self._tree.set_wants(framework_id, framework.wants_offers)

    def _set_total(self, total: Resources) -> None:
        self._total = total
        self._tree.set_total(total)
