"""An agent killed with SIGKILL and started again on its work dir, end to end: a real
master in-process, `mesolite agent` subprocesses, a framework over real gRPC."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from mesolite.agent._journal import JOURNAL_FILE, PendingUpdate, UpdateJournal
from mesolite.agent._procs import is_alive
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from tests.cluster import AgentProcess, LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.support.cgroups import TEST_CGROUPS_ROOT
from tests.support.checkpoints import checkpoint_at
from tests.support.exits import exit_record
from tests.waiting import wait_for_condition, within

HOSTNAME = "phoenix"
AGENT_RESOURCES = "cpus:2;mem:1024"


async def start_agent(cluster: LocalCluster, work_dir: Path) -> AgentProcess:
    """`mesolite agent` on `work_dir`; the cluster kills it and its tasks at the end."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / "agent.log").open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mesolite.cli",
            "agent",
            "--master",
            cluster.address,
            "--resources",
            AGENT_RESOURCES,
            "--work-dir",
            str(work_dir),
            "--hostname",
            HOSTNAME,
            "--cgroups-root",
            TEST_CGROUPS_ROOT,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
        )
    agent = AgentProcess(process, work_dir)
    cluster.agent_processes.append(agent)
    return agent


async def sigkill(agent: AgentProcess) -> None:
    agent.process.send_signal(signal.SIGKILL)
    assert await within(agent.process.wait(), 10) == -signal.SIGKILL


def connected_agent_id(cluster: LocalCluster) -> str | None:
    for agent in cluster.master.agents.values():
        if agent.hostname == HOSTNAME and agent.connected:
            return str(agent.agent_id)
    return None


async def wait_connected(cluster: LocalCluster) -> str:
    await wait_for_condition(
        lambda: connected_agent_id(cluster) is not None, what="the agent to (re-)register"
    )
    agent_id = connected_agent_id(cluster)
    assert agent_id is not None
    return agent_id


def sandbox(work_dir: Path, framework_id: str, task_id: str) -> Path:
    return work_dir / "sandboxes" / framework_id / task_id


def records(work_dir: Path, framework_id: str, task_id: str) -> Path:
    return work_dir / "meta" / framework_id / task_id


def checkpoint(work_dir: Path, framework_id: str, task_id: str) -> dict[str, Any]:
    return checkpoint_at(records(work_dir, framework_id, task_id))


def pending(work_dir: Path) -> list[PendingUpdate]:
    return UpdateJournal(work_dir / JOURNAL_FILE).load()


async def test_killed_agent_comes_back_with_its_tasks_and_their_real_ends(
    tmp_path: Path,
) -> None:
    # An agent timeout far longer than the agent is down: it is not removed meanwhile.
    async with LocalCluster(tmp_path, fast(agent_timeout=30)) as cluster:
        work_dir = tmp_path / "agent"
        first = await start_agent(cluster, work_dir)
        agent_id = await wait_connected(cluster)
        fw = RecordingFramework("restart", failover_timeout=60)
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent_id)
            await fw.launch(
                offer,
                [
                    TaskSpec("long", "sleep 60", Resources(cpus=1, mem=64)),
                    TaskSpec("short", "sleep 2; exit 3", Resources(cpus=0.5, mem=32)),
                ],
            )
            await fw.wait_state("long", TaskState.RUNNING)
            await fw.wait_state("short", TaskState.RUNNING)
            assert fw.framework_id
            long_task = checkpoint(work_dir, fw.framework_id, "long")
            short_records = records(work_dir, fw.framework_id, "short")

            def short_ended() -> bool:
                return exit_record(short_records) is not None

            await sigkill(first)
            assert not short_ended(), "the short task must end while the agent is down"
            await wait_for_condition(
                lambda: not cluster.master.agents[agent_id].connected,
                what="the master to see the agent go",
            )
            await wait_for_condition(short_ended, timeout=10, what="the short task to end")
            assert TaskState.FAILED not in fw.states("short")

            await start_agent(cluster, work_dir)
            assert await wait_connected(cluster) == agent_id
            await fw.wait_state("short", TaskState.FAILED)
            await wait_for_condition(
                lambda: pending(work_dir) == [], what="every update to be acknowledged"
            )

            [failed] = [u for u in fw.updates if u.state is TaskState.FAILED]
            assert (failed.task_id, failed.exit_code, failed.agent_id) == ("short", 3, agent_id)
            assert fw.states("short") == [TaskState.STARTING, TaskState.RUNNING, TaskState.FAILED]
            assert fw.states("long") == [TaskState.STARTING, TaskState.RUNNING]
            assert len({u.update_id for u in fw.updates}) == len(fw.updates)
            # The very process the first agent started, re-attached.
            assert is_alive(long_task["pid"], long_task["pid_start_time"])
            assert checkpoint(work_dir, fw.framework_id, "long")["pid"] == long_task["pid"]

            state = await cluster.state()
            assert [a["id"] for a in state["agents"]] == [agent_id]
            assert [(t["id"], t["state"]) for t in state["tasks"]] == [("long", "TASK_RUNNING")]
            [framework] = state["frameworks"]
            assert framework["used"] == {"cpus": 1.0, "mem": 64.0}
            offered = Resources()
            for o in state["offers"]:
                offered = offered + Resources(o["resources"])
            allocated = Resources(state["agents"][0]["allocated"])
            assert allocated - offered == Resources(cpus=1, mem=64)


async def test_updates_unacknowledged_when_the_agent_died_are_resent_with_their_ids(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path, fast(agent_timeout=30)) as cluster:
        work_dir = tmp_path / "agent"
        first = await start_agent(cluster, work_dir)
        agent_id = await wait_connected(cluster)
        fw = RecordingFramework("patient", failover_timeout=60)
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent_id)
            waiter = TaskSpec(
                "waiter",
                "while [ ! -e go ]; do sleep 0.05; done; exit 5",
                Resources(cpus=1, mem=64),
            )
            await fw.launch(offer, [waiter])
            await fw.wait_state("waiter", TaskState.RUNNING)
            await wait_for_condition(
                lambda: pending(work_dir) == [], what="STARTING and RUNNING acknowledged"
            )
        framework_id = fw.framework_id
        assert framework_id
        master_framework = cluster.master.frameworks[framework_id]

        # With the framework away, what the task reports now cannot be acknowledged.
        (sandbox(work_dir, framework_id, "waiter") / "go").touch()
        await wait_for_condition(
            lambda: "waiter" not in master_framework.tasks, what="the master to apply FAILED"
        )
        [unacknowledged] = pending(work_dir)
        assert unacknowledged.status.state is TaskState.FAILED
        await sigkill(first)
        assert pending(work_dir) == [unacknowledged]

        await start_agent(cluster, work_dir)
        assert await wait_connected(cluster) == agent_id
        await wait_for_condition(
            lambda: "waiter" not in master_framework.tasks, what="the task to be ended again"
        )
        again = RecordingFramework("patient", failover_timeout=60, framework_id=framework_id)
        async with running(again, cluster.address):
            await again.wait_state("waiter", TaskState.FAILED)
            await wait_for_condition(
                lambda: pending(work_dir) == [], what="the re-sent update to be acknowledged"
            )
        [resent] = [u for u in again.updates if u.task_id == "waiter"]
        assert resent.update_id == unacknowledged.status.update_id
        assert resent.exit_code == 5
