"""Instantaneous fair shares with demand caps: what preemption measures roles against.

The Fair Scheduler preempts toward each queue's *instantaneous* fair share, the
cluster divided among the queues that want something now, where no queue is
given more than it demands (`ComputeFairShares` over min(maxShare, demand)).
`master/fair_share.py` already divides a tree of roles exactly, with weights,
guarantees and limits; this module adds the demand cap: a role's limit of each
resource becomes the smaller of its configured limit and its demand (what it
holds plus what it declared it waits for), so what a role cannot use goes to the
others. A role that declared nothing is capped by nothing (its demand is
unknown, as in Mesos), a resource its demand does not name is capped at 0.

Pure: `fair_levels(inputs, total, active, demands)` returns every role's share.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from mesolite.master.fair_share import ShareInput, compute_fair_shares
from mesolite.resources import Resources


def capped(share_input: ShareInput, demand: Resources | None, total: Resources) -> ShareInput:
    """The role's settings with its limit cut to its demand (None: unchanged)."""
    if demand is None:
        return share_input
    limit = dict(share_input.limit or {})
    for name in total:
        limit[name] = min(limit.get(name, math.inf), demand.get_amount(name))
    return ShareInput(
        share_input.weight, share_input.guarantee, limit, share_input.resource_weights
    )


def fair_levels(
    inputs: Mapping[str, ShareInput],
    total: Resources,
    active: Collection[str],
    demands: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    """Each role's instantaneous fair share of `total`, among the `active` roles, with
    each role in `demands` capped by its demand (see the module docstring)."""
    demands = demands or {}
    if not demands:
        return compute_fair_shares(inputs, total, active)
    return compute_fair_shares(
        {path: capped(i, demands.get(path), total) for path, i in inputs.items()},
        total,
        active,
    )
