"""Seeded fault injection over a real cluster (see tests/chaos.py).

CI runs a few seeds; for many, run `python scripts/fault_injection.py --runs 50`
or set MESOLITE_FAULT_SEEDS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from mesolite.agent._procs import is_alive, process_start_time
from tests.chaos import AGENTS, Chaos, _task_processes, run_chaos
from tests.waiting import wait_for_condition

SEEDS = int(os.environ.get("MESOLITE_FAULT_SEEDS", "2"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", range(SEEDS))
async def test_cluster_survives_random_faults(tmp_path: Path, seed: int) -> None:
    report = await run_chaos(tmp_path, seed)
    print(report.line())
    assert sum(report.faults.values()) > 0 and report.tasks > 0
    assert report.violations == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("master_down", [False, True], ids=["master-up", "master-down"])
async def test_a_framework_the_last_fault_started_is_judged_live(
    tmp_path: Path, master_down: bool
) -> None:
    """Seed 200: the last fault replaced beta while the master was down, and no task was
    left running, so the judge ran at once: it took the live frameworks' ids before the
    new generation had subscribed (its id still None), and then judged that generation,
    listed by the master under its new id, a gone framework still listed."""
    chaos = Chaos(tmp_path, seed=0)
    try:
        await chaos.master.start()
        for i in range(AGENTS):
            await chaos.start_agent(i)
        for kind in ("alpha", "beta"):
            chaos.start_framework(kind)
        for fw in chaos.frameworks.values():
            fw.want = 0  # no tasks: nothing to wait for once the faults are over
        await wait_for_condition(
            lambda: all(fw.connected for fw in chaos.frameworks.values()),
            what="both frameworks subscribed",
        )
        if master_down:
            await chaos.master.kill()
        await chaos.crash_framework("beta")
        chaos.start_framework("beta")  # beta-g2, a new framework: no id before it subscribes
        if master_down:
            await chaos.master.start()
        await chaos.settle()
        async with aiohttp.ClientSession() as http:
            await chaos.judge(http)
    finally:
        await chaos.cleanup()
    assert chaos.report.violations == []


@pytest.mark.unit
def test_the_orphan_judge_finds_every_task_process_an_agent_recorded(tmp_path: Path) -> None:
    """In its checkpoints, in its supervisor's exit log (a spawned command whose
    checkpoint a compaction dropped) and in a wrapper's wrapper.json."""
    me, started = os.getpid(), process_start_time(os.getpid())
    checkpoint = {"framework_id": "fw", "task": {"task_id": "a"}, "pid": me}
    (tmp_path / "tasks.jsonl").write_text(json.dumps({**checkpoint, "pid_start_time": started}))
    (tmp_path / "supervisor").mkdir()
    spawned = {"op": "spawned", "run": "r", "records": str(tmp_path / "meta" / "fw" / "b")}
    (tmp_path / "supervisor" / "exits.jsonl").write_text(
        json.dumps({**spawned, "pid": me, "start_time": started}) + "\n"
    )
    (tmp_path / "meta" / "fw" / "c").mkdir(parents=True)
    wrapper = {"pid": me, "start_time": started}
    (tmp_path / "meta" / "fw" / "c" / "wrapper.json").write_text(json.dumps(wrapper))
    found = _task_processes(tmp_path)
    assert sorted(key for key, _, _ in found) == [("fw", "a"), ("fw", "b"), ("fw", "c")]
    assert all(is_alive(pid, start) for _, pid, start in found)
