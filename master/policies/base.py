"""The one interface every share policy implements, and how weights divide a share.

A role's weight is one number, or one number per resource (the DRF paper's weight
vector W_i = (w_i1, ..., w_im)): `resource_weights` maps resource names to their
weight, and a resource it does not name weighs `weight`. A scalar weight divides
the policy's share; a vector weight divides each resource's part of it before the
policy combines them (DRF: the largest of share_r / w_r; asset fairness: their sum;
slots: the slot count each resource needs over its weight). A weight of 0 on a
resource the holding has any of makes the weighted share infinite (the holder goes
last); a weight of 0 on a resource it holds none of changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from mesolite.resources import Resources

INFINITE = float("inf")


class SharePolicy(Protocol):
    name: str

    def share(self, allocation: Resources, total: Resources) -> float:
        """How much of `total` the `allocation` counts as: 0 for nothing, 1 for everything."""
        ...

    def vector_weighted_share(
        self,
        allocation: Resources,
        total: Resources,
        weight: float,
        resource_weights: Mapping[str, float],
    ) -> float:
        """The share with each resource's part divided by its own weight (see the module)."""
        ...


def weighted_share(
    policy: SharePolicy,
    allocation: Resources,
    total: Resources,
    weight: float,
    resource_weights: Mapping[str, float] | None = None,
) -> float:
    """The policy's share of `allocation` divided by the weight (scalar or per resource)."""
    if resource_weights:
        return policy.vector_weighted_share(allocation, total, weight, resource_weights)
    share = policy.share(allocation, total)
    if weight > 0:
        return share / weight
    return INFINITE if share > 0 else 0.0


def divided(fraction: float, weight: float) -> float:
    """One resource's positive fraction over its weight; a weight of 0 makes it infinite."""
    return fraction / weight if weight > 0 else INFINITE
