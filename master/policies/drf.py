"""Dominant Resource Fairness: a holding counts as its largest fraction of any resource."""

from __future__ import annotations

from collections.abc import Mapping

from mesolite.master.policies.base import divided
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

    def vector_weighted_share(
        self,
        allocation: Resources,
        total: Resources,
        weight: float,
        resource_weights: Mapping[str, float],
    ) -> float:
        """The weighted dominant share of the DRF paper: max over r of share_r / w_r."""
        held, cluster = allocation._units, total._units
        best = 0.0
        for name, amount in held.items():
            available = cluster.get(name)
            if available:
                fraction = divided(amount / available, resource_weights.get(name, weight))
                if fraction > best:
                    best = fraction
        return best
