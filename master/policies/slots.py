"""Slot fair sharing, as Hadoop's Fair Scheduler did before it knew about multiple resources.

Each agent is thought of as cut into slots of a fixed size (default: 1 CPU and
2048 MB). A holding occupies as many slots as its most slot-hungry resource
needs, rounded up; its share is that count over the cluster's slot count. A
task that needs 1 CPU and 10 GB thus counts as 5 slots, and one that needs
0.1 CPU and 100 MB as a whole slot: the mismatch the DRF paper measures.
"""

from __future__ import annotations

import math

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

    def share(self, allocation: Resources, total: Resources) -> float:
        capacity = min(total._units.get(name, 0) // s for name, s in self.slot._units.items())
        if capacity <= 0:
            return 0.0
        return self.slots(allocation) / capacity
