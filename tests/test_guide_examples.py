"""The framework guide's two worked patterns (docs/framework-guide.md), run as a reader
would run them: the scripts in examples/, as processes, against a real local cluster.

- examples/retrying_batch.py: 20 indexes, 6 at a time, an injected failure retried; and
  an index that keeps failing, given up after its retries.
- examples/keep_running.py: 3 instances; one killed by hand is replaced; the service
  killed with SIGKILL and started again with its id file takes its instances back and
  launches none twice; SIGUSR1 tears it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from mesolite.framework_sdk import TaskState
from mesolite.master.state import TaskRecord
from tests.cluster import AgentProcess, LocalCluster
from tests.waiting import wait_for_condition, within

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Script:
    """An example running as a process; its stdout read line by line as it comes."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self.lines: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, name: str, log: Path, *args: str) -> Script:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / name),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=log.open("ab"),  # the SDK's log lines
        )
        return cls(process, log)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.lines.append(line.decode().rstrip("\n"))

    def said(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]

    async def wait_said(self, text: str, timeout: float = 30.0) -> None:
        await wait_for_condition(
            lambda: bool(self.said(text)) or self._reader.done(),
            timeout,
            f"{text!r} in {self.lines}",
        )
        assert self.said(text), f"{text!r} never came: {self.lines}\n{self.log.read_text()}"

    async def exit_status(self, timeout: float = 60.0) -> int:
        status = await within(self.process.wait(), timeout, "the script to exit")
        await within(self._reader, what="its output")
        return status

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        with contextlib.suppress(Exception):
            await self._reader


@contextlib.asynccontextmanager
async def cluster_with_agent(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, AgentProcess]]:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.spawn_agent("cpus:4;mem:2048;disk:0")  # room for 40 tasks
        yield cluster, agent


def framework_tasks(cluster: LocalCluster, name: str) -> dict[str, TaskRecord]:
    frameworks = [f for f in cluster.master.frameworks.values() if f.info.name == name]
    return dict(frameworks[0].tasks) if frameworks else {}


async def test_the_retrying_batch_retries_a_failed_index_and_completes(tmp_path: Path) -> None:
    async with cluster_with_agent(tmp_path) as (cluster, _):
        # Index 7 fails its first attempt; every task takes a moment, so six overlap.
        command = 'sleep 0.5; [ "$TASK_INDEX" != 7 ] || [ "$TASK_ATTEMPT" -gt 1 ]'
        script = await Script.start(
            "retrying_batch.py",
            tmp_path / "batch.log",
            *("--master", cluster.address, "--command", command),
        )
        most = 0
        try:
            while script.process.returncode is None:
                most = max(most, len(framework_tasks(cluster, "sweep")))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(script.process.wait()), 0.01)
            assert await script.exit_status() == 0, script.lines
        finally:
            await script.kill()
        assert script.said("index 7 attempt 1 ended TASK_FAILED (exit 1)")
        assert script.said("index 7 succeeded (attempt 2)")
        assert len(script.said("succeeded (attempt")) == 20
        assert script.lines[-1] == "done: 20 succeeded, 0 failed"
        assert most == 6, f"at most {most} tasks at once, not the 6 asked for"
        await wait_for_condition(lambda: not cluster.master.frameworks, what="torn down")


async def test_the_retrying_batch_gives_an_index_up_after_its_retries(tmp_path: Path) -> None:
    async with cluster_with_agent(tmp_path) as (cluster, _):
        script = await Script.start(
            "retrying_batch.py",
            tmp_path / "batch.log",
            *("--master", cluster.address, "--completions", "4", "--retries", "1"),
            *("--command", '[ "$TASK_INDEX" != 2 ]'),
        )
        try:
            assert await script.exit_status() == 1, script.lines
        finally:
            await script.kill()
        assert len(script.said("index 2 attempt")) == 1
        assert script.said("index 2 failed after 2 attempts")
        assert script.lines[-1] == "done: 3 succeeded, 1 failed"


async def test_the_service_heals_and_survives_its_own_crash(tmp_path: Path) -> None:
    async with cluster_with_agent(tmp_path) as (cluster, agent):
        id_file = tmp_path / "service.id"
        args = ("--master", cluster.address, "--id-file", str(id_file), "--command", "sleep 600")
        service = await Script.start("keep_running.py", tmp_path / "service.log", *args)
        again: Script | None = None
        try:

            def running() -> list[str]:
                tasks = framework_tasks(cluster, "service")
                return sorted(t for t, r in tasks.items() if r.state is TaskState.RUNNING)

            await wait_for_condition(lambda: len(running()) == 3, what="3 instances running")
            await wait_for_condition(lambda: len(agent.task_pids()) == 3, what="3 processes")

            # An instance killed by hand is replaced.
            before = running()
            os.killpg(agent.task_pids()[0], signal.SIGKILL)
            await service.wait_said("ended TASK_FAILED")
            await wait_for_condition(
                lambda: len(running()) == 3 and running() != before, what="a replacement"
            )
            assert len(service.said("launched")) == 4

            # The service dies for good (SIGKILL) and starts again with its id file: it
            # hears of its 3 instances first, and launches none.
            instances = running()
            await wait_for_condition(lambda: len(agent.task_pids()) == 3, what="3 processes")
            pids = sorted(agent.task_pids())
            await service.kill()
            again = await Script.start("keep_running.py", tmp_path / "service.log", *args)
            await again.wait_said("steady: 3 of 3 live")
            assert again.said("launched") == [], again.lines
            assert running() == instances
            assert len(framework_tasks(cluster, "service")) == 3
            assert sorted(agent.task_pids()) == pids  # the same processes

            # SIGUSR1: torn down, its instances killed, its id file gone.
            again.process.send_signal(signal.SIGUSR1)
            assert await again.exit_status() == 0
            await wait_for_condition(lambda: not cluster.master.frameworks, what="torn down")
            await wait_for_condition(lambda: not agent.task_pids(), what="instances killed")
            assert not id_file.exists()
        finally:
            await service.kill()
            if again is not None:
                await again.kill()
