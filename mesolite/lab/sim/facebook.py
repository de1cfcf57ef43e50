"""A workload like the Facebook Hadoop cluster of 2010 that the DRF paper simulates.

The DRF paper (section 7.3) simulates a trace of Facebook's Hadoop cluster (its
motivation studies a month, October 2010, of that 2000-node cluster's task
demands, which differ widely from job to job; how much of the trace section 7.3
replays is not confirmed, see the README's *Sources*): jobs arriving all the
time, most of them small and a few of thousands of tasks. The trace is not
public; this generator draws a workload with that shape, every parameter stated
(`FacebookParams`, the README's table):

- **arrivals**: a Poisson process, `mean_interarrival` seconds apart on average;
- **job sizes** (tasks per job): the Facebook job-size mix of October 2009 as
  published with delay scheduling (Zaharia et al., EuroSys 2010, table 2: 38%
  of jobs have 1 task, 16% 2, 14% 3-20, 8% 21-60, 6% 61-150, 6% 151-300,
  4% 301-500, 4% 501-1500, 4% 1501 and more), each bin's size drawn uniformly,
  scaled by `size_scale` and capped at `max_tasks`;
- **task shapes**: one per job (its tasks are alike), CPUs and memory each
  log-normal and independent (median `cpus_median`, `mem_median_mb`, spread
  `sigma`), clipped to [`cpus_min`, `cpus_max`] and [`mem_min_mb`, `mem_max_mb`];
- **task lengths**: one per job, log-normal (median `duration_median`, spread
  `duration_sigma`), clipped to [`duration_min`, `duration_max`];
- **cluster**: `agents` agents of `agent_resources`.

The same seed gives the same workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mesolite.lab.sim.workload import (
    AgentGroup,
    Job,
    SimulationSettings,
    SimWorkload,
    TaskGroup,
    default_role,
)
from mesolite.resources import Resources

# (smallest, largest, fraction of jobs): Facebook, October 2009 (delay scheduling, table 2).
JOB_SIZE_BINS: tuple[tuple[int, int, float], ...] = (
    (1, 1, 0.38),
    (2, 2, 0.16),
    (3, 20, 0.14),
    (21, 60, 0.08),
    (61, 150, 0.06),
    (151, 300, 0.06),
    (301, 500, 0.04),
    (501, 1500, 0.04),
    (1501, 3000, 0.04),
)


@dataclass(frozen=True, slots=True)
class FacebookParams:
    jobs: int = 400
    mean_interarrival: float = 2.5
    size_scale: float = 0.2
    max_tasks: int = 3000
    cpus_median: float = 0.8
    cpus_min: float = 0.1
    cpus_max: float = 4.0
    mem_median_mb: float = 1536.0
    mem_min_mb: float = 128.0
    mem_max_mb: float = 8192.0
    sigma: float = 0.7
    duration_median: float = 30.0
    duration_sigma: float = 0.8
    duration_min: float = 2.0
    duration_max: float = 600.0
    agents: int = 100
    agent_resources: str = "cpus:8;mem:16384"
    sample_interval: float = 10.0
    seed: int = 1


def facebook_workload(p: FacebookParams) -> SimWorkload:
    rng = random.Random(p.seed)
    jobs = []
    now = 0.0
    weights = [w for _, _, w in JOB_SIZE_BINS]
    for i in range(p.jobs):
        if i:
            now += rng.expovariate(1.0 / p.mean_interarrival)
        low, high, _ = rng.choices(JOB_SIZE_BINS, weights)[0]
        size = max(1, min(p.max_tasks, round(rng.randint(low, high) * p.size_scale)))
        cpus = _lognormal(rng, p.cpus_median, p.sigma, p.cpus_min, p.cpus_max)
        mem = _lognormal(rng, p.mem_median_mb, p.sigma, p.mem_min_mb, p.mem_max_mb)
        duration = _lognormal(
            rng, p.duration_median, p.duration_sigma, p.duration_min, p.duration_max
        )
        shape = Resources(cpus=round(cpus, 1), mem=round(mem / 64) * 64)
        name = f"j{i:05d}"
        jobs.append(
            Job(
                name,
                round(now, 3),
                default_role(name),
                (TaskGroup(shape, size, round(duration, 1)),),
            )
        )
    agents = (AgentGroup(p.agents, Resources.parse(p.agent_resources)),)
    return SimWorkload(agents, tuple(jobs), SimulationSettings(sample_interval=p.sample_interval))


def _lognormal(rng: random.Random, median: float, sigma: float, low: float, high: float) -> float:
    return min(high, max(low, median * math.exp(rng.gauss(0.0, sigma))))
