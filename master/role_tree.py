"""The role tree: who goes first, kept in order incrementally.

Roles form a tree by path (`eng`, `eng/ml`); frameworks hang off roles. Every
node keeps its *active* entries (those with at least one framework below them
that wants offers) in a sorted list, lowest first, by

    (tier, weighted share, seq)

where `tier` is 0 for a role still below its guarantee and 1 otherwise (so
guarantees are served first), the weighted share is the policy's share of the
subtree's allocation (relative to the cluster total, as in Mesos' hierarchical
DRF) divided by the role's weight, and `seq` (creation order) breaks ties
deterministically. A role's own frameworks sit in a group entry beside its
child roles, weighted 1 (Mesos' "virtual leaf"). A role's weight may be a
vector, one weight per resource (`resource_weights`; the resources it does
not name weigh `weight`): then its weighted share is the policy's, each
resource's part divided by its own weight (DRF: max over r of share_r / w_r;
`master.policies.base`).

Changing one framework's allocation re-positions it and each of its ancestors
in their parents' lists: O(depth x log(siblings)). Only a change of the
cluster total changes every share at once; then the lists are rebuilt lazily,
O(n log n), on the next walk.

`candidates()` walks the tree in order and yields each framework that wants
offers together with the headroom its roles' limits leave (None: unlimited).
A limit caps only the resources it names: a role at its CPU limit can still be
offered memory. A subtree is skipped only when its headroom leaves neither
CPUs nor memory, since no offer without one of them is ever made.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from mesolite.master.policies import DRFPolicy, SharePolicy, weighted_share
from mesolite.model import DEFAULT_ROLE
from mesolite.resources import EMPTY, Resources

_GROUP = "."  # the name of a role's own-frameworks entry in its sorted list
_seq = itertools.count()

Key = tuple[int, float, int, str]
Headroom = dict[str, int] | None  # thousandths still allowed per limited resource


@dataclass(eq=False, slots=True)
class _Framework:
    framework_id: str
    role: _Role
    wants: bool
    seq: int = field(default_factory=lambda: next(_seq))
    allocation: Resources = EMPTY
    key: tuple[float, int, str] = (0.0, 0, "")


@dataclass(eq=False, slots=True)
class _Group:
    """A role's own frameworks, as one entry beside its child roles."""

    order: SortedList = field(default_factory=SortedList)
    allocation: Resources = EMPTY
    wanting: int = 0
    seq: int = field(default_factory=lambda: next(_seq))
    key: Key = (0, 0.0, 0, _GROUP)


@dataclass(eq=False, slots=True)
class _Role:
    path: str
    name: str
    parent: _Role | None
    weight: float = 1.0
    # One weight per resource, for the resources it names (None: `weight` for all).
    resource_weights: dict[str, float] | None = None
    guarantee: Resources = EMPTY
    # Thousandths per limited resource; a name with 0 allows none of it
    # (which `Resources`, dropping zeros, could not say). None: no limit.
    limit: dict[str, int] | None = None
    configured: bool = False
    children: dict[str, _Role] = field(default_factory=dict)
    group: _Group = field(default_factory=_Group)
    order: SortedList = field(default_factory=SortedList)
    allocation: Resources = EMPTY
    wanting: int = 0  # frameworks wanting offers in this subtree
    framework_count: int = 0  # frameworks in this subtree
    seq: int = field(default_factory=lambda: next(_seq))
    key: Key = (0, 0.0, 0, "")


def split_role(path: str) -> list[str]:
    return [path] if path == DEFAULT_ROLE else path.split("/")


class RoleTree:
    def __init__(self, policy: SharePolicy | None = None) -> None:
        self.policy: SharePolicy = policy or DRFPolicy()
        self._root = _Role("", "", None)
        self._roles: dict[str, _Role] = {"": self._root}
        self._frameworks: dict[str, _Framework] = {}
        self._total = EMPTY
        self._dirty = False
        self.ensure_role(DEFAULT_ROLE)

    # Roles -----------------------------------------------------------------

    def ensure_role(self, path: str) -> bool:
        """Create the role (and its missing ancestors) with weight 1; True if it was new."""
        if path in self._roles:
            return False
        parent = self._root
        for name in split_role(path):
            sub = name if parent is self._root else f"{parent.path}/{name}"
            role = self._roles.get(sub)
            if role is None:
                role = _Role(sub, name, parent)
                parent.children[name] = role
                self._roles[sub] = role
            parent = role
        return True

    def configure_role(
        self,
        path: str,
        weight: float,
        guarantee: Resources,
        limit: Mapping[str, float] | None,
        resource_weights: Mapping[str, float] | None = None,
    ) -> None:
        """Set a role's weight, guarantee and limit (amounts per resource; None: unlimited).

        `resource_weights` gives the resources it names a weight of their own;
        the others weigh `weight`.
        """
        if weight < 0 or weight != weight:
            raise ValueError(f"weight of role {path!r} must be >= 0, got {weight}")
        for name, w in (resource_weights or {}).items():
            if w < 0 or w != w:
                raise ValueError(f"weight of role {path!r} for {name} must be >= 0, got {w}")
        self.ensure_role(path)
        role = self._roles[path]
        role.weight, role.guarantee, role.configured = weight, guarantee, True
        role.resource_weights = dict(resource_weights) if resource_weights else None
        role.limit = None if limit is None else {n: round(a * 1000) for n, a in limit.items()}
        self._reposition_role(role)

    def unconfigure_role(self, path: str) -> None:
        """Back to the defaults (weight 1, no guarantee or limit)."""
        self.configure_role(path, 1.0, EMPTY, None)
        self._roles[path].configured = False

    def prune(self) -> None:
        """Forget roles that are neither configured nor used by any framework."""
        for path in sorted(self._roles, key=len, reverse=True):
            role = self._roles[path]
            if (
                path
                and path != DEFAULT_ROLE
                and not role.configured
                and role.framework_count == 0
                and not role.children
            ):
                assert role.parent is not None
                del role.parent.children[role.name]
                del self._roles[path]

    def has_role(self, path: str) -> bool:
        return path in self._roles

    def role_paths(self) -> list[str]:
        return [p for p in self._roles if p]

    def role_weight(self, path: str) -> float:
        return self._roles[path].weight

    def role_resource_weights(self, path: str) -> dict[str, float] | None:
        """The role's own weight per resource it names; None when `role_weight` is for all."""
        weights = self._roles[path].resource_weights
        return None if weights is None else dict(weights)

    def role_guarantee(self, path: str) -> Resources:
        return self._roles[path].guarantee

    def role_limit(self, path: str) -> dict[str, float] | None:
        limit = self._roles[path].limit
        return None if limit is None else {n: u / 1000 for n, u in limit.items()}

    def role_allocation(self, path: str) -> Resources:
        return self._roles[path].allocation

    def role_active(self, path: str) -> bool:
        return self._roles[path].wanting > 0

    def role_configured(self, path: str) -> bool:
        return self._roles[path].configured

    def role_share(self, path: str) -> float:
        """The role's weighted share (policy share of its subtree / its weight)."""
        role = self._roles[path]
        return self._weighted(role)

    # Frameworks ------------------------------------------------------------

    def add_framework(self, framework_id: str, role_path: str, wants: bool) -> None:
        if framework_id in self._frameworks:
            raise KeyError(f"framework {framework_id} is already in the role tree")
        self.ensure_role(role_path)
        role = self._roles[role_path]
        framework = _Framework(framework_id, role, wants=False)
        self._frameworks[framework_id] = framework
        node: _Role | None = role
        while node is not None:
            node.framework_count += 1
            node = node.parent
        if wants:
            self.set_wants(framework_id, True)

    def remove_framework(self, framework_id: str) -> None:
        framework = self._frameworks[framework_id]
        self.set_wants(framework_id, False)
        if not framework.allocation.is_empty():
            self.unallocated(framework_id, framework.allocation)
        node: _Role | None = framework.role
        while node is not None:
            node.framework_count -= 1
            node = node.parent
        del self._frameworks[framework_id]

    def set_wants(self, framework_id: str, wants: bool) -> None:
        """Whether the framework wants offers: only those are walked, and make roles active."""
        framework = self._frameworks[framework_id]
        if framework.wants == wants:
            return
        delta = 1 if wants else -1
        role = framework.role
        group = role.group
        if wants:
            framework.key = self._framework_key(framework)
            self._add(group.order, framework.key)
        else:
            self._discard(group.order, framework.key)
        framework.wants = wants
        was_active = group.wanting > 0
        group.wanting += delta
        if was_active != (group.wanting > 0):
            if wants:
                group.key = self._group_key(group)
                self._add(role.order, group.key)
            else:
                self._discard(role.order, group.key)
        node: _Role | None = role
        while node is not None:
            was_active = node.wanting > 0
            node.wanting += delta
            parent = node.parent
            if parent is not None and was_active != (node.wanting > 0):
                if wants:
                    node.key = self._role_key(node)
                    self._add(parent.order, node.key)
                else:
                    self._discard(parent.order, node.key)
            node = parent

    def framework_role(self, framework_id: str) -> str:
        return self._frameworks[framework_id].role.path

    def framework_allocation(self, framework_id: str) -> Resources:
        return self._frameworks[framework_id].allocation

    def framework_share(self, framework_id: str) -> float:
        """The framework's share under the policy, divided by its role's weight."""
        framework = self._frameworks[framework_id]
        return self._weighted(framework.role, framework.allocation)

    def wanting_count(self) -> int:
        return self._root.wanting

    def active_roles(self) -> set[str]:
        return {p for p, r in self._roles.items() if p and r.wanting > 0}

    # Allocations -----------------------------------------------------------

    def allocated(self, framework_id: str, resources: Resources) -> None:
        self._change(self._frameworks[framework_id], resources, adding=True)

    def unallocated(self, framework_id: str, resources: Resources) -> None:
        self._change(self._frameworks[framework_id], resources, adding=False)

    def set_total(self, total: Resources) -> None:
        if total != self._total:
            self._total = total
            self._dirty = True

    @property
    def total(self) -> Resources:
        return self._total

    # Walking ---------------------------------------------------------------

    def candidates(self) -> Iterator[tuple[str, Headroom]]:
        """Frameworks that want offers, best first, with their roles' remaining headroom.

        Do not change the tree while iterating: take one candidate, then walk again.
        """
        if self._dirty:
            self._rebuild()
        return self._walk(self._root, None)

    def _walk(self, role: _Role, headroom: Headroom) -> Iterator[tuple[str, Headroom]]:
        for entry in role.order:
            name = entry[3]
            if name == _GROUP:
                for key in role.group.order:
                    yield key[2], headroom
                continue
            child = role.children[name]
            room = headroom
            if child.limit is not None:
                room = _narrow(headroom, child.limit, child.allocation)
                if room.get("cpus") == 0 and room.get("mem") == 0:
                    # No CPUs and no memory left under the limits: no offer can
                    # reach the allocator's minimum, which needs one of them.
                    # (At its limit in the resources it limits is not enough:
                    # the resources it does not limit can still be offered.)
                    continue
            yield from self._walk(child, room)

    # Internals -------------------------------------------------------------

    def _weighted(self, role: _Role, allocation: Resources | None = None) -> float:
        """The policy's share of `allocation` (default: the role's) over the role's weight."""
        held = role.allocation if allocation is None else allocation
        return weighted_share(self.policy, held, self._total, role.weight, role.resource_weights)

    def _framework_key(self, framework: _Framework) -> tuple[float, int, str]:
        share = self.policy.share(framework.allocation, self._total)
        return (share, framework.seq, framework.framework_id)

    def _group_key(self, group: _Group) -> Key:
        return (1, self.policy.share(group.allocation, self._total), group.seq, _GROUP)

    def _role_key(self, role: _Role) -> Key:
        below = not role.allocation.contains(role.guarantee)
        return (
            0 if below else 1,
            self._weighted(role),
            role.seq,
            role.name,
        )

    def _add(self, order: SortedList, key: object) -> None:
        if not self._dirty:
            order.add(key)

    def _discard(self, order: SortedList, key: object) -> None:
        if not self._dirty:
            order.remove(key)

    def _change(self, framework: _Framework, delta: Resources, adding: bool) -> None:
        def apply(current: Resources) -> Resources:
            return current + delta if adding else current - delta

        role = framework.role
        framework.allocation = apply(framework.allocation)
        if framework.wants:
            self._discard(role.group.order, framework.key)
            framework.key = self._framework_key(framework)
            self._add(role.group.order, framework.key)
        group = role.group
        group.allocation = apply(group.allocation)
        if group.wanting > 0:
            self._discard(role.order, group.key)
            group.key = self._group_key(group)
            self._add(role.order, group.key)
        node: _Role | None = role
        while node is not None:
            node.allocation = apply(node.allocation)
            self._reposition_role(node)
            node = node.parent

    def _reposition_role(self, role: _Role) -> None:
        parent = role.parent
        if parent is None or role.wanting == 0:
            return
        self._discard(parent.order, role.key)
        role.key = self._role_key(role)
        self._add(parent.order, role.key)

    def _rebuild(self) -> None:
        self._dirty = False
        for role in self._roles.values():
            role.order = SortedList()
            role.group.order = SortedList()
        for framework in self._frameworks.values():
            if framework.wants:
                framework.key = self._framework_key(framework)
                framework.role.group.order.add(framework.key)
        for role in self._roles.values():
            if role.group.wanting > 0:
                role.group.key = self._group_key(role.group)
                role.order.add(role.group.key)
            if role.parent is not None and role.wanting > 0:
                role.key = self._role_key(role)
                role.parent.order.add(role.key)


def _narrow(headroom: Headroom, limit: dict[str, int], allocation: Resources) -> dict[str, int]:
    """The headroom left under `limit`, combined with the headroom from above."""
    held = allocation._units
    room = {name: max(0, cap - held.get(name, 0)) for name, cap in limit.items()}
    if headroom:
        for name, cap in headroom.items():
            room[name] = min(cap, room.get(name, cap))
    return room


def clip(free: Resources, headroom: Headroom) -> Resources:
    """`free`, cut down to what the headroom allows."""
    if not headroom:
        return free
    units = dict(free._units)
    for name, cap in headroom.items():
        if name in units and units[name] > cap:
            if cap > 0:
                units[name] = cap
            else:
                del units[name]
    return Resources._from_units(units)
