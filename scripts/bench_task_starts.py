"""How many real tasks an agent starts and ends per second: the task runner alone, and a
whole local cluster end to end.

    python scripts/bench_task_starts.py runner [--tasks 1000] [--window 100]
        [--isolation auto|process-tree] [--command true]
    python scripts/bench_task_starts.py cluster [--tasks 1000] [--agents 2]
        [--agent-resources "cpus:16;mem:16384"] [--command true]
    python scripts/bench_task_starts.py compare --checkouts A B [--rounds 5] -- PART [ARGS]

``runner``: one agent's task runner (no master, no network, every guarantee of a real
agent: sandbox, records, checkpoints, cgroup or fallback, the task user when run as
root, the exit status recorded) launches `--tasks` tasks, at most `--window` at once,
and counts tasks per second from the first launch to the last end reported, with the
median and 90th percentile of launch to TASK_RUNNING and launch to the end, and the
CPU seconds this process (the agent) used per task.

``cluster``: a master and `--agents` agents as processes (`mesolite master`,
`mesolite agent`), and in this process a greedy batch framework (`examples/batch.py`,
as many tasks per offer as fit, cpus 0.1 and mem 32 each) that runs `--tasks` tasks;
tasks per second from subscription to the last end, and the CPU seconds each process
used: the master, each agent, the agents' supervisors (with their keepers) and, reaped
by them, the task commands (and wrappers), and the framework, and all of them together.

Which code runs is whatever `mesolite` imports as (PYTHONPATH): run the same script
against two checkouts to compare them. ``compare`` does that: it runs PART (runner or
cluster, with ARGS) once per checkout per round, alternating A B A B..., each a process
of its own with PYTHONPATH set to the checkout, and prints every run's figures and
their medians per checkout. ``--json`` prints a run's figures as one JSON line. Needs
root for cgroups and the task user; cleans up its work dirs and cgroups.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_isolation import Timings, remove_cgroups  # this directory's

import mesolite
from mesolite import logs
from mesolite.agent.isolation import IsolationConfig, Isolator
from mesolite.agent.tasks import TaskRunner, TaskTransition
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources

ROOT = Path(__file__).resolve().parent.parent


def quantiles(values: list[float]) -> str:
    """Median / p90 in milliseconds."""
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):.1f} / {statistics.quantiles(ms, n=10)[-1]:.1f}"


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def children_cpu(runner: TaskRunner) -> tuple[float, float]:
    """CPU seconds so far of (the supervisor, the task wrappers and their commands): with
    a supervisor, its own and its reaped descendants'; without (the wrappers are this
    process's children), none and this process's reaped children's."""
    supervisor = getattr(runner, "supervisor_pid", None)
    if supervisor is None:
        return 0.0, cpu_seconds(resource.RUSAGE_CHILDREN)
    fields = Path(f"/proc/{supervisor}/stat").read_bytes().rsplit(b")", 1)[1].split()
    own, reaped = (int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]))
    tick = os.sysconf("SC_CLK_TCK")
    return own / tick, reaped / tick


class Ends(Timings):
    """`Timings`, and why each task that did not finish ended as it did."""

    def __init__(self) -> None:
        super().__init__()
        self.why: dict[str, str] = {}

    def __call__(self, t: TaskTransition) -> None:
        super().__call__(t)
        if t.state.is_terminal and t.state is not TaskState.FINISHED:
            self.why[t.task_id] = f"{t.state.value}: {t.message}"


async def bench_runner(args: argparse.Namespace) -> int:
    root = f"mesolite-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="mesolite-bench-"))
    timings = Ends()
    isolator = Isolator(
        IsolationConfig(mode=args.isolation, cgroups_root=root), work, announce=False
    )
    runner = TaskRunner(work, timings, isolator=isolator)
    resources = Resources(cpus=0.1, mem=32)
    try:
        # Warm-up: the first task pays for what is set up once.
        timings.launched["warm-up"] = time.perf_counter()
        runner.launch("bench", TaskSpec("warm-up", args.command, resources))
        while "warm-up" not in timings.ended:
            timings.done.clear()
            await timings.done.wait()
        ids = [f"t{i}" for i in range(args.tasks)]
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        cpu_before, children_before = cpu_seconds(), children_cpu(runner)
        started = time.perf_counter()
        for i, task_id in enumerate(ids):
            while i - len(timings.ended) + 1 >= args.window:
                timings.done.clear()
                await timings.done.wait()
            timings.launched[task_id] = time.perf_counter()
            runner.launch("bench", TaskSpec(task_id, args.command, resources))
        while len(timings.ended) < args.tasks + 1:
            timings.done.clear()
            await timings.done.wait()
        wall = time.perf_counter() - started
        cpu = cpu_seconds() - cpu_before
        usage = resource.getrusage(resource.RUSAGE_SELF)
        user, system = (
            usage.ru_utime - usage_before.ru_utime,
            usage.ru_stime - usage_before.ru_stime,
        )
        after = children_cpu(runner)
        supervisor, children = (a - b for a, b in zip(after, children_before, strict=True))
        bad = sum(timings.states[i] is not TaskState.FINISHED for i in ids)
        to_running = [timings.running[i] - timings.launched[i] for i in ids if i in timings.running]
        to_end = [timings.ended[i] - timings.launched[i] for i in ids]
        figures = {
            "tasks_per_s": args.tasks / wall,
            "to_running_ms_median": statistics.median(to_running) * 1000 if to_running else None,
            "to_end_ms_median": statistics.median(to_end) * 1000,
            "cpu_ms_per_task": {
                "agent": cpu / args.tasks * 1000,
                "supervisor": supervisor / args.tasks * 1000,
                "commands": children / args.tasks * 1000,
                "all": (cpu + supervisor + children) / args.tasks * 1000,
            },
            "load": os.getloadavg()[0],
        }
        if args.json:
            print(json.dumps(figures))
            return 0 if not bad else 1
        print(
            f"runner: {args.tasks} x `{args.command}`, at most {args.window} at once, "
            f"{isolator.mode.value}, as {isolator.task_user_name}; "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        print(f"  tasks/s                      {args.tasks / wall:8.1f}   ({wall:.2f} s)")
        print(f"  launch to RUNNING, ms        {quantiles(to_running)}")
        print(f"  launch to end reported, ms   {quantiles(to_end)}")
        print(
            f"  agent CPU per task, ms       {cpu / args.tasks * 1000:8.2f}"
            f"   (user {user / args.tasks * 1000:.2f}, system {system / args.tasks * 1000:.2f})"
        )
        print(f"  supervisor CPU per task, ms  {supervisor / args.tasks * 1000:8.2f}")
        print(f"  wrappers and commands, ms    {children / args.tasks * 1000:8.2f}")
        print(f"  all of them, ms per task     {figures['cpu_ms_per_task']['all']:8.2f}")
        if bad:
            print(f"  {bad} tasks did not finish, e.g. {sorted(set(timings.why.values()))[:3]}")
            return 1
    finally:
        await runner.shutdown()
        runner.close()
        remove_cgroups(root)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def process_cpu(pid: int) -> float:
    """CPU seconds of a live process (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_cluster(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from examples.batch import BatchFramework, BatchSpec

    root = f"mesolite-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="mesolite-bench-"))
    port, http_port = free_port(), free_port()
    processes: dict[str, asyncio.subprocess.Process] = {}
    python = [sys.executable, "-m", "mesolite.cli"]
    try:
        master_log = (work / "master.log").open("wb")
        processes["master"] = master = await asyncio.create_subprocess_exec(
            *python,
            "master",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--work-dir",
            str(work / "master"),
            stdout=asyncio.subprocess.PIPE,
            stderr=master_log,
            cwd=work,  # `-m` puts the working directory first on sys.path: not a checkout
        )
        assert master.stdout is not None
        line = await asyncio.wait_for(master.stdout.readline(), 60)
        if b"listening on" not in line:
            print(f"the master did not start: {line!r}")
            return 2
        address = f"127.0.0.1:{port}"
        for i in range(args.agents):
            agent_dir = work / f"agent-{i}"
            agent_dir.mkdir()
            processes[f"agent-{i}"] = await asyncio.create_subprocess_exec(
                *python,
                "agent",
                "--master",
                address,
                "--resources",
                args.agent_resources,
                "--work-dir",
                str(agent_dir),
                "--hostname",
                f"bench-{i}",
                "--cgroups-root",
                root,
                stdout=(agent_dir / "agent.log").open("wb"),
                stderr=asyncio.subprocess.STDOUT,
                cwd=work,
            )
        await wait_for_agents(http_port, args.agents)
        spec = BatchSpec(
            name="bench",
            cpus=0.1,
            mem=32,
            tasks=args.tasks,
            command=args.command,
            tasks_per_offer=0,
        )
        framework = BatchFramework(spec, out=lambda line: None)
        cpu_before = {name: process_cpu(p.pid) for name, p in processes.items()}
        agent_dirs = [work / f"agent-{i}" for i in range(args.agents)]
        supervisors_before = supervisors_cpu(agent_dirs)
        own_before, started = cpu_seconds(), time.perf_counter()
        await asyncio.wait_for(framework.run(address), args.timeout)
        wall = time.perf_counter() - started
        cpu = {name: process_cpu(p.pid) - cpu_before[name] for name, p in processes.items()}
        own, reaped = (
            a - b for a, b in zip(supervisors_cpu(agent_dirs), supervisors_before, strict=True)
        )
        cpu["supervisors"], cpu["commands"] = own, reaped
        cpu["framework"] = cpu_seconds() - own_before
        cpu["all"] = sum(cpu.values())
        stats = framework.stats
        if args.json:
            per_task = {name: seconds / args.tasks * 1000 for name, seconds in cpu.items()}
            figures = {
                "tasks_per_s": args.tasks / wall,
                "cpu_ms_per_task": per_task,
                "load": os.getloadavg()[0],
            }
            print(json.dumps(figures))
            return 0 if stats.finished == args.tasks else 1
        print(
            f"cluster: master + {args.agents} agents ({args.agent_resources}) as processes, "
            f"greedy framework, {args.tasks} x `{args.command}` (cpus 0.1, mem 32); "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        print(f"  tasks/s                      {args.tasks / wall:8.1f}   ({wall:.2f} s)")
        print(
            "  CPU per task, ms             "
            + ", ".join(
                f"{name} {seconds / args.tasks * 1000:.2f}" for name, seconds in cpu.items()
            )
        )
        print(f"  finished {stats.finished}, failed {stats.failed}, relaunched {stats.relaunched}")
        return 0 if stats.finished == args.tasks else 1
    finally:
        for name, process in reversed(processes.items()):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 30)
                except TimeoutError:
                    print(f"{name} did not stop: killed")
                    process.kill()
                    await process.wait()
        remove_cgroups(root)
        shutil.rmtree(work, ignore_errors=True)


def supervisors_cpu(agent_dirs: list[Path]) -> tuple[float, float]:
    """CPU seconds so far of the agents' supervisors and keepers (their own), and of
    what they reaped (the task commands, or wrappers with theirs); 0 for an agent
    whose supervisor has not started yet."""
    own = reaped = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for directory in agent_dirs:
        log = directory / "supervisor" / "supervisor.log"
        try:
            text = log.read_text()
        except FileNotFoundError:
            continue
        pids = {int(m) for m in re.findall(r"supervisor (\d+): started", text)}
        for pid in list(pids):
            with contextlib.suppress(OSError, ValueError, IndexError):
                parent = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                pids.add(parent)  # its keeper (or, before keepers, init: not counted)
        for pid in pids - {0, 1}:
            try:
                fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # gone: its figures with it
            own += (int(fields[11]) + int(fields[12])) / tick
            reaped += (int(fields[13]) + int(fields[14])) / tick
    return own, reaped


def compare(args: argparse.Namespace) -> int:
    """Run `args.rest` once per checkout per round, alternating; print medians."""
    rest = [a for a in args.rest if a != "--"]
    if not rest or rest[0] not in ("runner", "cluster"):
        print("compare needs `-- runner ...` or `-- cluster ...`")
        return 2
    checkouts = [os.path.abspath(c) for c in args.checkouts]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in checkouts}
    for round_ in range(args.rounds):
        for checkout in checkouts:
            env = {**os.environ, "PYTHONPATH": checkout}
            done = subprocess.run(
                [sys.executable, __file__, "--json", *rest],
                env=env,
                cwd=checkout,
                stdout=subprocess.PIPE,
                check=False,
            )
            lines = [line for line in done.stdout.decode().splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                print(f"round {round_ + 1} {checkout}: failed ({done.returncode}): {done.stdout!r}")
                return 1
            figures = json.loads(lines[-1])
            results[checkout].append(figures)
            print(f"round {round_ + 1} {checkout}: {json.dumps(figures)}", flush=True)
    print(f"medians of {args.rounds} rounds ({' '.join(rest)}):")
    for checkout, runs in results.items():
        rate = statistics.median(r["tasks_per_s"] for r in runs)
        cpu = {
            name: statistics.median(r["cpu_ms_per_task"][name] for r in runs)
            for name in runs[0]["cpu_ms_per_task"]
        }
        load = statistics.median(r["load"] for r in runs)
        per_task = ", ".join(f"{name} {ms:.2f}" for name, ms in cpu.items())
        print(f"  {checkout}: {rate:.1f} tasks/s; CPU ms per task {per_task}; load {load:.1f}")
    return 0


async def wait_for_agents(http_port: int, count: int, timeout: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{http_port}/state") as response:
                    state = await response.json()
                    if len(state["agents"]) >= count:
                        return
            if time.monotonic() > deadline:
                raise SystemExit(f"the agents did not register within {timeout} s")
            await asyncio.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    runner = sub.add_parser("runner", help="one agent's task runner alone")
    runner.add_argument("--window", type=int, default=100, help="tasks at once, at most")
    runner.add_argument("--isolation", default="auto", choices=["auto", "process-tree"])
    cluster = sub.add_parser("cluster", help="master, agents and a framework, end to end")
    cluster.add_argument("--agents", type=int, default=2)
    cluster.add_argument("--agent-resources", default="cpus:16;mem:16384")
    cluster.add_argument("--timeout", type=float, default=600.0)
    for p in (runner, cluster):
        p.add_argument("--tasks", type=int, default=1000)
        p.add_argument("--command", default="true")
    both = sub.add_parser("compare", help="two checkouts (or more), alternated")
    both.add_argument("--checkouts", nargs="+", required=True)
    both.add_argument("--rounds", type=int, default=5)
    both.add_argument("rest", nargs=argparse.REMAINDER, help="-- runner|cluster [ARGS]")
    parser.add_argument("--json", action="store_true", help="one JSON line of figures")
    args = parser.parse_args()
    logs.configure(level="warning")
    if args.part == "compare":
        return compare(args)
    if not args.json:
        print(f"code: {Path(mesolite.__file__).parent.parent}")
    bench = bench_runner if args.part == "runner" else bench_cluster
    return asyncio.run(bench(args))


if __name__ == "__main__":
    raise SystemExit(main())
