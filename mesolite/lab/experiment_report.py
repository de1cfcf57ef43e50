"""The experiment's results as text and data: the phase table printed beside the
references, and the samples' CSV (written, and read back for the comparison figure)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mesolite.lab.experiment_model import (
    CSV_FIELDS,
    JOBS,
    ExperimentConfig,
    Sample,
    best_packing,
    dominant_share,
    equilibrium,
    times,
)
from mesolite.resources import Resources


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One job in one phase: measured averages next to the references."""

    phase: int
    job: str
    demand: Resources
    samples: int
    tasks: float
    cpu_share: float
    mem_share: float
    dominant_share: float
    allocated_share: float
    eq_tasks: float
    eq_cpu_share: float
    eq_mem_share: float
    eq_dominant_share: float
    packed_tasks: int
    packed_dominant_share: float

    @property
    def difference_pp(self) -> float:
        """Measured minus equilibrium dominant share, in percentage points."""
        return 100 * (self.dominant_share - self.eq_dominant_share)

    @property
    def packing_gap_pp(self) -> float:
        """Best whole-task packing minus equilibrium dominant share, in percentage points."""
        return 100 * (self.packed_dominant_share - self.eq_dominant_share)


def phase_rows(config: ExperimentConfig, samples: Iterable[Sample]) -> list[PhaseRow]:
    """Per phase and job: averages over the phase's second half, with the references."""
    cluster = config.cluster
    by_key: dict[tuple[int, str], list[Sample]] = {}
    for s in samples:
        start = (s.phase - 1) * config.phase_seconds
        if start + config.phase_seconds / 2 <= s.time_s < start + config.phase_seconds:
            by_key.setdefault((s.phase, s.job), []).append(s)
    rows: list[PhaseRow] = []
    for p, demands in enumerate(config.phases, start=1):
        eq = equilibrium(config.policy, cluster, demands)
        packed = best_packing(config.policy, config.agent_resources, config.agents, demands)
        for job, demand, n in zip(JOBS, demands, packed, strict=True):
            got = by_key.get((p, job), [])
            count = max(len(got), 1)
            shares = {r: float(a / eq.capacity[r]) for r, a in eq.allocation(job).items()}
            rows.append(
                PhaseRow(
                    phase=p,
                    job=job,
                    demand=demand,
                    samples=len(got),
                    tasks=sum(s.tasks for s in got) / count,
                    cpu_share=sum(s.cpu_share for s in got) / count,
                    mem_share=sum(s.mem_share for s in got) / count,
                    dominant_share=sum(s.dominant_share for s in got) / count,
                    allocated_share=sum(s.allocated_share for s in got) / count,
                    eq_tasks=float(eq.tasks[job]),
                    eq_cpu_share=shares.get("cpus", 0.0),
                    eq_mem_share=shares.get("mem", 0.0),
                    eq_dominant_share=float(eq.dominant_shares[job]),
                    packed_tasks=n,
                    packed_dominant_share=dominant_share(times(demand, n), cluster),
                )
            )
    return rows


def format_table(config: ExperimentConfig, rows: Sequence[PhaseRow]) -> str:
    reference = {
        "drf": "DRF equilibrium (mesolite.lab.drf_reference.drf)",
        "asset": "asset-fairness equilibrium (mesolite.lab.drf_reference.asset_fairness)",
        "slots": "slot-fair-sharing equilibrium (progressive filling on slots)",
    }[config.policy]
    half = config.phase_seconds / 2
    lines = [
        f"policy {config.policy}: averages over the second half of each phase, "
        f"next to the {reference}",
        "  measured shares count tasks; 'alloc' is the dominant share of tasks plus "
        "outstanding offers, which the allocator counts; 'diff': measured minus equilibrium "
        "dominant share;\n  'packing': the best whole-task placement on the separate agents "
        "(tasks = dominant share).",
    ]
    header = (
        f"  {'job':<5} {'task':<15} | {'measured: tasks':>15} {'cpu':>6} {'mem':>6} "
        f"{'dominant':>8} {'alloc':>6} | {'equilibrium: tasks':>18} {'cpu':>6} {'mem':>6} "
        f"{'dominant':>8} | {'diff':>8} | {'packing':>13}"
    )
    for p in range(1, len(config.phases) + 1):
        start = (p - 1) * config.phase_seconds
        lines.append(
            f"phase {p} ({start:g}-{start + config.phase_seconds:g}s, averaged over "
            f"{start + half:g}-{start + config.phase_seconds:g}s)"
        )
        lines.append(header)
        phase = [r for r in rows if r.phase == p]
        for r in phase:
            lines.append(
                f"  {r.job:<5} {fmt_resources(r.demand):<15} | {r.tasks:>15.1f} "
                f"{r.cpu_share:>6.1%} {r.mem_share:>6.1%} {r.dominant_share:>8.1%} "
                f"{r.allocated_share:>6.1%} | {r.eq_tasks:>18.1f} {r.eq_cpu_share:>6.1%} "
                f"{r.eq_mem_share:>6.1%} {r.eq_dominant_share:>8.1%} | "
                f"{r.difference_pp:>+6.1f}pp | "
                f"{r.packed_tasks:>3d} = {r.packed_dominant_share:>5.1%}"
            )
        lines.append(
            f"  cluster used by tasks: cpu {sum(r.cpu_share for r in phase):.1%}, "
            f"mem {sum(r.mem_share for r in phase):.1%} (equilibrium: cpu "
            f"{sum(r.eq_cpu_share for r in phase):.1%}, mem "
            f"{sum(r.eq_mem_share for r in phase):.1%})"
        )
    return "\n".join(lines)


def fmt_resources(r: Resources) -> str:
    cpus = r.get_amount("cpus")
    mem = r.get_amount("mem") / 1024
    return f"<{cpus:g} CPU{'s' if cpus != 1 else ''}, {mem:g} GB>"


# -- files ------------------------------------------------------------------------------------


def write_csv(path: Path, samples: Iterable[Sample]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for s in samples:
            writer.writerow(
                [
                    f"{s.time_s:.3f}",
                    s.phase,
                    s.job,
                    f"{s.cpu_share:.5f}",
                    f"{s.mem_share:.5f}",
                    f"{s.dominant_share:.5f}",
                    s.tasks,
                    f"{s.allocated_share:.5f}",
                ]
            )


def read_csv(path: Path) -> list[Sample]:
    with path.open(newline="") as f:
        return [
            Sample(
                time_s=float(row["time_s"]),
                phase=int(row["phase"]),
                job=row["job"],
                cpu_share=float(row["cpu_share"]),
                mem_share=float(row["mem_share"]),
                dominant_share=float(row["dominant_share"]),
                tasks=int(row["tasks"]),
                allocated_share=float(row.get("allocated_share") or 0.0),
            )
            for row in csv.DictReader(f)
        ]
