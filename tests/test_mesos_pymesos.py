"""Unmodified pymesos 0.3.15 schedulers (tests/support/pymesos_scheduler.py, in the venv of
scripts/pymesos_venv.py) against a real master and agents, over the Mesos HTTP API.

The idle check needs over 100 s of nothing: its run starts when the test session has
collected it, on a cluster of its own in a process of its own
(tests/support/pymesos_idle.py, started by tests/conftest.py), and goes on beside the
other tests; its test reads the run's report.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from examples.batch import BatchFramework, BatchSpec
from mesolite.model import TaskState
from tests.cluster import LocalCluster
from tests.recording import running
from tests.support import pymesos_idle
from tests.support.pymesos_runs import Scheduler, pending
from tests.waiting import wait_for_condition

# The idle check waits for its run, which may have started a moment before.
pytestmark = [pytest.mark.timeout(300)]


async def test_command_tasks_finish_reconcile_and_tear_down(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:512")
        await cluster.add_agent("cpus:2;mem:512")
        scheduler = await Scheduler.start(
            cluster.server.http_address,
            "--name", "finisher", "--tasks", "6", "--cpus", "1", "--mem", "64",
            "--command", 'echo "$MESOS_TASK_ID in $MESOS_SANDBOX"; test -n "$MESOS_AGENT_ID"',
        )  # fmt: skip
        task_ids = [f"finisher-{i}" for i in range(1, 7)]
        try:
            await wait_for_condition(
                lambda: all("TASK_FINISHED" in scheduler.states(t) for t in task_ids),
                timeout=60,
                what="six tasks finished",
            )
            [registered] = scheduler.of("registered")
            framework_id = registered["framework_id"]
            for t in task_ids:
                assert scheduler.states(t)[-3:] == [
                    "TASK_STARTING",
                    "TASK_RUNNING",
                    "TASK_FINISHED",
                ]
            finished = [e for e in scheduler.of("update") if e["state"] == "TASK_FINISHED"]
            assert all(e["uuid"] and e["source"] == "SOURCE_EXECUTOR" for e in finished)
            # pymesos acknowledged every update: none is left for the agents to retry.
            await wait_for_condition(
                lambda: all(pending(agent) == 0 for agent in cluster.agents),
                timeout=15,
                what="every update acknowledged",
            )  # pymesos acknowledges after its statusUpdate callback returns

            await scheduler.send("reconcile finisher-1 nobody")
            await wait_for_condition(
                lambda: any(
                    e["task_id"] == "nobody" and e["state"] == "TASK_LOST"
                    for e in scheduler.of("update")
                ),
                timeout=15,
            )
            answer = [
                e for e in scheduler.of("update")
                if e["task_id"] == "finisher-1" and e["source"] == "SOURCE_MASTER"
            ]  # fmt: skip
            assert answer and answer[-1]["state"] == "TASK_FINISHED"
            assert answer[-1]["reason"] == "REASON_RECONCILIATION" and not answer[-1]["uuid"]
        finally:
            assert await scheduler.stop() == 0
        assert scheduler.of("error") == []
        await wait_for_condition(
            lambda: framework_id not in cluster.master.frameworks, timeout=15, what="teardown"
        )
        assert framework_id in cluster.master.completed_frameworks


async def test_pymesos_and_sdk_frameworks_reach_the_drf_split(tmp_path: Path) -> None:
    """The DRF paper's example with A a pymesos framework and B an SDK one: 3 and 2."""
    async with LocalCluster(tmp_path) as cluster:
        a = await Scheduler.start(
            cluster.server.http_address,
            "--name", "A", "--tasks", "100", "--cpus", "1", "--mem", "4096",
            "--command", "sleep 120", "--refuse-seconds", "0.2", "--per-offer", "1",
        )  # fmt: skip
        b = BatchFramework(
            BatchSpec(name="B", cpus=3, mem=1024, tasks=0, command="sleep 120"),
            out=lambda line: None,
        )
        try:
            await wait_for_condition(lambda: bool(a.of("registered")), timeout=30)
            async with running(b, cluster.address):
                await wait_for_condition(lambda: len(cluster.master.frameworks) == 2)
                await cluster.add_agent("cpus:9;mem:18432")

                def cpus_in_use() -> float:
                    return float(sum(t.spec.resources["cpus"] for t in cluster.master.tasks()))

                await wait_for_condition(lambda: cpus_in_use() == 9, timeout=30, what="9 CPUs")
                state = await cluster.state()
                counts = {f["name"]: f["running_tasks"] for f in state["frameworks"]}
                assert counts == {"A": 3, "B": 2}
                await wait_for_condition(
                    lambda: sum(t.state is TaskState.RUNNING for t in cluster.master.tasks()) == 5,
                    timeout=30,
                )
        finally:
            assert await a.stop() == 0
        assert a.of("error") == []


async def test_an_idle_subscription_and_calls_connection_outlive_100_seconds(
    pymesos_idle_run: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    work_dir, process = pymesos_idle_run
    timeout = pymesos_idle.IDLE_SECONDS + 120
    code = await asyncio.to_thread(process.wait, timeout)
    log = (work_dir / "run.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    report = json.loads((work_dir / pymesos_idle.REPORT).read_text())
    assert report["error"] is None, log[-3000:]
    assert report["idle_for"] > 100
    events = report["events"]

    def of(kind: str) -> list[dict[str, Any]]:
        return [e for e in events if e["event"] == kind]

    # Its end was acknowledged (the run waited for it) on the connection that had idled
    # all along: pymesos would have raised on a closed one.
    assert of("disconnected") == [] and of("reregistered") == []
    assert of("error") == []
    assert len(of("registered")) == 1
    assert len(of("heartbeat")) >= report["idle_for"] / report["heartbeat_interval"] / 2
