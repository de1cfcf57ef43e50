"""`mesolite demo`: a whole cluster on this machine, and DRF at work as demand changes.

One master, three agents and the jobs all run in this process (real gRPC over loopback;
every task is a real `sleep` process started by an agent). The jobs are in-process
frameworks written with the SDK (`mesolite.lab.phased_job.PhasedJob`), so the demo needs
nothing but the installed package. The story, in three phases, is
`mesolite.lab.demo_scenario`'s: two jobs share the cluster, a third joins, one finishes.

The terminal shows the web UI's address first, then a live table of each job's shares of
the cluster, measured twice a second from the master's snapshot (the read model that
`GET /state` serves), beside the split
DRF should reach (computed by `mesolite.lab.drf_reference.drf`), a line per event, and at the
end each phase's settled average against DRF. Every log line (master, agents, jobs) goes
to files under `<work dir>/logs/`; Ctrl-C stops everything: the jobs are torn down, the
agents kill their tasks, and no process is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import structlog
from rich.console import Console, RenderableType
from rich.live import Live
from rich.markup import escape

from mesolite import logs
from mesolite.agent import Agent, AgentConfig
from mesolite.agent.sandbox_http import SandboxServer
from mesolite.lab.demo_scenario import JOBS, DemoJob, Phase, describe_task, phases
from mesolite.lab.demo_table import (
    DemoSample,
    live_view,
    measure,
    samples_csv,
    settled,
    summary_table,
)
from mesolite.lab.phased_job import PhasedJob
from mesolite.master.config import MasterConfig
from mesolite.master.server import MasterServer
from mesolite.resources import EMPTY, Resources

log = structlog.get_logger(__name__)

# Which log file each component writes to, under <work dir>/logs/.
LOG_ROUTES = {
    "mesolite.master": "master.log",
    "mesolite.agent": "agents.log",
    "mesolite.framework_sdk": "frameworks.log",
    "mesolite.lab.phased_job": "frameworks.log",
}
OTHER_LOG = "demo.log"

SAMPLE_INTERVAL = 0.5  # seconds between looks at the master's snapshot


def default_task_seconds(duration: float) -> float:
    """Tasks short enough for shares to move within a phase (a third of the run):
    3 s for the default minute, down to 2 s for short runs (shorter would start more
    processes a second than a busy two-core machine keeps up with beside the cluster)."""
    return min(3.0, max(2.0, duration / 20))


async def run_demo(args: argparse.Namespace) -> int:
    if args.agents < 1:
        print("--agents must be at least 1", file=sys.stderr)
        return 2
    work_dir: Path = args.work_dir
    log_files = await asyncio.to_thread(_fresh_work_dir, work_dir, args.log_json, args.log_level)
    console = Console(highlight=False)
    if not console.is_terminal:
        console.soft_wrap = True  # piped: whole lines, for grep; tables keep their width
    demo = Demo(
        console=console,
        work_dir=work_dir,
        agents=args.agents,
        agent_resources=args.agent_resources,
        duration=args.duration,
        task_seconds=args.task_seconds or default_task_seconds(args.duration),
        http_port=args.http_port,
    )
    code = await demo.run()
    demo.console.print(
        f"logs: {work_dir / 'logs'}/ ("
        + ", ".join(p.name for p in log_files)
        + f"); task sandboxes: {work_dir}/agent*/"
    )
    return code


def _fresh_work_dir(work_dir: Path, log_json: bool, log_level: str) -> list[Path]:
    """Empty `work_dir` and send every log line to files in its logs/ directory."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    return logs.configure_to_files(
        work_dir / "logs", LOG_ROUTES, OTHER_LOG, json=log_json, level=log_level
    )


class Demo:
    """One run of the scenario: the cluster it starts, the jobs, what it measured."""

    def __init__(
        self,
        console: Console,
        work_dir: Path,
        agents: int,
        agent_resources: Resources,
        duration: float,
        task_seconds: float,
        http_port: int,
        jobs: tuple[DemoJob, ...] = JOBS,
    ) -> None:
        self.console = console
        self.work_dir = work_dir
        self.agent_count = agents
        self.agent_resources = agent_resources
        self.duration = duration
        self.task_seconds = task_seconds
        self.http_port = http_port
        self.plan = jobs
        self.cluster = EMPTY
        for _ in range(agents):
            self.cluster = self.cluster + agent_resources
        self.phases = phases(duration, self.cluster, jobs)
        self.samples: list[DemoSample] = []
        self.status = {
            job.name: f"joins at {job.joins * duration:.0f}s" for job in jobs if job.joins > 0
        }
        self.server: MasterServer | None = None
        self.agents: list[Agent] = []
        self.sandboxes: list[SandboxServer] = []
        self.jobs: dict[str, PhasedJob] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}
        self.finishing: set[str] = set()  # wound down, tasks still running

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Play the scenario until its end or a signal, then stop everything. 0 on success."""
        loop = asyncio.get_running_loop()
        signalled = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled.set)
        code = 0
        play = asyncio.create_task(self._play(), name="mesolite-demo")
        waiter = asyncio.create_task(signalled.wait())
        try:
            await asyncio.wait({play, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not play.done():
                play.cancel()
                self.console.print("\n[bold]Ctrl-C[/]: stopping the jobs, agents and master ...")
            try:
                await play
            except asyncio.CancelledError:
                if not signalled.is_set():
                    raise
            except Exception as e:
                log.exception("the demo failed")
                self.console.print(f"[bold red]the demo failed:[/] {escape(str(e))}")
                code = 1
        finally:
            waiter.cancel()
            began = time.monotonic()
            await self._shutdown()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        self.console.print(
            f"stopped in {time.monotonic() - began:.1f}s: jobs torn down, "
            f"agents stopped with their tasks, master stopped"
        )
        if self.samples:
            await asyncio.to_thread(
                (self.work_dir / "shares.csv").write_text, samples_csv(self.samples)
            )
        rows = settled(self.phases, self.samples)
        if rows:
            self.console.print()
            self.console.print(summary_table(rows, self.phases))
        return code

    async def _play(self) -> None:
        server = await self._start_master()
        c = self.console
        c.print(f"[bold]mesolite demo[/]: web UI at [bold cyan]http://{server.http_address}/[/]")
        c.print(f"  (in a terminal: mesolite frameworks --master {server.http_address} --watch 1)")
        # The first jobs subscribe before there is anything to offer (no head start), one
        # after the other: the allocator breaks ties in share by subscription order, and
        # cpu-heavy goes first. When memory-heavy's tasks fill an agent's memory, that
        # agent's other CPUs are idle; once one of those tasks ends, the two jobs' shares
        # are often equal, and then the agent goes to cpu-heavy, whose small tasks use
        # the idle CPUs, rather than back to memory-heavy, which would fill it again.
        for job in self.plan:
            if job.joins == 0:
                await _subscribed(self._start_job(job, server), timeout=30)
        await self._start_agents(server)
        low, high = self._task_range()
        c.print(
            f"cluster: {self.agent_count} agents x <{describe_task(self.agent_resources)}> = "
            f"<{describe_task(self.cluster)}>"
        )
        c.print(
            f"{len(self.phases)} phases of {self.duration / len(self.phases):.0f}s, "
            f"tasks of {low:.1f}-{high:.1f}s; Ctrl-C stops"
        )
        await self._watch(server)

    async def _watch(self, server: MasterServer) -> None:
        """Every `SAMPLE_INTERVAL`: start the next phase when it is time, read the master,
        let finished jobs go, redraw the table."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        names = [job.name for job in self.plan]
        upcoming = list(self.phases)
        current = upcoming[0]
        view: RenderableType = ""
        tick = 0
        with Live(console=self.console, auto_refresh=False) as live, _newline_after(live):
            while (elapsed := loop.time() - started) < self.duration:
                while upcoming and upcoming[0].start <= elapsed:
                    if tick and not self.console.is_terminal:
                        live.console.print(view)  # no live table: the phase's last view
                    current = upcoming.pop(0)
                    await self._enter(current, elapsed, server, live.console)
                measured = measure(server.snapshot(), names)
                self.samples.append(DemoSample(elapsed, measured))
                for name in sorted(self.finishing):
                    if measured[name].tasks == 0:
                        await self._retire(name, elapsed, live.console)
                view = live_view(
                    self.plan,
                    self.status,
                    measured,
                    current,
                    len(self.phases),
                    elapsed,
                    self.duration,
                )
                live.update(view, refresh=True)
                tick += 1
                await asyncio.sleep(max(0.0, started + tick * SAMPLE_INTERVAL - loop.time()))

    async def _enter(self, phase: Phase, elapsed: float, server: MasterServer, c: Console) -> None:
        for job in self.plan:
            if job.name in phase.joined and job.name not in self.jobs:
                self._start_job(job, server)
            if job.name in phase.left and job.name in self.jobs:
                self.finishing.add(job.name)
                self.status[job.name] = "launches no more tasks; leaves when its last one ends"
                with contextlib.suppress(Exception):
                    await self.jobs[job.name].wind_down()
        split = ", ".join(
            f"{name} {e.tasks:g}{' tasks' if i == 0 else ''} ({e.dominant_share:.0%})"
            for i, (name, e) in enumerate(phase.expected.items())
        )
        c.print(f"[{elapsed:4.0f}s] [bold]phase {phase.number}[/]: {phase.event}")
        c.print(f"        DRF: {split}")

    async def _retire(self, name: str, elapsed: float, c: Console) -> None:
        """A finishing job's last task has ended: it unregisters."""
        self.finishing.discard(name)
        with contextlib.suppress(Exception):
            await self.jobs[name].teardown()
        self.status[name] = f"left at {elapsed:.0f}s"
        c.print(f"[{elapsed:4.0f}s] {name}'s last task ended: it unregistered")

    def _task_range(self) -> tuple[float, float]:
        """Task lengths are drawn from this range, around `task_seconds`."""
        return (self.task_seconds * 2 / 3, self.task_seconds * 4 / 3)

    # -- the cluster -----------------------------------------------------------------------

    async def _start_master(self) -> MasterServer:
        config = MasterConfig(allocation_interval=0.5, agent_heartbeat_interval=1.0)
        server = MasterServer(config, "127.0.0.1", port=0, http_port=self.http_port)
        try:
            await server.start()
        except OSError:  # the HTTP port is taken (another master?): any free port
            await server.stop(grace=0)
            server = MasterServer(config, "127.0.0.1", port=0, http_port=0)
            await server.start()
        self.server = server
        return server

    def _start_job(self, plan: DemoJob, server: MasterServer) -> PhasedJob:
        index = self.plan.index(plan)
        job = PhasedJob(
            plan.name,
            [plan.task],
            durations=self._task_range(),
            seed=index + 1,
            # Decline offers too small for a task (the CPUs are all in use) at once:
            # every task needs one CPU, so whichever task ends next frees room for any
            # job, and an offer held meanwhile would count toward the holder's share.
            hold_seconds=0.0,
        )
        self.jobs[plan.name] = job
        self.runs[plan.name] = asyncio.create_task(job.run(server.grpc_address))
        self.status[plan.name] = "running"
        return job

    async def _start_agents(self, server: MasterServer) -> None:
        for i in range(self.agent_count):
            work_dir = self.work_dir / f"agent{i + 1}"
            sandboxes = SandboxServer(work_dir)  # each agent's task output, for the web UI
            await sandboxes.start()
            self.sandboxes.append(sandboxes)
            agent = Agent(
                AgentConfig(
                    server.grpc_address,
                    self.agent_resources,
                    work_dir,
                    hostname=f"agent{i + 1}",
                    address=sandboxes.address,
                    kill_grace_period=1.0,
                )
            )
            await agent.__aenter__()
            self.agents.append(agent)
        async with asyncio.timeout(30):
            await asyncio.gather(*(agent.wait_registered() for agent in self.agents))

    async def _shutdown(self) -> None:
        """Jobs first (the master kills their tasks), then agents (they kill what is
        left and wait for the last updates), then the master."""
        for job in self.jobs.values():
            if job.connected:
                with contextlib.suppress(Exception):
                    await job.wind_down()  # no launches onto resources being freed below
        for name, job in self.jobs.items():
            if job.connected:
                with contextlib.suppress(Exception):
                    await job.teardown()
            await job.stop()
            with contextlib.suppress(Exception):
                await self.runs[name]
        await asyncio.gather(
            *(agent.__aexit__(None, None, None) for agent in self.agents), return_exceptions=True
        )
        for sandboxes in self.sandboxes:
            with contextlib.suppress(Exception):
                await sandboxes.stop()
        if self.server is not None:
            await self.server.stop(grace=0.5)


@contextlib.contextmanager
def _newline_after(live: Live) -> Iterator[None]:
    """Off a terminal, Live prints its last view when it stops, without a newline."""
    try:
        yield
    finally:
        if not live.console.is_terminal:
            live.stop()
            live.console.print()


async def _subscribed(job: PhasedJob, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not job.connected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{job.name} did not subscribe within {timeout:g}s")
        await asyncio.sleep(0.05)
