"""Unmodified pymesos 0.3.15 schedulers (tests/support/pymesos_scheduler.py, in the venv of
scripts/pymesos_venv.py) against a real master and agents, over the Mesos HTTP API.

The idle check needs over 100 s of nothing: it starts first, on a cluster of its own
(module fixture `idle`), and the other checks run on theirs meanwhile; the last test
collects it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from examples.batch import BatchFramework, BatchSpec
from mesolite.agent import Agent
from mesolite.model import TaskState
from tests.cluster import LocalCluster
from tests.recording import running
from tests.waiting import wait_for_condition

# The module's cluster for the idle check is set up in the first test and torn down in
# the last: each may take longer than the default 120 s (the venv, if it must be made).
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
SCHEDULER = ROOT / "tests" / "support" / "pymesos_scheduler.py"
IDLE_SECONDS = 105.0  # the long task's length: the calls connection idles that long


def pymesos_python() -> Path:
    """The pymesos venv's Python (made on first use, as `make pymesos-venv` does)."""
    venv = Path(os.environ.get("MESOLITE_PYMESOS_VENV", ROOT / ".venv-pymesos"))
    python = venv / "bin" / "python"
    if not python.exists():
        script = ROOT / "scripts" / "pymesos_venv.py"
        subprocess.run([sys.executable, str(script), str(venv)], check=True)
    return python


def pending(agent: Agent) -> int:
    """Updates the agent still retries, unacknowledged."""
    return len(agent._reporter)


@dataclass
class Scheduler:
    """One pymesos scheduler process and everything it printed."""

    process: asyncio.subprocess.Process
    events: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, master: str, *args: str) -> Scheduler:
        process = await asyncio.create_subprocess_exec(
            str(pymesos_python()),
            str(SCHEDULER),
            "--master",
            master,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        scheduler = cls(process)
        scheduler.reader = asyncio.create_task(scheduler._read())
        return scheduler

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def states(self, task_id: str) -> list[str]:
        return [e["state"] for e in self.of("update") if e["task_id"] == task_id]

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def stop(self) -> int:
        """Tear down (pymesos' driver.stop() sends TEARDOWN) and wait for the exit."""
        if self.process.returncode is None:
            with_stdin = self.process.stdin is not None and not self.process.stdin.is_closing()
            if with_stdin:
                await self.send("stop")
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.reader is not None:
            await self.reader
        return self.process.returncode or 0


@dataclass
class IdleRun:
    cluster: LocalCluster
    scheduler: Scheduler
    started: float


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def idle(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[IdleRun]:
    """A scheduler with one task that runs IDLE_SECONDS, its offers then filtered for
    longer: nothing is said on its calls connection until the task ends."""
    async with LocalCluster(tmp_path_factory.mktemp("idle")) as cluster:
        await cluster.add_agent("cpus:2;mem:256")
        scheduler = await Scheduler.start(
            cluster.server.http_address,
            "--name", "idle", "--tasks", "1", "--cpus", "1", "--mem", "64",
            "--command", f"sleep {IDLE_SECONDS:g}", "--refuse-seconds", "1000",
        )  # fmt: skip
        try:
            await wait_for_condition(
                lambda: "TASK_RUNNING" in scheduler.states("idle-1"), timeout=60
            )
            yield IdleRun(cluster, scheduler, time.monotonic())
        finally:
            await scheduler.stop()


async def test_command_tasks_finish_reconcile_and_tear_down(tmp_path: Path, idle: IdleRun) -> None:
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
        assert idle.scheduler.process.returncode is None


async def test_pymesos_and_sdk_frameworks_reach_the_drf_split(
    tmp_path: Path, idle: IdleRun
) -> None:
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
    idle: IdleRun,
) -> None:
    scheduler, master = idle.scheduler, idle.cluster.master
    await wait_for_condition(
        lambda: "TASK_FINISHED" in scheduler.states("idle-1"),
        timeout=IDLE_SECONDS + 60,
        what="the long task's end",
    )
    idle_for = time.monotonic() - idle.started
    assert idle_for > 100
    # Its end was acknowledged on the connection that had idled all along: pymesos
    # would have raised on a closed one, and the agent would still retry the update.
    await wait_for_condition(
        lambda: pending(idle.cluster.agents[0]) == 0, timeout=10, what="acknowledged"
    )
    assert scheduler.of("disconnected") == [] and scheduler.of("reregistered") == []
    assert scheduler.of("error") == []
    assert len(scheduler.of("registered")) == 1
    heartbeats = scheduler.of("heartbeat")
    assert len(heartbeats) >= idle_for / master.config.framework_heartbeat_interval / 2
