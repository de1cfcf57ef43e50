"""`mesolite demo`: a whole cluster on this machine, and DRF at work.

One master and several agents run in this process (real gRPC over loopback);
a CPU-heavy and a memory-heavy batch framework run as separate processes
(`examples/cpu_heavy.py`, `examples/memory_heavy.py`), each keeping the cluster
busy with short tasks that are real subprocesses. Every second the demo prints
each framework's CPU, memory and dominant share of what its tasks use, so you
can watch DRF equalise the dominant shares.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent import Agent, AgentConfig
from agent.sandbox_http import SandboxServer
from master.master import MasterConfig
from master.server import MasterServer
from mesolite.resources import EMPTY, Resources

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
JOBS = [("cpu-heavy", "cpu_heavy.py"), ("memory-heavy", "memory_heavy.py")]


def _usage(server: MasterServer) -> dict[str, tuple[Resources, int]]:
    master = server.master
    assert master is not None
    usage: dict[str, tuple[Resources, int]] = {}
    for framework in master.frameworks.values():
        used = sum((t.spec.resources for t in framework.tasks.values()), EMPTY)
        usage[framework.info.name] = (used, len(framework.tasks))
    return usage


def _share_line(elapsed: float, total: Resources, usage: dict[str, tuple[Resources, int]]) -> str:
    parts = []
    for name, _ in JOBS:
        used, count = usage.get(name, (EMPTY, 0))
        shares = used.shares(total)
        cpu, mem = shares.get("cpus", 0.0), shares.get("mem", 0.0)
        parts.append(
            f"{name}: {count:2d} tasks cpu {cpu:4.0%} mem {mem:4.0%} dominant {max(cpu, mem):4.0%}"
        )
    return f"[{elapsed:5.1f}s]  " + "   |   ".join(parts)


def _fresh_directory(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


async def run_demo(args: argparse.Namespace) -> int:
    if not EXAMPLES.is_dir():
        print(
            f"the demo needs the examples from a clone of mesolite ({EXAMPLES} is missing)",
            file=sys.stderr,
        )
        return 1
    if args.agents < 1:
        print("--agents must be at least 1", file=sys.stderr)
        return 2
    work_dir: Path = args.work_dir
    _fresh_directory(work_dir)
    config = MasterConfig(allocation_interval=0.5, agent_heartbeat_interval=1.0)
    server = MasterServer(config, "127.0.0.1", port=0, http_port=args.http_port)
    try:
        await server.start()
    except OSError:
        server = MasterServer(config, "127.0.0.1", port=0, http_port=0)
        await server.start()
    agents: list[Agent] = []
    sandbox_servers: list[SandboxServer] = []  # each agent's task output, for the web UI
    jobs: list[asyncio.subprocess.Process] = []
    try:
        for name, script in JOBS:
            log_file = (work_dir / f"{name}.log").open("ab")
            jobs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(EXAMPLES / script),
                    "--master",
                    server.grpc_address,
                    "--tasks",
                    "0",
                    "--duration",
                    str(args.task_seconds),
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                )
            )
        # Both jobs subscribe before there is anything to offer, so neither
        # gets a head start on an empty cluster.
        await _wait_for(lambda: len(server.master.frameworks) == len(JOBS), 30)  # type: ignore[union-attr]
        for i in range(args.agents):
            sandboxes = SandboxServer(work_dir / f"agent{i + 1}")
            await sandboxes.start()
            sandbox_servers.append(sandboxes)
            agent = Agent(
                AgentConfig(
                    server.grpc_address,
                    args.agent_resources,
                    work_dir / f"agent{i + 1}",
                    hostname=f"agent{i + 1}",
                    address=sandboxes.address,
                    kill_grace_period=1.0,
                )
            )
            await agent.__aenter__()
            agents.append(agent)
        for agent in agents:
            await asyncio.wait_for(agent.wait_registered(), 30)
        assert server.master is not None
        total = server.master.allocator.total
        print(
            f"mesolite demo: master {server.grpc_address}, {args.agents} agents of "
            f"{args.agent_resources} (cluster {total})\n"
            f"  jobs: cpu-heavy <2 CPUs, 512 MB> and memory-heavy <0.5 CPU, 4096 MB> "
            f"tasks of {args.task_seconds:g}s; logs in {work_dir}/\n"
            f"  web UI: http://{server.http_address}/   "
            f"in a terminal: mesolite state --master {server.http_address}\n"
            f"  running for {args.duration:g}s (Ctrl-C stops sooner)\n",
            flush=True,
        )
        await _watch(server, total, args.duration)
        return 0
    finally:
        for job in jobs:
            if job.returncode is None:
                job.send_signal(signal.SIGTERM)
        for job in jobs:
            try:
                await asyncio.wait_for(job.wait(), 10)
            except TimeoutError:
                job.kill()
                await job.wait()
        for agent in agents:
            await agent.stop()
        for sandboxes in sandbox_servers:
            await sandboxes.stop()
        await server.stop(grace=0.5)


async def _wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the example frameworks did not subscribe")
        await asyncio.sleep(0.05)


async def _watch(server: MasterServer, total: Resources, duration: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    samples: dict[str, list[float]] = {name: [] for name, _ in JOBS}
    last, printed_at = "", 0.0
    while (elapsed := time.monotonic() - started) < duration and not stop.is_set():
        usage = _usage(server)
        line = _share_line(elapsed, total, usage)
        for name in samples:
            used, _ = usage.get(name, (EMPTY, 0))
            samples[name].append(max(used.shares(total).values(), default=0.0))
        changed = line.split("]", 1)[1] != last.split("]", 1)[-1]
        if changed or elapsed - printed_at >= 5:
            print(line, flush=True)
            last, printed_at = line, elapsed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()
    print("\naverage dominant share over the run (DRF equalises these, up to one task):")
    for name, values in samples.items():
        print(f"  {name:<13} {sum(values) / max(len(values), 1):.1%}")
