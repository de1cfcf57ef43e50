"""The demo's story: which jobs run when, and the split DRF should reach in each phase.

Three agents of <10 CPUs, 30 GB> make a cluster of <30 CPUs, 90 GB>. Three jobs keep it
busy with short tasks of one CPU each (each task is a real `sleep`); what changes is who
is asking:

    phase 1  cpu-heavy <1 CPU, 512 MB> and memory-heavy <1 CPU, 6 GB> share the cluster
    phase 2  balanced <1 CPU, 3 GB> joins; the two others give way as their tasks end
    phase 3  memory-heavy finishes (launches nothing more); the others take what it held

The split each phase should reach is not typed in: `expected_split` computes it from the
demands and the cluster with the exact reference, `mesolite.lab.drf_reference.drf` (tasks
divisible, the cluster one pool). With these sizes it is, in every phase, a whole number
of tasks that fits on the three separate agents, and CPUs are what runs out, which every
task needs one of, so a CPU freed by any task's end fits any job's next task:

    phase 1  cpu-heavy 20 tasks, memory-heavy 10: dominant shares 67% and 67%
             (memory-heavy's 10 tasks hold 60 of the 90 GB: 67% is its memory share)
    phase 2  cpu-heavy 12, memory-heavy 6, balanced 12: 40% each
    phase 3  cpu-heavy 15, balanced 15: 50% each

The phases are thirds of the run, so `--duration` scales all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mesolite.lab.drf_reference import drf
from mesolite.resources import Resources

AGENTS = 3
AGENT_RESOURCES = Resources(cpus=10, mem=30720)


@dataclass(frozen=True, slots=True)
class DemoJob:
    """A job that keeps launching tasks of one size from `joins` until `leaves` (fractions
    of the run); after `leaves` it launches nothing more, and unregisters once its running
    tasks have finished."""

    name: str
    task: Resources
    joins: float = 0.0
    leaves: float | None = None


JOBS: tuple[DemoJob, ...] = (
    DemoJob("cpu-heavy", Resources(cpus=1, mem=512)),
    DemoJob("memory-heavy", Resources(cpus=1, mem=6144), leaves=2 / 3),
    DemoJob("balanced", Resources(cpus=1, mem=3072), joins=1 / 3),
)


@dataclass(frozen=True, slots=True)
class Expected:
    """What DRF gives one job in a phase (fractional tasks, as in the DRF paper)."""

    tasks: float
    dominant_share: float


@dataclass(frozen=True, slots=True)
class Phase:
    number: int  # 1-based
    start: float  # seconds into the run
    end: float
    joined: tuple[str, ...]  # jobs that start at `start`
    left: tuple[str, ...]  # jobs that stop launching at `start`
    event: str  # the same, in words
    expected: Mapping[str, Expected]  # by job name: the jobs asking for resources


def expected_split(cluster: Resources, demands: Mapping[str, Resources]) -> dict[str, Expected]:
    """DRF's split of `cluster` between jobs with these per-task `demands`, computed
    exactly by `mesolite.lab.drf_reference.drf` (progressive filling)."""
    if not demands:
        return {}
    allocation = drf(dict(cluster), {name: dict(task) for name, task in demands.items()})
    return {
        name: Expected(float(allocation.tasks[name]), float(allocation.dominant_shares[name]))
        for name in demands
    }


def phases(duration: float, cluster: Resources, jobs: Sequence[DemoJob] = JOBS) -> list[Phase]:
    """The run cut where a job joins or leaves, each piece with its DRF split."""
    moments = sorted({0.0, *(j.joins for j in jobs), *(j.leaves for j in jobs if j.leaves)})
    moments = [m for m in moments if 0.0 <= m < 1.0]
    result: list[Phase] = []
    for i, moment in enumerate(moments):
        end = moments[i + 1] if i + 1 < len(moments) else 1.0
        asking = [j for j in jobs if j.joins <= moment and (j.leaves is None or j.leaves > moment)]
        joined = tuple(j.name for j in jobs if j.joins == moment)
        left = tuple(j.name for j in jobs if j.leaves == moment)
        result.append(
            Phase(
                number=i + 1,
                start=moment * duration,
                end=end * duration,
                joined=joined,
                left=left,
                event=_event(joined, left),
                expected=expected_split(cluster, {j.name: j.task for j in asking}),
            )
        )
    return result


def _event(joined: Sequence[str], left: Sequence[str]) -> str:
    words = []
    if joined:
        verb = "start" if len(joined) > 1 else "joins"
        words.append(f"{_names(joined)} {verb}")
    if left:
        verb = "finish" if len(left) > 1 else "finishes"
        words.append(f"{_names(left)} {verb}")
    return "; ".join(words)


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def describe_task(task: Resources) -> str:
    """<2 CPUs, 1 GB>: a task size as people say it."""
    cpus = task.get("cpus", 0.0)
    mem = task.get("mem", 0.0)
    return f"{cpus:g} CPU{'' if cpus == 1 else 's'}, {_memory(mem)}"


def _memory(mb: float) -> str:
    return f"{mb / 1024:g} GB" if mb >= 1024 else f"{mb:g} MB"
