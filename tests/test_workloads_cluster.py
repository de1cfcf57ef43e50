"""The built-in jobs and services on a real local cluster: `mesolite run` (a subprocess)
submits the committed example files to a master whose built-in frameworks run beside it,
over real gRPC, on agents running real processes.

What each test checks independently of the built-in frameworks' own bookkeeping: the
master's count of a framework's live tasks after every launch (`LaunchProbe`), and the
agents' records on disk (each task's sandbox and exit status, its live processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from mesolite.certs import init_cluster
from tests.cluster import LocalCluster, fast
from tests.support.checkpoints import all_checkpoints
from tests.support.exits import exit_record
from tests.waiting import wait_for_condition

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "examples" / "sweep.toml"
TICKER = ROOT / "examples" / "ticker.toml"
AGENT = "cpus:4;mem:4096;disk:0"


async def mesolite(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`mesolite ARGS` as a subprocess (never blocking the loop the master runs on)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesolite.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


class LaunchProbe:
    """Wraps the master's `accept`: after every launch, the number of tasks the master
    counts live for each framework (launched and not yet ended), and every task id
    launched. The master counts a task live until it applies its end, and forwards the
    end only after, so this is never below what the framework could know."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.most: dict[str, int] = {}
        self.launched: dict[str, list[str]] = {}
        master = cluster.master
        accept = master.accept

        def probed(framework_id: str, offer_ids: Any, tasks: Any, refuse: Any) -> None:
            accept(framework_id, offer_ids, tasks, refuse)
            live = len(master.frameworks[framework_id].tasks)
            self.most[framework_id] = max(self.most.get(framework_id, 0), live)
            self.launched.setdefault(framework_id, []).extend(t.task_id for t in tasks)

        master.accept = probed


async def state_of(cluster: LocalCluster) -> dict[str, Any]:
    return await cluster.state()


async def wait_state(
    cluster: LocalCluster,
    predicate: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 60,
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal found
        found = await cluster.state()
        return predicate(found)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {found}")
        await asyncio.sleep(0.1)
    return found


def workload(state: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((w for w in state[kind] if w["name"] == name), None)


def framework_named(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((f for f in state["frameworks"] if f["name"] == name), None)


def tasks_of(state: dict[str, Any], framework_id: str) -> list[dict[str, Any]]:
    return [t for t in state["tasks"] if t["framework_id"] == framework_id]


def ran(agent_dir: Path, framework_id: str) -> dict[str, dict[str, Any]]:
    """Every task of the framework that ran on the agent: its exit record and stdout."""
    out = {}
    for record in sorted(all_checkpoints(agent_dir), key=lambda r: str(r["task"]["task_id"])):
        if record["framework_id"] != framework_id:
            continue
        task_id = record["task"]["task_id"]
        stdout = agent_dir / "sandboxes" / framework_id / task_id / "stdout"
        out[task_id] = {
            "exit": exit_record(agent_dir / "meta" / framework_id / task_id),
            "stdout": stdout.read_text() if stdout.exists() else "",
        }
    return out


def command_of(record: dict[str, Any]) -> int:
    """The command of a task's checkpoint: the process itself when the supervisor spawned
    it, else its wrapper's child."""
    pid = record["pid"]
    assert isinstance(pid, int)
    return pid if record.get("launcher") == "spawn" else command_pid(pid)


def command_pid(wrapper_pid: int) -> int:
    """The command a task wrapper runs: its child."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == wrapper_pid:
                return int(entry.name)
    raise AssertionError(f"task wrapper {wrapper_pid} has no command running")


async def test_the_sweep_job_runs_20_indices_6_at_a_time_and_retries_the_failed_one(
    tmp_path: Path,
) -> None:
    """examples/sweep.toml: 20 indices, at most 6 at once; index 7 fails its first try
    and is retried; the job completes, `mesolite jobs` says so, and its framework is
    torn down."""
    async with LocalCluster(tmp_path, workloads=True) as cluster:
        await cluster.add_agent(AGENT)  # room for 40 tasks of 0.1 CPU: parallelism binds
        probe = LaunchProbe(cluster)
        http = cluster.server.http_address
        code, out = await mesolite("run", str(SWEEP), "--master", http)
        assert code == 0, out
        assert "submitted job 'sweep': 20 indices, 6 at a time, 2 retries per index" in out

        state = await wait_state(
            cluster,
            lambda s: (j := workload(s, "jobs", "sweep")) is not None and j["status"] != "active",
            "the sweep to finish",
        )
        job = workload(state, "jobs", "sweep")
        assert job is not None
        assert job["status"] == "completed", job
        assert (job["succeeded"], job["failed"], job["retried"]) == (20, 0, 1), job
        [framework_id] = probe.launched
        assert job["framework_id"] == framework_id
        assert probe.most[framework_id] == 6, "parallelism: 6 at once, never more"
        assert len(probe.launched[framework_id]) == 21

        # What the agent ran: every index once, index 7 twice (failed, then fine).
        tasks = ran(tmp_path / "agent1", framework_id)
        assert len(tasks) == 21
        by_index: dict[int, list[dict[str, Any]]] = {}
        for task_id, task in tasks.items():
            by_index.setdefault(int(task_id.split(".")[1]), []).append(task)
        assert sorted(by_index) == list(range(20))
        for index, runs in by_index.items():
            exits = sorted(r["exit"]["exit_code"] for r in runs)
            assert exits == ([0, 1] if index == 7 else [0]), (index, runs)
        outputs = "".join(r["stdout"] for r in by_index[7])
        assert "point 7, try 0: f(7) = 49" in outputs and "point 7, try 1" in outputs

        await wait_state(
            cluster, lambda s: framework_named(s, "job:sweep") is None, "its framework gone"
        )
        code, out = await mesolite("jobs", "--master", http)
        assert code == 0, out
        [row] = [line for line in out.splitlines() if line.startswith("sweep")]
        assert row.split()[:5] == ["sweep", "*", "completed", "20/20", "0"], row


async def test_a_job_index_that_always_fails_runs_retries_plus_one_times(tmp_path: Path) -> None:
    """Index 0 always exits 3: it runs exactly 3 times (retries = 2), the job fails
    and says which index; index 1 still completes."""
    job = tmp_path / "flaky.toml"
    job.write_text(
        "[job]\n"
        'name = "flaky"\n'
        "completions = 2\n"
        "parallelism = 2\n"
        "retries = 2\n"
        "resources = { cpus = 0.1, mem = 32 }\n"
        "command = 'if [ \"$MESOLITE_JOB_INDEX\" = 0 ]; then exit 3; fi'\n"
    )
    async with LocalCluster(tmp_path, workloads=True) as cluster:
        await cluster.add_agent(AGENT)
        probe = LaunchProbe(cluster)
        code, out = await mesolite("run", str(job), "--master", cluster.server.http_address)
        assert code == 0, out

        def finished(s: dict[str, Any]) -> bool:
            tries = [t for ids in probe.launched.values() for t in ids if t.startswith("flaky.0.")]
            assert len(tries) <= 3, f"index 0 launched {len(tries)} times: retried forever?"
            return (j := workload(s, "jobs", "flaky")) is not None and j["status"] != "active"

        state = await wait_state(cluster, finished, "the job to finish")
        result = workload(state, "jobs", "flaky")
        assert result is not None
        assert result["status"] == "failed"
        assert (result["succeeded"], result["failed"], result["failed_indices"]) == (1, 1, [0])
        [framework_id] = probe.launched
        runs = ran(tmp_path / "agent1", framework_id)
        index0 = [r["exit"]["exit_code"] for t, r in runs.items() if t.startswith("flaky.0.")]
        assert index0 == [3, 3, 3]
        code, out = await mesolite("jobs", "--master", cluster.server.http_address)
        assert "failed indices 0" in out, out


async def test_the_ticker_service_replaces_a_killed_instance_and_survives_its_restart(
    tmp_path: Path,
) -> None:
    """examples/ticker.toml keeps 3 instances: one whose process is killed by hand is
    replaced; the built-in frameworks restarted (from their store alone) find the 3 live
    instances and launch none; `mesolite stop` ends it, processes and all."""
    async with LocalCluster(tmp_path, workloads=True) as cluster:
        agent = await cluster.spawn_agent(AGENT)
        probe = LaunchProbe(cluster)
        http = cluster.server.http_address
        code, out = await mesolite("run", str(TICKER), "--master", http)
        assert code == 0, out

        def running(s: dict[str, Any]) -> list[str]:
            f = framework_named(s, "service:ticker")
            return (
                sorted(t["id"] for t in tasks_of(s, f["id"]) if t["state"] == "TASK_RUNNING")
                if f
                else []
            )

        state = await wait_state(cluster, lambda s: len(running(s)) == 3, "3 instances")
        first = running(state)
        framework_id = framework_named(state, "service:ticker")["id"]  # type: ignore[index]
        await wait_for_condition(lambda: len(agent.task_pids()) == 3, what="3 processes")

        # An instance's process killed by hand is replaced.
        victim = first[1]
        [record] = [r for r in agent.checkpoints() if r["task"]["task_id"] == victim]
        os.kill(command_of(record), signal.SIGKILL)
        state = await wait_state(
            cluster,
            lambda s: len(running(s)) == 3 and victim not in running(s),
            "the killed instance replaced",
        )
        second = running(state)
        assert set(first) - {victim} < set(second)
        service = workload(state, "services", "ticker")
        assert service is not None and service["restarts"] == 1, service
        assert probe.most[framework_id] == 3
        await wait_for_condition(lambda: len(agent.task_pids()) == 3, what="3 processes")
        pids = sorted(agent.task_pids())

        # The built-in frameworks restart from the store: same framework, same 3 tasks.
        launched = len(probe.launched[framework_id])
        await cluster.restart_workloads()
        await wait_for_condition(
            lambda: (f := cluster.workload_framework("ticker")) is not None and f.reconciled,
            what="the service's framework back and reconciled",
        )
        # Reconciled and wanting nothing more, it suppresses its offers: then we look.
        await wait_for_condition(
            lambda: cluster.master.frameworks[framework_id].suppressed,
            what="the service's framework to settle",
        )
        state = await state_of(cluster)
        assert running(state) == second
        assert len(probe.launched[framework_id]) == launched, "nothing launched again"
        assert sorted(agent.task_pids()) == pids
        assert len(tasks_of(state, framework_id)) == 3

        code, out = await mesolite("services", "--master", http)
        [row] = [line for line in out.splitlines() if line.startswith("ticker")]
        assert row.split()[:7] == ["ticker", "*", "active", "3/3", "0", "0", "1"], row

        code, out = await mesolite("stop", "ticker", "--master", http)
        assert code == 0 and "stopped service 'ticker'" in out, out
        await wait_state(
            cluster, lambda s: framework_named(s, "service:ticker") is None, "its framework gone"
        )
        await wait_for_condition(lambda: agent.task_pids() == [], what="its processes gone")
        state = await state_of(cluster)
        assert workload(state, "services", "ticker")["status"] == "stopped"  # type: ignore[index]


async def test_a_bad_file_is_refused_with_its_line_and_changes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.read_text().replace("parallelism = 6", "parallelism = 0"))
    async with LocalCluster(tmp_path, workloads=True) as cluster:
        http = cluster.server.http_address
        code, out = await mesolite("run", str(bad), "--master", http)
        assert code == 2
        assert f"{bad}:9: parallelism must be a whole number from 1 to 1000, got 0" in out
        # The master makes the same checks, for a client that skips them.
        url = f"http://{http}/workloads"
        async with aiohttp.ClientSession() as session:
            body = {"source": "x.toml", "text": bad.read_text()}
            async with session.post(url, json=body) as response:
                assert response.status == 400
                assert "x.toml:9: parallelism" in await response.text()
            body = {"source": "x\n\x1b[31mforged", "text": bad.read_text()}
            async with session.post(url, json=body) as response:
                assert "x??[31mforged:9: parallelism" in await response.text()
            async with session.post(url, data=SWEEP.read_text()) as response:
                assert response.status == 415  # not JSON: no cross-site form posts
            async with session.post(url, json={"text": "x" * 300_000}) as response:
                assert response.status == 413
        state = await state_of(cluster)
        assert state["jobs"] == [] and state["services"] == [] and state["frameworks"] == []
        code, out = await mesolite("stop", "nothing", "--master", http)
        assert code == 1 and "no workload named 'nothing'" in out


ACLS = {
    "register_frameworks": [
        {"principals": {"values": ["workloads"]}, "roles": {"type": "ANY"}},
        {"principals": {"values": ["team-a"]}, "roles": {"values": ["a"]}},
        {"principals": {"values": ["team-b"]}, "roles": {"values": ["b"]}},
    ],
    "register_agents": [{"principals": {"values": ["agent"]}}],
    "view_state": [{"principals": {"type": "ANY"}}],
}


async def test_who_may_run_and_stop_a_workload_is_the_acls_say(tmp_path: Path) -> None:
    """With TLS: a principal submits in the roles it may register frameworks in; the
    built-in frameworks run as `workloads`; only the owner (or whom the ACLs let end
    its frameworks) stops it; an anonymous client is refused."""
    certs = tmp_path / "certs"
    init_cluster(certs, principals=["team-a", "team-b", "admin"])
    acls = tmp_path / "acls.json"
    acls.write_text(json.dumps(ACLS))
    job = tmp_path / "one.toml"
    job.write_text(
        '[job]\nname = "one"\nrole = "a"\ncompletions = 2\nparallelism = 2\n'
        "resources = { cpus = 0.1, mem = 32 }\ncommand = 'true'\n"
    )
    async with LocalCluster(tmp_path, fast(acls_file=acls), certs=certs, workloads=True) as cluster:
        await cluster.add_agent(AGENT)
        http = cluster.server.http_address

        def as_(who: str) -> tuple[str, ...]:
            return ("--master", http, "--tls-dir", str(certs / who))

        code, out = await mesolite("run", str(job), *as_("team-b"))
        assert (
            code == 1 and "refused by the master's ACLs" in out and "register_frameworks" in out
        ), out
        code, out = await mesolite("run", str(job), "--master", http, "--ca", str(certs / "ca.crt"))
        assert code == 1 and "wants a principal" in out, out
        code, out = await mesolite("run", str(job), *as_("team-a"))
        assert code == 0, out
        state = await wait_state(
            cluster,
            lambda s: (j := workload(s, "jobs", "one")) is not None and j["status"] != "active",
            "the job to finish",
        )
        assert workload(state, "jobs", "one")["status"] == "completed"  # type: ignore[index]
        assert workload(state, "jobs", "one")["owner"] == "team-a"  # type: ignore[index]
        assert cluster.master.invariant_violations == []

        # A service owned by team-a: team-b may not stop it; team-a may.
        service = tmp_path / "svc.toml"
        service.write_text(
            '[service]\nname = "svc"\nrole = "a"\ninstances = 1\n'
            "resources = { cpus = 0.1, mem = 32 }\ncommand = 'sleep 300'\n"
        )
        code, out = await mesolite("run", str(service), *as_("team-a"))
        assert code == 0, out
        await wait_state(
            cluster,
            lambda s: (w := workload(s, "services", "svc")) is not None and w["running"] == 1,
            "the service running",
        )
        code, out = await mesolite("stop", "svc", *as_("team-b"))
        assert code == 1 and "refused by the master's ACLs" in out, out
        code, out = await mesolite("stop", "svc", *as_("team-a"))
        assert code == 0, out
        await wait_state(
            cluster, lambda s: s["tasks"] == [] and s["frameworks"] == [], "the service gone"
        )
