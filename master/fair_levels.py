"""Instantaneous fair shares with demand caps: what preemption measures roles against.

The Fair Scheduler preempts toward each queue's *instantaneous* fair share, the
cluster divided among the queues that want something now, where no queue is
given more than it demands (`ComputeFairShares` over min(maxShare, demand)).
`master/fair_share.py` already divides a tree of roles exactly, with weights,
guarantees and limits; this module adds the demand cap: a role's limit of each
resource becomes the smaller of its configured limit and its demand (what it
holds plus what it declared it waits for), so what a role cannot use goes to the
others. A resource its demand does not name is capped at 0.

A role that declared nothing has no known demand (as in Mesos), but what its
tasks hold shows which resources it uses: it is capped at 0 in every resource
it holds none of, and uncapped in the others. So a role running CPU-only tasks
gets no share of memory, which would otherwise raise its fair share (as the
policy measures it, its largest part) above what it could ever hold and starve
it, by that measure, at its full share of CPUs: the Fair Scheduler computes each
resource type's shares apart and caps each at the demand for it, and no task of
such a role demands memory. A role that holds nothing and declared nothing is
capped by nothing (nothing is known of it yet).

Pure: `fair_levels(inputs, total, active, demands, held)` returns every role's
share.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mesolite.master.fair_share import ShareInput, compute_fair_shares
from mesolite.resources import Resources


@dataclass(frozen=True, slots=True)
class InstantShares:
    """What `instantaneous_fair_shares` (master/role_settings.py) returns: every role's
    share; what the roles of live frameworks hold; the demands of those whose
    frameworks all declared one."""

    fair: dict[str, Resources]
    held: dict[str, Resources]
    demands: dict[str, Resources]


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


def confined(share_input: ShareInput, held: Resources, total: Resources) -> ShareInput:
    """The role's settings with its limit of every resource it holds none of cut to 0."""
    limit = dict(share_input.limit or {})
    for name in total:
        if held.get_amount(name) <= 0:
            limit[name] = 0.0
    return ShareInput(
        share_input.weight, share_input.guarantee, limit, share_input.resource_weights
    )


def fair_levels(
    inputs: Mapping[str, ShareInput],
    total: Resources,
    active: Collection[str],
    demands: Mapping[str, Resources] | None = None,
    held: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    """Each role's instantaneous fair share of `total`, among the `active` roles, with
    each role in `demands` capped by its demand, and each other role in `held` that
    holds something confined to the resources it holds (see the module docstring)."""
    demands = demands or {}
    confine = {
        path: h for path, h in (held or {}).items() if path not in demands and not h.is_empty()
    }
    if not demands and not confine:
        return compute_fair_shares(inputs, total, active)
    limited = dict(inputs)
    for path, i in inputs.items():
        if path in demands:
            limited[path] = capped(i, demands[path], total)
        elif path in confine:
            limited[path] = confined(i, confine[path], total)
    return compute_fair_shares(limited, total, active)
