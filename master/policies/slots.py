"""Slot fair sharing, as Hadoop's Fair Scheduler did before it knew about multiple resources.

Each agent is thought of as cut into slots of a fixed size (default: 1 CPU and
2048 MB). A holding occupies as many slots as its most slot-hungry resource
needs, rounded up; its share is that count over the cluster's slot count. A
task that needs 1 CPU and 10 GB thus counts as 5 slots, and one that needs
0.1 CPU and 100 MB as a whole slot: the mismatch the DRF paper measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mesolite.master.policies.base import divided
from mesolite.resources import Resources

DEFAULT_SLOT = Resources(cpus=1, mem=2048)


class SlotsPolicy:
    name = "slots"

    def __init__(self, slot: Resources = DEFAULT_SLOT) -> None:
        if slot.is_empty():
            raise ValueError("a slot must have a size")
        self.slot = slot

    def slots(self, resources: Resources) -> int:
        units, size = resources._units, self.slot._units
        return max((math.ceil(units.get(name, 0) / s) for name, s in size.items()), default=0)

    def capacity(self, total: Resources) -> int:
        """How many whole slots the cluster holds."""
        return min(total._units.get(name, 0) // s for name, s in self.slot._units.items())

    def share(self, allocation: Resources, total: Resources) -> float:
        capacity = self.capacity(total)
        if capacity <= 0:
            return 0.0
        return self.slots(allocation) / capacity

    def vector_weighted_share(
        self,
        allocation: Resources,
        total: Resources,
        weight: float,
        resource_weights: Mapping[str, float],
    ) -> float:
        """The largest over r of (slots resource r needs) / w_r, over the cluster's slots.

        With one weight for every resource this is `share` divided by it, as the
        slot count is the largest of the per-resource counts.
        """
        capacity = self.capacity(total)
        if capacity <= 0:
            return 0.0
        units, size = allocation._units, self.slot._units
        best = 0.0
        for name, s in size.items():
            needed = math.ceil(units.get(name, 0) / s)
            if needed:
                best = max(best, divided(needed / capacity, resource_weights.get(name, weight)))
        return best
