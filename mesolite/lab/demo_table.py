"""What the demo shows: each job's shares, measured from the master's snapshot (the read
model `GET /state` serves), next to the split DRF should reach
(`mesolite.lab.demo_scenario`). Pure: snapshots in, rich renderables out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from mesolite.lab.demo_scenario import DemoJob, Phase, describe_task
from mesolite.snapshot import ClusterSnapshot

BAR_WIDTH = 16


@dataclass(frozen=True, slots=True)
class Measured:
    """What one job's tasks hold on the master now (outstanding offers not counted)."""

    tasks: int
    cpu_share: float
    mem_share: float
    dominant_share: float
    # Of the job's tasks *and* outstanding offers: what the allocator counts.
    allocated_share: float = 0.0


NOTHING = Measured(0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class DemoSample:
    time: float  # seconds into the run
    jobs: Mapping[str, Measured]


def measure(snapshot: ClusterSnapshot, names: Sequence[str]) -> dict[str, Measured]:
    """Each named job's shares of the cluster, from the master's snapshot (what
    `GET /state` shows). A job not registered (not joined yet, or gone) holds nothing."""
    total = snapshot.cluster.total
    by_name = {f.name: f for f in snapshot.frameworks}
    measured: dict[str, Measured] = {}
    for name in names:
        framework = by_name.get(name)
        if framework is None:
            measured[name] = NOTHING
            continue
        shares = framework.used.shares(total)
        measured[name] = Measured(
            tasks=framework.running_tasks,
            cpu_share=shares.get("cpus", 0.0),
            mem_share=shares.get("mem", 0.0),
            dominant_share=framework.used_dominant_share,
            allocated_share=framework.dominant_share,
        )
    return measured


@dataclass(frozen=True, slots=True)
class Settled:
    """One job in one phase: its average over the phase's second half (time for tasks
    started under the old split to end) next to DRF's split."""

    phase: int
    job: str
    samples: int
    tasks: float
    dominant_share: float
    expected_tasks: float
    expected_share: float


def settled(phases: Sequence[Phase], samples: Sequence[DemoSample]) -> list[Settled]:
    rows: list[Settled] = []
    for phase in phases:
        start = (phase.start + phase.end) / 2
        window = [s for s in samples if start <= s.time < phase.end]
        if not window:
            continue  # stopped before the phase settled
        for job, expected in phase.expected.items():
            values = [s.jobs.get(job, NOTHING) for s in window]
            n = len(values)
            rows.append(
                Settled(
                    phase=phase.number,
                    job=job,
                    samples=len(values),
                    tasks=sum(v.tasks for v in values) / n,
                    dominant_share=sum(v.dominant_share for v in values) / n,
                    expected_tasks=expected.tasks,
                    expected_share=expected.dominant_share,
                )
            )
    return rows


def share_bar(share: float, expected: float | None, width: int = BAR_WIDTH) -> Text:
    """A bar of `share` with a mark where DRF's split lies."""
    filled = round(min(max(share, 0.0), 1.0) * width)
    mark = None if expected is None else min(round(expected * width), width - 1)
    bar = Text()
    for i in range(width):
        if i == mark:
            bar.append("┃", style="bold yellow")
        elif i < filled:
            bar.append("█", style="green")
        else:
            bar.append("·", style="dim")
    return bar


def live_view(
    jobs: Sequence[DemoJob],
    status: Mapping[str, str],
    measured: Mapping[str, Measured],
    phase: Phase,
    phases: int,
    elapsed: float,
    duration: float,
) -> RenderableType:
    """The table the demo redraws while it runs: one row per job, what its tasks hold
    now beside DRF's split for the phase."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    table.add_column("job", no_wrap=True)
    table.add_column("task size", no_wrap=True)
    table.add_column("tasks", justify="right", no_wrap=True)
    table.add_column("CPU", justify="right")
    table.add_column("mem", justify="right")
    table.add_column("dominant share", no_wrap=True)
    table.add_column("DRF", justify="right")
    for job in jobs:
        m = measured.get(job.name, NOTHING)
        expected = phase.expected.get(job.name)
        table.add_row(
            job.name,
            describe_task(job.task),
            f"{m.tasks}" + (f"/{expected.tasks:g}" if expected else ""),
            f"{m.cpu_share:.0%}",
            f"{m.mem_share:.0%}",
            share_bar(m.dominant_share, expected.dominant_share if expected else None)
            + Text(f" {m.dominant_share:4.0%}"),
            f"{expected.dominant_share:.0%}" if expected else "-",
            style="" if expected is not None or m.tasks else "dim",
        )
    title = Text.assemble(
        (f"phase {phase.number}/{phases}", "bold"),
        f" at {elapsed:4.0f}s of {duration:g}s: {phase.event}",
    )
    notes = [f"{name}: {what}" for name, what in status.items() if what != "running"]
    legend = Text(
        "tasks: running now/DRF's split; ┃ marks DRF's split\n"
        "shares: of the cluster's CPUs and memory held by running tasks"
        + "".join(f"\n{note}" for note in notes),
        style="dim",
    )
    return Group(title, table, legend)


def summary_table(rows: Sequence[Settled], phases: Sequence[Phase]) -> Table:
    """Per phase: each job's settled average next to DRF's split."""
    table = Table(
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        show_edge=False,
        title="each phase's second half, averaged (measured on the master) vs DRF",
        title_justify="left",
    )
    table.add_column("phase")
    table.add_column("job")
    table.add_column("tasks", justify="right")
    table.add_column("DRF tasks", justify="right")
    table.add_column("dominant share", justify="right")
    table.add_column("DRF share", justify="right")
    events = {p.number: p for p in phases}
    for row in rows:
        phase = events[row.phase]
        table.add_row(
            f"{row.phase} ({phase.start:.0f}-{phase.end:.0f}s)",
            row.job,
            f"{row.tasks:.1f}",
            f"{row.expected_tasks:g}",
            f"{row.dominant_share:.0%}",
            f"{row.expected_share:.0%}",
        )
    return table


CSV_HEADER = "time_s,job,tasks,cpu_share,mem_share,dominant_share,allocated_share"


def samples_csv(samples: Sequence[DemoSample]) -> str:
    """Every sample, one line per job, for a closer look than the table gives."""
    lines = [CSV_HEADER]
    for sample in samples:
        for job, m in sample.jobs.items():
            lines.append(
                f"{sample.time:.2f},{job},{m.tasks},{m.cpu_share:.4f},{m.mem_share:.4f},"
                f"{m.dominant_share:.4f},{m.allocated_share:.4f}"
            )
    return "\n".join(lines) + "\n"
