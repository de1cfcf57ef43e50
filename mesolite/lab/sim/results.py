"""What a simulation shows: CSV files, job completion times by job size, utilization.

write_csvs(result, out_dir)          # <policy>-jobs.csv, -samples.csv, -shares.csv
by_size(result)                      # mean completion time per job-size bin
mean_utilization(result, until)      # time-averaged use of each resource
summary_table(results, until)        # the comparison, as text
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mesolite.lab.sim.engine import SimResult

# Job sizes in tasks: (smallest, largest) per bin, the last open-ended.
SIZE_BINS: tuple[tuple[int, int | None], ...] = (
    (1, 10),
    (11, 50),
    (51, 150),
    (151, 500),
    (501, None),
)


def bin_label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


def size_bin(tasks: int) -> str:
    for low, high in SIZE_BINS:
        if tasks >= low and (high is None or tasks <= high):
            return bin_label(low, high)
    raise ValueError(f"no bin for {tasks} tasks")


@dataclass(frozen=True, slots=True)
class BinFigures:
    label: str
    jobs: int
    finished: int
    mean_completion: float | None  # of the finished jobs


def by_size(result: SimResult) -> list[BinFigures]:
    figures = []
    for low, high in SIZE_BINS:
        label = bin_label(low, high)
        jobs = [j for j in result.jobs if size_bin(j.tasks) == label]
        done = [j.completion for j in jobs if j.completion is not None]
        figures.append(
            BinFigures(label, len(jobs), len(done), statistics.mean(done) if done else None)
        )
    return figures


def mean_utilization(result: SimResult, until: float | None = None) -> dict[str, float]:
    """Each resource's use by tasks, averaged over the samples up to `until` (all: None)."""
    samples = [s for s in result.samples if until is None or s.time <= until]
    if not samples:
        return {}
    return {name: statistics.mean(s.used[name] for s in samples) for name in samples[0].used}


def mean_completion(result: SimResult) -> float | None:
    done = [j.completion for j in result.jobs if j.completion is not None]
    return statistics.mean(done) if done else None


def write_csvs(result: SimResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    p = result.policy
    jobs, samples, shares = (
        out / f"{p}-jobs.csv",
        out / f"{p}-samples.csv",
        out / f"{p}-shares.csv",
    )
    with jobs.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["job", "role", "tasks", "size_bin", "arrival", "started", "finished", "completion"]
        )
        for j in result.jobs:
            w.writerow(
                [
                    j.name,
                    j.role,
                    j.tasks,
                    size_bin(j.tasks),
                    j.arrival,
                    _cell(j.started),
                    _cell(j.finished),
                    _cell(j.completion),
                ]
            )
    names = sorted(result.samples[0].used) if result.samples else []
    with samples.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "time",
                *(f"{n}_used" for n in names),
                *(f"{n}_allocated" for n in names),
                "running_tasks",
                "active_jobs",
            ]
        )
        for s in result.samples:
            w.writerow(
                [
                    s.time,
                    *(round(s.used[n], 6) for n in names),
                    *(round(s.allocated[n], 6) for n in names),
                    s.running,
                    s.active_jobs,
                ]
            )
    with shares.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", "role", "dominant_share"])
        for t, role, share in result.shares:
            w.writerow([t, role, round(share, 6)])
    preemptions = out / f"{p}-preemptions.csv"
    with preemptions.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", "from_role", "for_role", "agent"])
        w.writerows(result.preemptions)
    return [jobs, samples, shares, preemptions]


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def summary_table(results: Sequence[SimResult], until: float | None = None) -> str:
    """Mean job completion time per size bin for each policy, the reduction of the first
    against each other one, and utilization."""
    lines = []
    head = f"{'job size (tasks)':<18}{'jobs':>6}" + "".join(
        f"{r.policy + ' JCT (s)':>16}" for r in results
    )
    base = results[0]
    others = results[1:]
    head += "".join(f"{'vs ' + o.policy:>12}" for o in others)
    lines.append(head)
    tables = [by_size(r) for r in results]
    for i, (low, high) in enumerate(SIZE_BINS):
        row = f"{bin_label(low, high):<18}{tables[0][i].jobs:>6}"
        means = [t[i].mean_completion for t in tables]
        row += "".join(f"{_secs(m):>16}" for m in means)
        row += "".join(f"{_reduction(means[0], m):>12}" for m in means[1:])
        lines.append(row)
    overall = [mean_completion(r) for r in results]
    row = f"{'all':<18}{len(base.jobs):>6}" + "".join(f"{_secs(m):>16}" for m in overall)
    row += "".join(f"{_reduction(overall[0], m):>12}" for m in overall[1:])
    lines.append(row)
    lines.append("")
    for r in results:
        util = mean_utilization(r, until)
        shown = ", ".join(f"{n} {v:.1%}" for n, v in sorted(util.items()))
        unfinished = sum(1 for j in r.jobs if j.finished is None)
        lines.append(
            f"{r.policy}: mean use {shown}; {r.offers} offers, {r.declines} declined, "
            f"{len(r.preemptions)} preempted, "
            f"{r.cycles} cycles, {unfinished} jobs unfinished at {r.end_time:.0f} s; "
            f"{r.wall_seconds:.1f} s of wall time"
        )
    return "\n".join(lines)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _reduction(base: float | None, other: float | None) -> str:
    """How much shorter `base` is than `other`, as a percentage of `other`."""
    if base is None or other is None or other == 0:
        return "-"
    return f"{1 - base / other:+.0%}"
