"""An independent model of the allocator's documented rule, for the property tests.

Written from the documentation (README "Roles", `master/allocator.py` and
`master/role_tree.py` docstrings), not from the code: it keeps no sorted
structures, no cached keys and no counters, and recomputes everything from the
raw facts (what every framework holds on every agent, the roles configuration,
the filters, the clock) each time it is asked. It never calls the allocator or
the role tree; tests compare the two.

The rule, as documented:

- Amounts are whole thousandths. The cluster total is the sum of every known
  agent's total (connected or not).
- A framework wants offers while it is connected and not suppressed. A role is
  active while some framework in it or below it wants offers.
- One cycle visits the active agents (in a seeded order the model does not
  predict; tests check each decision in the order made). Each agent's free
  resources (total less everything held there: offers and tasks alike) go to
  the first framework of the walk below that has not filtered them, cut to
  what its roles' limits allow, unless the cut offer is below the minimum
  (0.01 CPU or 32 MB of memory), in which case the walk goes on.
- The walk, at each role from the root down, visits the active child roles
  and (as one entry, weight 1, never below a guarantee) the role's own
  frameworks that want offers, lowest first by

      (0 if below its guarantee in any resource else 1,
       policy share of the subtree's holdings / weight,
       creation order)

  where a role's own group counts as created with the role (so before its
  children) and weight 0 counts as an infinite share once anything is held.
  Inside a group: lowest share first, then subscription order. Ids never
  decide.
- A role's limit caps what it holds, counting everything below it; an offer
  is cut to the least headroom on the path from the top-level role down.
- A filter (declined resources R on an agent, until a time) keeps the agent
  from the framework while R contains all of the agent's free resources; it
  is gone once the clock reaches its expiry, when the framework revives, is
  removed, or the agent is removed. A new filter replaces the old one.
- Roles are created (with their missing ancestors, top down) when configured
  or first used; after a reconfiguration or a framework's removal, roles that
  are neither configured nor used by a framework in their subtree go away.
  `*` always exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from mesolite.resources import Resources

Units = dict[str, int]  # thousandths per resource name, no zero entries

DEFAULT_ROLE = "*"
MIN_CPUS = 10  # 0.01 CPU
MIN_MEM = 32_000  # 32 MB


def units(resources: Resources) -> Units:
    return {name: round(amount * 1000) for name, amount in resources.items()}


def resources(amounts: Mapping[str, int]) -> Resources:
    return Resources({name: u / 1000 for name, u in amounts.items() if u})


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Units:
    out = dict(a)
    for name, u in b.items():
        out[name] = out.get(name, 0) + u
    return {n: u for n, u in out.items() if u}


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Units:
    out = dict(a)
    for name, u in b.items():
        left = out.get(name, 0) - u
        assert left >= 0, f"model: {b} is more than {a}"
        out[name] = left
    return {n: u for n, u in out.items() if u}


def within(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    """Every amount of `a` is at most `b`'s."""
    return all(u <= b.get(name, 0) for name, u in a.items())


def allocatable(offer: Mapping[str, int]) -> bool:
    return offer.get("cpus", 0) >= MIN_CPUS or offer.get("mem", 0) >= MIN_MEM


def parent_of(path: str) -> str:
    """ "" (the root) for a top-level role."""
    return path.rpartition("/")[0] if path != DEFAULT_ROLE else ""


def lineage(path: str) -> list[str]:
    """The role and its ancestors, top-level first."""
    if path == DEFAULT_ROLE:
        return [path]
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def in_subtree(role: str, path: str) -> bool:
    return role == path or role.startswith(path + "/")


def drf_share(held: Mapping[str, int], total: Mapping[str, int]) -> float:
    """The largest fraction of any one resource (resources the cluster lacks are skipped)."""
    return max((u / total[n] for n, u in held.items() if total.get(n)), default=0.0)


@dataclass
class Role:
    path: str
    created: int
    weight: float = 1.0
    guarantee: Units = field(default_factory=dict)
    limit: dict[str, int] | None = None  # a name present with 0 allows none
    configured: bool = False


@dataclass
class Framework:
    framework_id: str
    role: str
    subscribed: int
    connected: bool = True
    suppressed: bool = False

    @property
    def wants(self) -> bool:
        return self.connected and not self.suppressed


@dataclass
class Agent:
    total: Units
    active: bool = True


@dataclass
class Filter:
    declined: Units
    expires_at: float


@dataclass(frozen=True)
class RoleConfig:
    weight: float = 1.0
    guarantee: Units = field(default_factory=dict)
    limit: dict[str, int] | None = None


Headroom = dict[str, int]  # per limited resource; a name absent is unlimited


class Model:
    def __init__(self) -> None:
        self.now = 0.0
        self.roles: dict[str, Role] = {}
        self.frameworks: dict[str, Framework] = {}
        self.agents: dict[str, Agent] = {}
        self.held: dict[tuple[str, str], Units] = {}  # (framework, agent) -> offers + tasks
        self.filters: dict[tuple[str, str], Filter] = {}
        self._created = 0
        self._subscribed = 0
        self._ensure(DEFAULT_ROLE)

    # What happens ------------------------------------------------------------

    def add_agent(self, agent_id: str, total: Units) -> None:
        self.agents[agent_id] = Agent(dict(total))

    def remove_agent(self, agent_id: str) -> None:
        del self.agents[agent_id]
        for key in [k for k in self.held if k[1] == agent_id]:
            del self.held[key]
        for key in [k for k in self.filters if k[1] == agent_id]:
            del self.filters[key]

    def add_framework(self, framework_id: str, role: str, connected: bool) -> bool:
        new_role = role not in self.roles
        self._ensure(role)
        self._subscribed += 1
        self.frameworks[framework_id] = Framework(
            framework_id, role, self._subscribed, connected=connected
        )
        return new_role

    def remove_framework(self, framework_id: str) -> None:
        del self.frameworks[framework_id]
        for key in [k for k in self.held if k[0] == framework_id]:
            del self.held[key]
        for key in [k for k in self.filters if k[0] == framework_id]:
            del self.filters[key]
        self._prune()

    def revive(self, framework_id: str) -> None:
        self.frameworks[framework_id].suppressed = False
        for key in [k for k in self.filters if k[0] == framework_id]:
            del self.filters[key]

    def grant(self, framework_id: str, agent_id: str, amounts: Units) -> None:
        key = (framework_id, agent_id)
        self.held[key] = add(self.held.get(key, {}), amounts)

    def recover(
        self, framework_id: str, agent_id: str, amounts: Units, refuse_seconds: float
    ) -> None:
        key = (framework_id, agent_id)
        left = sub(self.held[key], amounts)
        if left:
            self.held[key] = left
        else:
            del self.held[key]
        if refuse_seconds > 0 and amounts:
            self.filters[key] = Filter(dict(amounts), self.now + refuse_seconds)

    def configure_roles(self, config: Mapping[str, RoleConfig]) -> None:
        for path, role in self.roles.items():
            if role.configured and path not in config:
                role.weight, role.guarantee, role.limit = 1.0, {}, None
                role.configured = False
        for path, settings in config.items():
            self._ensure(path)
            role = self.roles[path]
            role.weight, role.guarantee = settings.weight, dict(settings.guarantee)
            role.limit = None if settings.limit is None else dict(settings.limit)
            role.configured = True
        self._prune()

    def set_role_weight(self, path: str, weight: float) -> None:
        self._ensure(path)
        self.roles[path].weight = weight
        self.roles[path].configured = True

    # What follows ------------------------------------------------------------
    #
    # Everything is recomputed from `held` on every call: slow, and obviously so.

    @property
    def total(self) -> Units:
        total: Units = {}
        for agent in self.agents.values():
            total = add(total, agent.total)
        return total

    def agent_held(self, agent_id: str) -> Units:
        return _sum(amounts for (_, a), amounts in self.held.items() if a == agent_id)

    def free(self, agent_id: str) -> Units:
        return sub(self.agents[agent_id].total, self.agent_held(agent_id))

    def framework_held(self, framework_id: str) -> Units:
        return _sum(amounts for (f, _), amounts in self.held.items() if f == framework_id)

    def role_held(self, path: str) -> Units:
        """Everything held by frameworks in the role or below it."""
        return _sum(
            amounts
            for (f, _), amounts in self.held.items()
            if in_subtree(self.frameworks[f].role, path)
        )

    def group_held(self, path: str) -> Units:
        """Everything held by the role's own frameworks."""
        return _sum(
            amounts for (f, _), amounts in self.held.items() if self.frameworks[f].role == path
        )

    def active(self, path: str) -> bool:
        return any(f.wants and in_subtree(f.role, path) for f in self.frameworks.values())

    def active_roles(self) -> set[str]:
        return {path for path in self.roles if self.active(path)}

    @staticmethod
    def weighted(held: Units, weight: float, total: Units) -> float:
        share = drf_share(held, total)
        if weight == 0:
            return float("inf") if share > 0 else 0.0
        return share / weight

    def role_share(self, path: str) -> float:
        return self.weighted(self.role_held(path), self.roles[path].weight, self.total)

    def framework_share(self, framework_id: str) -> float:
        framework = self.frameworks[framework_id]
        weight = self.roles[framework.role].weight
        return self.weighted(self.framework_held(framework_id), weight, self.total)

    def below_guarantee(self, path: str) -> bool:
        held = self.role_held(path)
        return any(held.get(n, 0) < g for n, g in self.roles[path].guarantee.items())

    def headroom(self, path: str) -> Headroom:
        """The least room left under the limits of the role and its ancestors."""
        room: Headroom = {}
        for role_path in lineage(path):
            limit = self.roles[role_path].limit
            if limit is None:
                continue
            held = self.role_held(role_path)
            for name, cap in limit.items():
                left = max(0, cap - held.get(name, 0))
                room[name] = min(left, room.get(name, left))
        return room

    def walk(self, path: str = "") -> Iterator[str]:
        """Frameworks that want offers, in the documented order."""
        total = self.total
        entries: list[tuple[tuple[int, float, int], str, bool]] = []
        for child, role in self.roles.items():
            if parent_of(child) == path and self.active(child):
                tier = 0 if self.below_guarantee(child) else 1
                key = (tier, self.weighted(self.role_held(child), role.weight, total), role.created)
                entries.append((key, child, False))
        own = [f for f in self.frameworks.values() if f.role == path and f.wants]
        if own:
            group_share = drf_share(self.group_held(path), total)
            entries.append(((1, group_share, self.roles[path].created), path, True))
        for _, name, is_group in sorted(entries, key=lambda e: e[0]):
            if is_group:
                ordered = sorted(
                    own,
                    key=lambda f: (
                        drf_share(self.framework_held(f.framework_id), total),
                        f.subscribed,
                    ),
                )
                yield from (f.framework_id for f in ordered)
            else:
                yield from self.walk(name)

    def choose(self, agent_id: str) -> tuple[str, Units] | None:
        """Who is offered this agent's free resources now, and what; None: nobody."""
        agent = self.agents[agent_id]
        if not agent.active:
            return None
        free = self.free(agent_id)
        if not allocatable(free):
            return None
        for framework_id in list(self.walk()):
            refused = self.filters.get((framework_id, agent_id))
            if refused and self.now < refused.expires_at and within(free, refused.declined):
                continue  # filtered: what it declined there covers all that is free
            offer = clip(free, self.headroom(self.frameworks[framework_id].role))
            if allocatable(offer):
                return framework_id, offer
        return None

    # Internals ---------------------------------------------------------------

    def _ensure(self, path: str) -> None:
        for role_path in lineage(path):
            if role_path not in self.roles:
                self._created += 1
                self.roles[role_path] = Role(role_path, self._created)

    def _prune(self) -> None:
        changed = True
        while changed:
            changed = False
            for path, role in list(self.roles.items()):
                if path == DEFAULT_ROLE or role.configured:
                    continue
                if any(in_subtree(f.role, path) for f in self.frameworks.values()):
                    continue
                if any(parent_of(other) == path for other in self.roles if other != path):
                    continue
                del self.roles[path]
                changed = True


def _sum(parts: Iterable[Mapping[str, int]]) -> Units:
    out: Units = {}
    for part in parts:
        out = add(out, part)
    return out


def clip(free: Mapping[str, int], room: Headroom) -> Units:
    out = {n: min(u, room[n]) if n in room else u for n, u in free.items()}
    return {n: u for n, u in out.items() if u}
