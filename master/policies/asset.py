"""Asset fairness: every resource's fraction is worth the same, and they add up.

The DRF paper shows this violates sharing incentive: a user can end up with
less than 1/n of every resource.
"""

from __future__ import annotations

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
