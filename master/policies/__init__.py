"""Share policies: how much of the cluster a holding of resources counts as.

The allocator orders roles and frameworks by `policy.share(allocation, total)`
divided by the role's weight, lowest first. Swapping the policy swaps the
notion of fairness, so the DRF paper's comparisons can be run on the real
system:

- `drf`: the dominant share, the largest fraction of any one resource
  (Dominant Resource Fairness).
- `asset`: the sum of the fractions of every resource (asset fairness).
- `slots`: the number of fixed-size slots the holding occupies (Hadoop-style
  slot fair sharing).

A weight may also be a vector, one weight per resource (`weighted_share`; see
`base` for how each policy divides by it).
"""

from __future__ import annotations

from mesolite.master.policies.asset import AssetPolicy
from mesolite.master.policies.base import SharePolicy, weighted_share
from mesolite.master.policies.drf import DRFPolicy
from mesolite.master.policies.slots import SlotsPolicy

POLICIES = ("drf", "asset", "slots")


def make_policy(name: str) -> SharePolicy:
    if name == "drf":
        return DRFPolicy()
    if name == "asset":
        return AssetPolicy()
    if name == "slots":
        return SlotsPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")


__all__ = [
    "POLICIES",
    "AssetPolicy",
    "DRFPolicy",
    "SharePolicy",
    "SlotsPolicy",
    "make_policy",
    "weighted_share",
]
