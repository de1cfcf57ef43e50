"""`mesolite experiment dynamic-sharing`: the DRF paper's Mesos experiment, on mesolite.

The DRF paper (Ghodsi et al., NSDI 2011, "Dynamic Resource Sharing") ran two jobs on a
48-node Mesos cluster, each node offering 4 CPUs and 14 GB, for three 2-minute phases in
which the jobs' task sizes change:

    phase 1   job1 <1 CPU, 10 GB>   job2 <1 CPU, 1 GB>
    phase 2   job1 <2 CPUs, 4 GB>   job2 <1 CPU, 3 GB>
    phase 3   job1 <1 CPU, 7 GB>    job2 <1 CPU, 4 GB>

and plotted each job's CPU, memory and dominant share over time. Here one master and 48
agents run in this process over real gRPC on 127.0.0.1, the two jobs are in-process
frameworks (`mesolite.lab.phased_job.PhasedJob`) whose tasks are real `sleep` processes,
and time is scaled down (20 s phases by default). Every `sample_interval` the master's
snapshot (`MasterServer.snapshot()`, what GET /state shows) gives each job's shares of
what its *tasks* hold (offers not counted).

For each phase the average over its second half (allocations have shifted by then) is
printed next to two references computed from the demands alone:

* the fractional equilibrium of the policy (`mesolite.lab.drf_reference`: `drf` for DRF,
  `asset_fairness` for asset fairness; slot fair sharing is progressive filling on slot
  counts, which is weighted DRF with weight = dominant share / slots per task);
* the best whole-task packing: over every way of placing whole tasks on the 48 separate
  agents, the one that maximises the lower of the two jobs' shares (then the higher).
  The fractional equilibrium splits tasks across machines; this is what can really be
  reached, so the gap between the two is fragmentation, not the allocator.

Design choices (`mesolite experiment dynamic-sharing --help` has the knobs):

* Task length, 4-8 s. Each task is the agent's Python task wrapper, `sh` and `sleep`:
  about 35 ms of CPU to start. Up to ~190 tasks of 1-3 s would mean ~95 starts a
  second, more than two cores manage beside the 48 agents' event loop (its lag reached
  a second, and status updates and offers queued behind it). At 4-8 s it is ~30 a
  second, and every task of a phase has ended before the second half of the next.
* Holding offers too small for a task (`hold_seconds`, 2 s by default; 0 declines at
  once). The master re-offers resources the moment a task ends, one task's worth at a
  time. In phase 2 job1 needs 2 CPUs per task: each freed CPU goes first to job1 (the
  lower share), is declined as too small, and is then taken by job2's 1-CPU tasks, so
  job1 almost never sees two free CPUs on one agent and stays far below half the
  CPUs. A job that keeps such an offer for a moment (only where a task could fit once
  other jobs' tasks end) gets the next CPU freed there too and launches on both. Held
  offers count toward its share in the allocator, as every offer does, but not in the
  measured shares: the table's 'alloc' column includes them. 2 s is about the time for one
  of the other tasks on an agent to end.
* The phase averages also miss what whole tasks cannot reach: in phase 3 the fractional
  equilibrium needs every byte of memory used (48 x 7 GB + 84 x 4 GB = 672 GB), which
  14 GB agents holding 7 GB and 4 GB tasks cannot do; placements made one task at a
  time as tasks end pack worse still than the best placement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mesolite.agent import Agent, AgentConfig
from mesolite.lab.experiment_model import (
    JOBS,
    ExperimentConfig,
    RunResult,
    Sample,
)
from mesolite.lab.experiment_report import (
    PhaseRow,
    fmt_resources,
    format_table,
    phase_rows,
    read_csv,
    write_csv,
)
from mesolite.lab.phased_job import PhasedJob
from mesolite.master.master import MasterConfig
from mesolite.master.policies import POLICIES
from mesolite.master.server import MasterServer
from mesolite.resources import Resources
from mesolite.snapshot import FrameworkSnapshot


async def run_dynamic_sharing(
    config: ExperimentConfig, work_dir: Path, out: Callable[[str], None] = print
) -> RunResult:
    """Run the experiment on a fresh cluster; agents keep their sandboxes under `work_dir`."""
    result = RunResult(config)
    server = MasterServer(
        MasterConfig(
            allocation_interval=0.5,
            agent_heartbeat_interval=1.0,
            policy=config.policy,
            seed=config.seed,
            packing=config.packing,
        ),
        "127.0.0.1",
        port=0,
        http_port=0,
    )
    jobs = [
        PhasedJob(
            name,
            [phase[i] for phase in config.phases],
            config.task_seconds,
            seed=config.seed * 1000 + i,
            hold_seconds=config.hold_seconds,
            agent_capacity=config.agent_resources,
            demand_agents=config.agents if config.packing else 0,
        )
        for i, name in enumerate(JOBS)
    ]
    agents: list[Agent] = []
    runs: list[asyncio.Task[None]] = []
    await server.start()
    try:
        # Both jobs subscribe before there is anything to offer: no head start.
        runs = [asyncio.create_task(job.run(server.grpc_address)) for job in jobs]
        await _wait_for(lambda: all(job.connected for job in jobs), 30, "the jobs to subscribe")
        for i in range(config.agents):
            agent = Agent(
                AgentConfig(
                    server.grpc_address,
                    config.agent_resources,
                    work_dir / f"agent{i + 1}",
                    hostname=f"agent{i + 1}",
                    kill_grace_period=1.0,
                )
            )
            await agent.__aenter__()
            agents.append(agent)
        async with asyncio.timeout(60):
            await asyncio.gather(*(agent.wait_registered() for agent in agents))
        total = server.snapshot().cluster.total
        out(describe(config))
        await _sample(config, master_usage(server, jobs), jobs, total, result, out)
    finally:
        for job in jobs:
            if job.connected:
                with contextlib.suppress(Exception):
                    await job.wind_down()  # no launches onto resources being freed below
        try:
            for job, run in zip(jobs, runs, strict=False):
                if job.connected:
                    with contextlib.suppress(Exception):
                        await job.teardown()  # the master kills its tasks
                await job.stop()
                with contextlib.suppress(Exception):
                    await run
            # Each agent kills what is left of its tasks and waits for their last updates.
            await asyncio.gather(
                *(agent.__aexit__(None, None, None) for agent in agents), return_exceptions=True
            )
        finally:
            await server.stop(grace=0.5)
        result.stats = {job.name: job.stats for job in jobs}
    return result


def master_usage(
    server: MasterServer, jobs: Sequence[PhasedJob]
) -> Callable[[], dict[str, FrameworkSnapshot | None]]:
    """Each job's framework as the master's snapshot shows it now (None before it subscribes)."""

    def usage() -> dict[str, FrameworkSnapshot | None]:
        frameworks = {f.id: f for f in server.snapshot().frameworks}
        return {job.name: frameworks.get(job.framework_id or "") for job in jobs}

    return usage


async def _sample(
    config: ExperimentConfig,
    usage: Callable[[], dict[str, FrameworkSnapshot | None]],
    jobs: Sequence[PhasedJob],
    total: Resources,
    result: RunResult,
    out: Callable[[str], None],
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    phase = 0
    tick = 0
    printed = -math.inf
    while (elapsed := tick * config.sample_interval) <= config.duration + 1e-9:
        await asyncio.sleep(max(0.0, started + elapsed - loop.time()))
        now = loop.time() - started
        current = min(int(now // config.phase_seconds), len(config.phases) - 1)
        if current != phase and now < config.duration:
            phase = current
            for job in jobs:
                await job.set_phase(phase)
            out(
                f"[{now:5.1f}s] phase {phase + 1}: "
                + ", ".join(f"{job.name} tasks now {fmt_resources(job.demand)}" for job in jobs)
            )
        held = usage()
        line = []
        for job in jobs:
            framework = held[job.name]
            shares = framework.used.shares(total) if framework else {}
            count = framework.running_tasks if framework else 0
            sample = Sample(
                time_s=round(now, 3),
                phase=phase + 1,
                job=job.name,
                cpu_share=shares.get("cpus", 0.0),
                mem_share=shares.get("mem", 0.0),
                dominant_share=framework.used_dominant_share if framework else 0.0,
                tasks=count,
                # Tasks and offers: what the allocator counts.
                allocated_share=framework.dominant_share if framework else 0.0,
            )
            result.samples.append(sample)
            line.append(
                f"{job.name}: {count:3d} tasks cpu {sample.cpu_share:4.0%} "
                f"mem {sample.mem_share:4.0%} dominant {sample.dominant_share:4.0%}"
            )
        if config.progress_every and now - printed >= config.progress_every - 1e-9:
            out(f"[{now:5.1f}s] " + "   |   ".join(line))
            printed = now
        tick += 1


async def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


# -- analysis ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    csv: Path
    figure: Path
    table: Path
    rows: list[PhaseRow]


async def run_and_write(
    config: ExperimentConfig, out_dir: Path, out: Callable[[str], None] = print
) -> Written:
    """Run one policy, print its phase table, and write its CSV, figure and table (text)."""
    work_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="mesolite-experiment-"))
    try:
        result = await run_dynamic_sharing(config, work_dir, out)
    finally:
        await asyncio.to_thread(shutil.rmtree, work_dir, True)
    rows = phase_rows(config, result.samples)
    report = "\n".join(
        [
            describe(config),
            format_table(config, rows),
            "tasks launched: "
            + "; ".join(
                f"{job} {s.launched} ({s.combined} on held offers combined with a later one, "
                f"{s.failed} did not finish)"
                for job, s in result.stats.items()
            ),
        ]
    )
    out("")
    out(report)
    stem = out_dir / f"dynamic-sharing-{config.policy}{'-packing' if config.packing else ''}"
    written = Written(
        stem.with_suffix(".csv"), stem.with_suffix(".png"), stem.with_suffix(".txt"), rows
    )
    await asyncio.to_thread(_write_outputs, written, config, result.samples, report)
    return written


def describe(config: ExperimentConfig) -> str:
    low, high = config.task_seconds
    return (
        f"dynamic sharing, policy {config.policy}: {config.agents} agents of "
        f"{fmt_resources(config.agent_resources)} (cluster {fmt_resources(config.cluster)}), "
        f"{len(config.phases)} phases of {config.phase_seconds:g}s, tasks of {low:g}-{high:g}s, "
        f"offers too small held {config.hold_seconds:g}s, seed {config.seed}"
        + (", demand declared and packing on" if config.packing else "")
    )


def _write_outputs(
    written: Written, config: ExperimentConfig, samples: Sequence[Sample], report: str
) -> None:
    written.csv.parent.mkdir(parents=True, exist_ok=True)
    write_csv(written.csv, samples)
    written.table.write_text(report + "\n")
    from mesolite.lab.experiment_plots import plot_run  # matplotlib: only when drawing

    plot_run(written.figure, config, samples)


def comparison(out_dir: Path, config: ExperimentConfig) -> Path | None:
    """Draw the comparison figure from the CSVs of every policy in `out_dir`, if all exist."""
    paths = {p: out_dir / f"dynamic-sharing-{p}.csv" for p in POLICIES}
    if not all(path.exists() for path in paths.values()):
        return None
    figure = out_dir / "dynamic-sharing-comparison.png"
    from mesolite.lab.experiment_plots import plot_comparison  # matplotlib: only when drawing

    plot_comparison(figure, config, {p: read_csv(path) for p, path in paths.items()})
    return figure


async def run(args: argparse.Namespace) -> int:
    """`mesolite experiment dynamic-sharing`; options left out take `ExperimentConfig`'s."""
    defaults = ExperimentConfig()
    low, high = args.task_seconds or defaults.task_seconds
    hold = defaults.hold_seconds if args.hold_seconds is None else args.hold_seconds
    if args.agents < 1:
        print("--agents must be at least 1", file=sys.stderr)
        return 2
    if not 0 < low <= high:
        print("--task-seconds MIN MAX needs 0 < MIN <= MAX", file=sys.stderr)
        return 2
    if not 0 <= hold < math.inf:
        print("--hold-seconds must be a finite number >= 0", file=sys.stderr)
        return 2
    base = dataclasses.replace(
        defaults,
        agents=args.agents,
        phase_seconds=(
            defaults.phase_seconds
            if args.minutes_per_phase is None
            else args.minutes_per_phase * 60
        ),
        task_seconds=(low, high),
        hold_seconds=hold,
        seed=args.seed,
        packing=args.packing,
    )
    policies = POLICIES if args.policy == "all" else (args.policy,)
    out_dir: Path = args.out
    files: list[Path] = []
    for policy in policies:
        written = await run_and_write(dataclasses.replace(base, policy=policy), out_dir)
        files += [written.csv, written.figure, written.table]
        print()
    figure = await asyncio.to_thread(comparison, out_dir, base)
    if figure is not None:
        files.append(figure)
    print("wrote:\n" + "\n".join(f"  {f}" for f in files))
    if figure is None:
        print(
            f"(the comparison figure needs a run of every policy in {out_dir}: "
            "--policy all runs them in turn)"
        )
    return 0
