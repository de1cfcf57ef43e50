"""DRF sorter: clients kept in ascending order of weighted dominant share.

A client's dominant share is the largest, over all resources, of its
allocation divided by the cluster total; the weighted share divides that by the
client's weight. The order is kept incrementally in a sorted list, so changing
one client's allocation costs O(log n) rather than a re-sort (the lesson of
Mesos' DRF sorter). Ties are broken by the order clients were added, so runs
are deterministic.

Only when the cluster total changes do all shares change at once; then the
order is rebuilt lazily, O(n log n), on the next read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from mesolite.resources import EMPTY, Resources


@dataclass(slots=True)
class _Client:
    name: str
    seq: int
    weight: float
    allocation: Resources = EMPTY
    active: bool = True
    key: tuple[float, int] = field(default=(0.0, 0))


def dominant_share(allocation: Resources, total: Resources) -> float:
    shares = allocation.shares(total)
    return max(shares.values(), default=0.0)


class DRFSorter:
    def __init__(self) -> None:
        self._clients: dict[str, _Client] = {}
        self._order: SortedList = SortedList()
        self._total = EMPTY
        self._next_seq = 0
        self._dirty = False

    # Clients ---------------------------------------------------------------

    def add(self, name: str, weight: float = 1.0) -> None:
        if name in self._clients:
            raise KeyError(f"client {name!r} already in the sorter")
        if not weight > 0:
            raise ValueError(f"weight of {name!r} must be positive, got {weight}")
        client = _Client(name, self._next_seq, weight)
        self._next_seq += 1
        client.key = (0.0, client.seq)
        self._clients[name] = client
        self._order.add((client.key, name))

    def remove(self, name: str) -> None:
        client = self._clients.pop(name)
        if client.active:
            self._discard(client)

    def __contains__(self, name: str) -> bool:
        return name in self._clients

    def activate(self, name: str) -> None:
        client = self._clients[name]
        if not client.active:
            client.active = True
            self._insert(client)

    def deactivate(self, name: str) -> None:
        """Keep the client's allocation but leave it out of the order."""
        client = self._clients[name]
        if client.active:
            self._discard(client)
            client.active = False

    def set_weight(self, name: str, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"weight of {name!r} must be positive, got {weight}")
        self._reposition(self._clients[name], weight=weight)

    # Allocations -----------------------------------------------------------

    def allocated(self, name: str, resources: Resources) -> None:
        client = self._clients[name]
        self._reposition(client, allocation=client.allocation + resources)

    def unallocated(self, name: str, resources: Resources) -> None:
        client = self._clients[name]
        self._reposition(client, allocation=client.allocation - resources)

    def allocation(self, name: str) -> Resources:
        return self._clients[name].allocation

    def set_total(self, total: Resources) -> None:
        if total != self._total:
            self._total = total
            self._dirty = True

    # Reading ---------------------------------------------------------------

    def share(self, name: str) -> float:
        """The client's weighted dominant share."""
        client = self._clients[name]
        return dominant_share(client.allocation, self._total) / client.weight

    def sorted(self) -> Iterator[str]:
        """Active clients, lowest weighted dominant share first.

        Do not change the sorter while iterating; restart the iteration instead.
        """
        if self._dirty:
            self._rebuild()
        for _, name in self._order:
            yield name

    def __len__(self) -> int:
        return len(self._clients)

    # Internals -------------------------------------------------------------

    def _key(self, client: _Client) -> tuple[float, int]:
        return (dominant_share(client.allocation, self._total) / client.weight, client.seq)

    def _insert(self, client: _Client) -> None:
        client.key = self._key(client)
        if not self._dirty:
            self._order.add((client.key, client.name))

    def _discard(self, client: _Client) -> None:
        if not self._dirty:
            self._order.remove((client.key, client.name))

    def _reposition(
        self, client: _Client, allocation: Resources | None = None, weight: float | None = None
    ) -> None:
        if client.active:
            self._discard(client)
        if allocation is not None:
            client.allocation = allocation
        if weight is not None:
            client.weight = weight
        if client.active:
            self._insert(client)

    def _rebuild(self) -> None:
        self._dirty = False
        for client in self._clients.values():
            client.key = self._key(client)
        self._order = SortedList((c.key, c.name) for c in self._clients.values() if c.active)
