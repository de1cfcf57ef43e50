"""The built-in jobs and services across a master SIGKILL: `mesolite master` (whose
process runs them) and `mesolite agent` as real processes, the examples submitted with
`mesolite run`, the master killed mid-job and started again on the same work dir.

After the restart the service still has exactly its 3 instances (the same processes,
nothing launched again), and the job finishes without running any index twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import all_checkpoints
from tests.test_restart_workload import cluster, start_agent
from tests.test_workloads_cluster import SWEEP, TICKER, framework_named, mesolite, ran
from tests.waiting import wait_for_condition

pytestmark = pytest.mark.slow


def sweep(state: dict[str, Any]) -> dict[str, Any]:
    [job] = [j for j in state["jobs"] if j["name"] == "sweep"]
    assert isinstance(job, dict)
    return job


def instances(state: dict[str, Any]) -> list[str]:
    f = framework_named(state, "service:ticker")
    if f is None:
        return []
    return sorted(
        t["id"]
        for t in state["tasks"]
        if t["framework_id"] == f["id"] and t["state"] == "TASK_RUNNING"
    )


async def test_a_master_restart_neither_loses_nor_duplicates_jobs_and_services(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (master, agents, http):
        agent = await start_agent(master, agents, tmp_path)
        code, out = await mesolite("run", str(TICKER), "--master", master.http_address)
        assert code == 0, out
        state = await master.wait_state(http, lambda s: len(instances(s)) == 3, "3 instances")
        service_id = framework_named(state, "service:ticker")["id"]  # type: ignore[index]
        await wait_for_condition(lambda: len(agent.task_pids()) == 3, what="3 processes")
        pids = sorted(agent.task_pids())
        before = instances(state)

        code, out = await mesolite("run", str(SWEEP), "--master", master.http_address)
        assert code == 0, out
        state = await master.wait_state(
            http,
            lambda s: bool(s["jobs"]) and 6 <= sweep(s)["succeeded"] < 14,
            "the sweep under way",
        )
        job_id = sweep(state)["framework_id"]

        await master.kill()
        await master.start()

        state = await master.wait_state(
            http,
            lambda s: bool(s["jobs"]) and sweep(s)["status"] != "active",
            "the sweep to finish after the restart",
            timeout=90,
        )
        assert (sweep(state)["status"], sweep(state)["succeeded"]) == ("completed", 20)
        # Every index ran once but index 7 (twice: its first try fails on purpose).
        runs = ran(tmp_path / "agent", job_id)
        indices = sorted(int(task_id.split(".")[1]) for task_id in runs)
        assert indices == sorted([*range(20), 7]), runs.keys()

        # The service: back, reconciled, wanting nothing (its offers suppressed).
        state = await master.wait_state(
            http,
            lambda s: (
                (f := framework_named(s, "service:ticker")) is not None
                and f["connected"]
                and f["suppressed"]
            ),
            "the service's framework back and settled",
            timeout=90,
        )
        assert framework_named(state, "service:ticker")["id"] == service_id  # type: ignore[index]
        assert instances(state) == before
        assert sorted(agent.task_pids()) == pids, "the instances' processes are the same"
        launched = [
            r for r in all_checkpoints(tmp_path / "agent") if r["framework_id"] == service_id
        ]
        assert len(launched) == 3, "nothing launched again"
        [service] = state["services"]
        assert (service["running"], service["instances"], service["restarts"]) == (3, 3, 0)
        assert master.violations() == []
