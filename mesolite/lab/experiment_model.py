"""The dynamic-sharing experiment's model: its settings, its samples, and the two
references each phase is judged against (the policy's fractional equilibrium and the
best whole-task packing), computed from the jobs' demands alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mesolite.lab.drf_reference import FairAllocation, asset_fairness, drf, to_fraction
from mesolite.lab.phased_job import JobStats
from mesolite.master.policies import make_policy
from mesolite.master.policies.slots import DEFAULT_SLOT
from mesolite.resources import EMPTY, Resources

AGENT_RESOURCES = Resources(cpus=4, mem=14336)  # the paper's 4 CPUs and 14 GB per node
JOBS = ("job1", "job2")
# Per-task demand of (job1, job2) in each phase, as in the paper.
PAPER_PHASES: tuple[tuple[Resources, Resources], ...] = (
    (Resources(cpus=1, mem=10240), Resources(cpus=1, mem=1024)),
    (Resources(cpus=2, mem=4096), Resources(cpus=1, mem=3072)),
    (Resources(cpus=1, mem=7168), Resources(cpus=1, mem=4096)),
)
CSV_FIELDS = (
    "time_s",
    "phase",
    "job",
    "cpu_share",
    "mem_share",
    "dominant_share",
    "tasks",
    "allocated_share",
)


@dataclass(frozen=True, slots=True)
class ExperimentConfig:
    policy: str = "drf"
    agents: int = 48
    agent_resources: Resources = AGENT_RESOURCES
    phases: tuple[tuple[Resources, Resources], ...] = PAPER_PHASES
    phase_seconds: float = 20.0
    task_seconds: tuple[float, float] = (4.0, 8.0)
    sample_interval: float = 0.5
    seed: int = 1
    hold_seconds: float = 2.0  # how long a job keeps an offer too small for a task
    # The master's --packing, and the jobs declare their demand (which packing needs).
    packing: bool = False
    progress_every: float = 5.0  # seconds between progress lines; 0: none

    @property
    def cluster(self) -> Resources:
        total = EMPTY
        for _ in range(self.agents):
            total = total + self.agent_resources
        return total

    @property
    def duration(self) -> float:
        return self.phase_seconds * len(self.phases)


@dataclass(frozen=True, slots=True)
class Sample:
    time_s: float
    phase: int  # 1-based
    job: str
    cpu_share: float
    mem_share: float
    dominant_share: float
    tasks: int
    # Dominant share of the job's tasks *and* outstanding offers: what the allocator
    # counts (offers included), where the shares above count tasks only.
    allocated_share: float = 0.0


@dataclass(slots=True)
class RunResult:
    config: ExperimentConfig
    samples: list[Sample] = field(default_factory=list)
    stats: dict[str, JobStats] = field(default_factory=dict)


# -- references computed from the demands ---------------------------------------------------


def vector(resources: Resources) -> dict[str, float]:
    return dict(resources)


def equilibrium(policy: str, cluster: Resources, demands: Sequence[Resources]) -> FairAllocation:
    """The policy's fractional equilibrium for jobs `JOBS` with per-task `demands`.

    Tasks are divisible and the cluster is one pool, as in the DRF paper's analysis.
    """
    capacity = vector(cluster)
    users = {job: vector(d) for job, d in zip(JOBS, demands, strict=True)}
    if policy == "drf":
        return drf(capacity, users)
    if policy == "asset":
        return asset_fairness(capacity, users)
    if policy == "slots":
        # Slot fair sharing raises every job's slot count at the same rate: progressive
        # filling on slots per task, i.e. weighted DRF with weight dominant/slots per task
        # (the slot policy's rounding up of a job's total is ignored: divisible tasks).
        slot = vector(DEFAULT_SLOT)
        weights = {}
        for job, d in users.items():
            dominant = max(to_fraction(a) / to_fraction(capacity[r]) for r, a in d.items())
            slots = max(to_fraction(d.get(r, 0.0)) / to_fraction(s) for r, s in slot.items())
            weights[job] = dominant / slots
        return drf(capacity, users, weights=weights)
    raise ValueError(f"unknown policy {policy!r}")


def best_packing(
    policy: str, agent: Resources, agents: int, demands: Sequence[Resources]
) -> tuple[int, int]:
    """Whole tasks of two jobs on `agents` separate agents that maximise the lower policy share.

    Among all placements (each agent holding whatever whole tasks fit in it), the task
    counts (n1, n2) whose lower share under `policy` is highest, ties going to the
    higher other share: the best any allocator could do with whole tasks.
    """
    d1, d2 = demands
    configs: list[tuple[int, int]] = []
    n1 = 0
    while agent.contains(times(d1, n1)):
        n2 = 0
        while agent.contains(times(d1, n1) + times(d2, n2 + 1)):
            n2 += 1
        configs.append((n1, n2))  # the most job2 tasks that fit beside n1 of job1
        n1 += 1
    # most[x] = the most job2 tasks the agents so far can hold beside exactly x of job1.
    most: dict[int, int] = {0: 0}
    for _ in range(agents):
        step: dict[int, int] = {}
        for x, y in most.items():
            for c1, c2 in configs:
                if step.get(x + c1, -1) < y + c2:
                    step[x + c1] = y + c2
        most = step
    share = make_policy(policy).share
    total = times(agent, agents)

    def rank(point: tuple[int, int]) -> tuple[float, float]:
        s = sorted((share(times(d1, point[0]), total), share(times(d2, point[1]), total)))
        return (s[0], s[1])

    return max(most.items(), key=rank)


def times(resources: Resources, n: int) -> Resources:
    return Resources({name: amount * n for name, amount in resources.items()})


def dominant_share(resources: Resources, cluster: Resources) -> float:
    return max(resources.shares(cluster).values(), default=0.0)


# -- the run -----------------------------------------------------------------------------------
