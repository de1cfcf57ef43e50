"""The dynamic-sharing experiment's phases 2 and 3 on the simulator, with and without
packing and reservations: each job's dominant share, and the distance to DRF's
equilibrium (50% each in both phases), the sum over the two jobs of |equilibrium -
measured|.

    python scripts/sim_reservations.py

Phase 2 is `docs/simulate/phase2.toml` (a cluster full of phase 1's tasks, averaged
over 10-20 s), phase 3 `docs/simulate/phase3.toml` (from an empty cluster, 15-40 s).
Deterministic (virtual time, seeded): one run of each. A benchmark, not a test: it
prints figures and asserts nothing (tests/test_reservations.py pins phase 2's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mesolite import logs
from mesolite.lab.sim.engine import simulate
from mesolite.lab.sim.workload import SimWorkload, load_workload

ROOT = Path(__file__).resolve().parent.parent
PHASES = (
    ("phase 2", "docs/simulate/phase2.toml", 10.0, 20.0),
    ("phase 3", "docs/simulate/phase3.toml", 15.0, 40.0),
)
WAYS = (
    ("no packing, no demand", False, False, False),
    ("no packing, demand", True, False, False),
    ("packing, no reservations", True, True, False),
    ("packing, reservations", True, True, True),
)
EQUILIBRIUM = 0.5


def measure(
    workload: SimWorkload, since: float, until: float, demand: bool, packing: bool, reserving: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """Each role's mean dominant share and the mean fraction of each resource in use."""
    settings = dataclasses.replace(
        workload.settings, demand=demand, packing=packing, reservations=reserving
    )
    result = simulate(dataclasses.replace(workload, settings=settings))
    shares: dict[str, list[float]] = {}
    for time, role, share in result.shares:
        if since <= time <= until:
            shares.setdefault(role, []).append(share)
    samples = [s for s in result.samples if since <= s.time <= until]
    used = {n: sum(s.used[n] for s in samples) / len(samples) for n in samples[0].used}
    return {r: sum(v) / len(v) for r, v in sorted(shares.items())}, used


def main() -> int:
    logs.configure(level="warning")
    for phase, path, since, until in PHASES:
        workload = load_workload(ROOT / path)
        print(f"{phase} ({path}, averaged over {since:g}-{until:g} s; DRF equilibrium 50% each)")
        print(
            f"  {'':26} {'job1':>6} {'job2':>6} {'distance':>9} {'cpus used':>10} {'mem used':>9}"
        )
        for label, demand, packing, reserving in WAYS:
            shares, used = measure(workload, since, until, demand, packing, reserving)
            distance = sum(abs(EQUILIBRIUM - s) for s in shares.values())
            print(
                f"  {label:26} {shares['job1']:6.1%} {shares['job2']:6.1%} "
                f"{distance * 100:6.1f} pp {used['cpus']:10.1%} {used['mem']:9.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
