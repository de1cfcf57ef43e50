"""Isolation end to end (issue 12): a real master, agents with this machine's cgroups
(and one forced onto the fallback), a framework over gRPC; GET /state and /metrics
show how each agent contains its tasks and what they use; an agent killed with
SIGKILL and started again keeps its tasks in their cgroups, still limited, and kills
the cgroups no task owns."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent._cgroups import CgroupSystem, Limits, scope_name
from mesolite.agent._procs import process_start_time
from mesolite.agent.isolation import Container, IsolationConfig
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from tests.cluster import AgentProcess, LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.scraping import scrape, value
from tests.support.cgroups import leftover, remove_tree
from tests.support.checkpoints import checkpoint_at
from tests.test_isolation import CGROUPS, HOG
from tests.waiting import wait_for_condition, within

pytestmark = pytest.mark.skipif(not CGROUPS, reason="the agent cannot create cgroups here")

MEMORY = "REASON_CONTAINER_LIMITATION_MEMORY"


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    root = f"mesolite-test-isoc-{uuid.uuid4().hex[:10]}"
    yield root
    remove_tree(root)
    assert leftover(root) == []


async def test_state_and_metrics_show_limits_usage_and_isolation(
    tmp_path: Path, cgroup_root: str
) -> None:
    cgroups = IsolationConfig(cgroups_root=cgroup_root, cpu_hard_limit=True)
    fallback = IsolationConfig(mode="process-tree", cgroups_root=cgroup_root)
    async with LocalCluster(tmp_path) as cluster:
        contained = await cluster.add_agent("cpus:2;mem:512", "contained", isolation=cgroups)
        loose = await cluster.add_agent("cpus:2;mem:512", "loose", isolation=fallback)
        fw = RecordingFramework("usage")
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=contained.agent_id)
            await fw.launch(
                offer,
                [
                    TaskSpec("spin", "while :; do :; done", Resources(cpus=0.5, mem=64)),
                    TaskSpec("hog", HOG, Resources(cpus=0.5, mem=48)),
                ],
            )
            await fw.wait_state("hog", TaskState.FAILED)
            [ended] = [u for u in fw.updates if u.task_id == "hog" and u.state.is_terminal]
            assert ended.reason == MEMORY and "memory limit of 48 MB" in ended.message

            other = await fw.next_offer(agent_id=loose.agent_id)
            await fw.launch(other, [TaskSpec("free", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("spin", TaskState.RUNNING)
            await fw.wait_state("free", TaskState.RUNNING)

            def measured(state: dict[str, Any]) -> dict[str, Any] | None:
                spin = next((t for t in state["tasks"] if t["id"] == "spin"), None)
                usage = spin["usage"] if spin else None
                return usage if usage and usage["cpus_used"] > 0 else None

            state: dict[str, Any] = {}

            async def spinning() -> bool:
                state.update(await cluster.state())
                return measured(state) is not None

            for _ in range(200):
                if await spinning():
                    break
                await asyncio.sleep(0.1)
            usage = measured(state)
            assert usage is not None, state["tasks"]
            assert 0 < usage["cpus_used"] <= 0.5 * 1.5  # its quota, with a sample's jitter
            assert usage["mem_used_mb"] > 0 and usage["processes"] >= 1
            agents = {a["hostname"]: a for a in state["agents"]}
            assert (agents["contained"]["isolation"], agents["contained"]["task_user"]) == (
                "cgroups-v1" if _v1() else "cgroups-v2",
                "nobody",
            )
            assert agents["contained"]["usage"]["cpus"] > 0
            assert agents["contained"]["used"] == {"cpus": 0.5, "mem": 64.0}
            assert agents["loose"]["isolation"] == "process-tree"
            assert agents["loose"]["usage"] == {}
            [free] = [t for t in state["tasks"] if t["id"] == "free"]
            assert free["usage"] is None
            [hog] = [t for t in state["completed_tasks"] if t["id"] == "hog"]
            assert hog["reason"] == MEMORY

            samples = await scrape(cluster.server.http_address)
            assert value(samples, "mesolite_task_usage", task_id="spin", resource="mem") > 0
            assert value(samples, "mesolite_agents_by_isolation", isolation="process-tree") == 1


def _v1() -> bool:
    return CgroupSystem.open(f"probe-{uuid.uuid4().hex[:6]}", Path("/p")).version == 1


# Restarts, with `mesolite agent` in its own process.

HOSTNAME = "phoenix"


async def start_agent(cluster: LocalCluster, work_dir: Path, root: str) -> AgentProcess:
    work_dir.mkdir(parents=True, exist_ok=True)
    with (work_dir / "agent.log").open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "mesolite.cli", "agent", "--master", cluster.address),
            *("--resources", "cpus:2;mem:1024", "--work-dir", str(work_dir)),
            *("--hostname", HOSTNAME, "--cgroups-root", root, "--pids-limit", "64"),
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
        )
    agent = AgentProcess(process, work_dir)
    cluster.agent_processes.append(agent)
    return agent


async def started(
    cluster: LocalCluster, work_dir: Path, root: str, framework: str
) -> tuple[AgentProcess, str, RecordingFramework]:
    """An agent process on `work_dir`, registered, and a framework (not yet running)."""
    agent = await start_agent(cluster, work_dir, root)
    return agent, await wait_connected(cluster), RecordingFramework(framework, failover_timeout=60)


async def wait_connected(cluster: LocalCluster) -> str:
    def connected() -> str | None:
        return next((a.agent_id for a in cluster.master.agents.values() if a.connected), None)

    await wait_for_condition(lambda: connected() is not None, what="the agent to register")
    agent_id = connected()
    assert agent_id is not None
    return agent_id


def container(work_dir: Path, framework_id: str, task_id: str) -> tuple[Container, dict[str, Any]]:
    record = checkpoint_at(work_dir / "meta" / framework_id / task_id)
    return Container.from_record(record["container"]), record


def stray_cgroup(work_dir: Path, root: str) -> tuple[Any, subprocess.Popen[bytes]]:
    """A cgroup in the agent's scope with a live process, that no checkpoint names."""
    system = CgroupSystem.open(root, work_dir)
    cgroup = system.create("stray", Limits(64, 0.1, False, None))
    paths = [str(p / "cgroup.procs") for p in cgroup.paths]
    join = "; ".join(f"echo $$ > {p}" for p in paths)
    process = subprocess.Popen(["sh", "-c", f"{join}; exec sleep 60"])
    return cgroup, process


async def test_a_restarted_agent_keeps_its_tasks_limited_and_kills_stray_cgroups(
    tmp_path: Path, cgroup_root: str
) -> None:
    async with LocalCluster(tmp_path, fast(agent_timeout=30)) as cluster:
        work_dir = tmp_path / "agent"
        first, agent_id, fw = await started(cluster, work_dir, cgroup_root, "limited")
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent_id)
            waiter = f"while [ ! -e go ]; do sleep 0.05; done; {HOG}"
            await fw.launch(offer, [TaskSpec("limited", waiter, Resources(cpus=0.5, mem=48))])
            await fw.wait_state("limited", TaskState.RUNNING)
            assert fw.framework_id
            before, record = container(work_dir, fw.framework_id, "limited")
            assert before.cgroup is not None
            # The waiting shell (its sleeps come and go).
            in_cgroup = before.cgroup.pids()
            assert in_cgroup

            first.process.send_signal(signal.SIGKILL)
            assert await within(first.process.wait(), 10) == -signal.SIGKILL
            # The task runs on in its cgroup without the agent.
            assert before.cgroup.pids() & in_cgroup
            stray, stray_process = stray_cgroup(work_dir, cgroup_root)
            try:
                await start_agent(cluster, work_dir, cgroup_root)
                assert await wait_connected(cluster) == agent_id
                # The stray cgroup's process is killed and the cgroup removed...
                await within(asyncio.to_thread(stray_process.wait), 10, "the stray process")
                await wait_for_condition(lambda: not stray.exists(), what="the stray cgroup")
            finally:
                if stray_process.poll() is None:
                    stray_process.kill()
                    stray_process.wait()
            # ...while the task, re-attached, is still in its own, still limited.
            after, again = container(work_dir, fw.framework_id, "limited")
            assert after == before and again["pid"] == record["pid"]
            assert process_start_time(record["pid"]) == record["pid_start_time"]
            assert after.cgroup is not None and after.cgroup.pids() & in_cgroup

            (work_dir / "sandboxes" / fw.framework_id / "limited" / "go").touch()
            await fw.wait_state("limited", TaskState.FAILED)
            [end] = [u for u in fw.updates if u.task_id == "limited" and u.state.is_terminal]
            assert end.reason == MEMORY, end
            gone = after.cgroup
            await wait_for_condition(lambda: not gone.exists(), what="its cgroup to go")
            second = cluster.agent_processes[-1]
            second.process.send_signal(signal.SIGTERM)  # a clean stop removes its scope
            assert await within(second.process.wait(), 20) == 0
    assert not any(p.name == scope_name(work_dir) for p in leftover(cgroup_root))


async def test_an_agent_that_lost_its_id_kills_what_its_predecessor_left(
    tmp_path: Path, cgroup_root: str
) -> None:
    async with LocalCluster(tmp_path, fast(agent_timeout=30)) as cluster:
        work_dir = tmp_path / "agent"
        first, agent_id, fw = await started(cluster, work_dir, cgroup_root, "doomed")
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent_id)
            escape = "setsid sh -c 'echo $$ > escaped; exec sleep 60' & sleep 60"
            await fw.launch(offer, [TaskSpec("doomed", escape, Resources(cpus=0.5, mem=64))])
            await fw.wait_state("doomed", TaskState.RUNNING)
            assert fw.framework_id
            sandbox = work_dir / "sandboxes" / fw.framework_id / "doomed"
            await wait_for_condition(
                lambda: (sandbox / "escaped").exists() and bool((sandbox / "escaped").read_text()),
                what="the escaped child",
            )
            escaped = int((sandbox / "escaped").read_text())
            doomed, _ = container(work_dir, fw.framework_id, "doomed")

            first.process.send_signal(signal.SIGKILL)
            await within(first.process.wait(), 10)
            os.unlink(work_dir / "agent.json")  # its id is gone: it must start afresh
            await start_agent(cluster, work_dir, cgroup_root)
            await wait_for_condition(
                lambda: process_start_time(escaped) is None, what="the escaped child to die"
            )
            cgroup = doomed.cgroup
            assert cgroup is not None
            await wait_for_condition(lambda: not cgroup.exists(), what="its cgroup")
