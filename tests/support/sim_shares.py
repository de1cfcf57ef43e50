"""Each role's dominant share on the simulator, averaged over a window of its run."""

from __future__ import annotations

import dataclasses

from mesolite.lab.sim.engine import simulate
from mesolite.lab.sim.workload import SimWorkload


def mean_shares(
    workload: SimWorkload, since: float, until: float, **settings: bool
) -> dict[str, float]:
    """Run `workload` with `settings` (SimulationSettings fields) changed; each role's
    dominant share of what its tasks use, averaged over the samples in [since, until],
    rounded to a thousandth."""
    changed = dataclasses.replace(workload.settings, **settings)  # type: ignore[arg-type]
    result = simulate(dataclasses.replace(workload, settings=changed))
    shares: dict[str, list[float]] = {}
    for time, role, share in result.shares:
        if since <= time <= until:
            shares.setdefault(role, []).append(share)
    return {role: round(sum(v) / len(v), 3) for role, v in shares.items()}
