"""Demand: what a framework declares it waits for (Call.Demand).

Mesos' REQUEST call never did anything, so a framework that needs a shape no
offer fits can only decline, and frameworks behind it wait (MESOS-6111). Here a
framework may declare its pending tasks, shape and count, as often as they
change. The allocator then offers it only agents where one of its shapes fits
(`Allocator.set_demand`), and its role's instantaneous fair share is capped at
what it holds plus what it declared (`master/fair_levels.py`), as the Fair
Scheduler caps a queue's share by its demand. A framework that declares nothing
keeps today's behaviour. The declaration lives in memory only: after a master
restart or a failover the framework declares again (the SDK's `declare_demand`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mesolite.master.core import MasterCore, checked, log
from mesolite.master.errors import CallRejected
from mesolite.resources import EMPTY, Resources

MAX_SHAPES = 64  # per declaration
MAX_COUNT = 1_000_000  # tasks of one shape


class DemandHandling(MasterCore):
    @checked
    def declare_demand(self, framework_id: str, shapes: Sequence[tuple[Resources, int]]) -> None:
        framework = self._framework(framework_id)
        if len(shapes) > MAX_SHAPES:
            raise CallRejected(f"a demand names at most {MAX_SHAPES} shapes, not {len(shapes)}")
        for resources, count in shapes:
            if not 0 <= count <= MAX_COUNT:
                raise CallRejected(f"a shape's count must be 0 to {MAX_COUNT}, not {count}")
            if resources.is_empty():
                raise CallRejected("a demand's shape must name some resources")
        wanted = tuple((r, n) for r, n in shapes if n > 0)
        framework.demand = wanted
        self.allocator.set_demand(framework_id, wanted)
        self.log_reservations()
        log.info(
            "demand declared",
            framework_id=framework_id,
            shapes=len(wanted),
            tasks=sum(n for _, n in wanted),
        )
        self.request_allocation()

    def role_demands(self) -> dict[str, Resources]:
        """What each role waits for beyond what it holds: for roles whose every live
        framework declared a demand (a role with one that did not is uncapped)."""
        demands: dict[str, Resources] = {}
        undeclared: set[str] = set()
        for framework in self.frameworks.values():
            if framework.removing:
                continue
            role = framework.info.role
            if framework.demand is None:
                undeclared.add(role)
                continue
            total = demands.get(role, EMPTY)
            for resources, count in framework.demand:
                total = total + _times(resources, count)
            demands[role] = total
        return {role: d for role, d in demands.items() if role not in undeclared}


def _times(resources: Resources, count: int) -> Resources:
    return Resources({n: resources.get_amount(n) * count for n in resources})
