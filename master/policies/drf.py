"""Dominant Resource Fairness: a holding counts as its largest fraction of any resource."""

from __future__ import annotations

from mesolite.resources import Resources


class DRFPolicy:
    name = "drf"

    def share(self, allocation: Resources, total: Resources) -> float:
        held, cluster = allocation._units, total._units
        best = 0.0
        for name, amount in held.items():
            available = cluster.get(name)
            if available:
                fraction = amount / available
                if fraction > best:
                    best = fraction
        return best
