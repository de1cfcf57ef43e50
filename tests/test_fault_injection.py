"""Seeded fault injection over a real cluster (see tests/chaos.py).

CI runs a few seeds; for many, run `python scripts/fault_injection.py --runs 50`
or set MESOLITE_FAULT_SEEDS.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import run_chaos

SEEDS = int(os.environ.get("MESOLITE_FAULT_SEEDS", "3"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", range(SEEDS))
async def test_cluster_survives_random_faults(tmp_path: Path, seed: int) -> None:
    report = await run_chaos(tmp_path, seed)
    print(report.line())
    assert sum(report.faults.values()) > 0 and report.tasks > 0
    assert report.violations == []
