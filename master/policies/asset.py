"""Asset fairness: every resource's fraction is worth the same, and they add up.

The DRF paper shows this violates sharing incentive: a user can end up with
less than 1/n of every resource.
"""

from __future__ import annotations

from collections.abc import Mapping

from mesolite.master.policies.base import divided
from mesolite.resources import Resources


class AssetPolicy:
    name = "asset"

    def share(self, allocation: Resources, total: Resources) -> float:
        cluster = total._units
        return sum(
            amount / cluster[name]
            for name, amount in allocation._units.items()
            if cluster.get(name)
        )

    def vector_weighted_share(
        self,
        allocation: Resources,
        total: Resources,
        weight: float,
        resource_weights: Mapping[str, float],
    ) -> float:
        """The sum over r of share_r / w_r."""
        cluster = total._units
        return sum(
            divided(amount / cluster[name], resource_weights.get(name, weight))
            for name, amount in allocation._units.items()
            if cluster.get(name)
        )
