"""The simulator (`mesolite simulate`): the real master core in virtual time, its workload
file, the Facebook-like generator, and the DRF-vs-slots comparison it reproduces."""

from __future__ import annotations

import pytest

from mesolite.lab.sim.engine import REACTION, WorkloadCannotRun, simulate
from mesolite.lab.sim.facebook import JOB_SIZE_BINS, FacebookParams, facebook_workload
from mesolite.lab.sim.results import by_size, mean_completion, mean_utilization
from mesolite.lab.sim.workload import SimWorkloadError, dump_workload, parse_workload

ONE_AGENT = """
[cluster]
agents = [{ count = 1, resources = "cpus:4;mem:4096" }]
"""


def workload(jobs: str, cluster: str = ONE_AGENT, simulation: str = "") -> str:
    return cluster + simulation + jobs


def test_tasks_run_for_their_duration_in_virtual_time_on_the_real_core() -> None:
    # 8 tasks of 1 CPU on 4 CPUs: two waves of 10 s. The first wave ends between
    # two periodic cycles (every second from 0): the second starts at the prompt cycle the
    # freed resources ask for, REACTION later.
    w = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\narrival = 3.5\n'
            'tasks = [{ resources = "cpus:1;mem:256", count = 8, duration = 10.0 }]\n',
            cluster='[cluster]\nagents = [{ count = 1, resources = "cpus:4;mem:8192" }]\n',
        )
    )
    for policy in ("drf", "asset", "slots"):
        r = simulate(w, policy, check_invariants=True)
        [job] = r.jobs
        assert r.invariant_violations == []
        # Subscribing asks for a prompt cycle too.
        assert job.started == pytest.approx(3.5 + REACTION)
        assert job.finished == pytest.approx(3.5 + REACTION + 10 + REACTION + 10)
        assert r.launched == 8


def test_utilization_and_shares_count_what_tasks_use() -> None:
    w = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\n'
            'tasks = [{ resources = "cpus:1;mem:512", count = 3, duration = 50 }]\n'
            '[[jobs]]\nname = "b"\nrole = "web"\n'
            'tasks = [{ resources = "cpus:0.5;mem:2048", count = 1, duration = 50 }]\n',
            simulation="[simulation]\nsample_interval = 5.0\n",
        )
    )
    r = simulate(w, "drf", check_invariants=True)
    at_10 = next(s for s in r.samples if s.time == 10.0)
    assert at_10.used == {"cpus": pytest.approx(3.5 / 4), "mem": pytest.approx(3584 / 4096)}
    assert at_10.running == 4
    shares = {role: share for t, role, share in r.shares if t == 10.0}
    assert shares == {"job/a": pytest.approx(0.75), "web": pytest.approx(0.5)}


def test_slots_ask_whole_slots_and_tasks_never_share_one() -> None:
    # A task of 0.5 CPU and 1 GB takes a whole slot of <1 CPU, 2 GB>.
    w = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\n'
            'tasks = [{ resources = "cpus:0.5;mem:1024", count = 8, duration = 10 }]\n',
            cluster='[cluster]\nagents = [{ count = 1, resources = "cpus:4;mem:8192" }]\n',
        )
    )
    drf, slots = simulate(w, "drf"), simulate(w, "slots")
    # DRF runs all 8 at once; slots run 4 (one slot each), in two waves (the second from
    # the periodic cycle at 10 s, as the first wave ends).
    assert drf.jobs[0].finished == pytest.approx(10.0)
    assert slots.jobs[0].finished == pytest.approx(20.0)
    assert max(s.allocated["cpus"] for s in slots.samples) == 1.0  # the slots, as asked


def test_drf_beats_slots_on_a_facebook_like_workload() -> None:
    # The DRF paper's section 7.3 in small: shorter jobs, the larger the more, and more
    # of the cluster in use while jobs arrive.
    w = facebook_workload(FacebookParams(jobs=80, agents=20, size_scale=0.1, seed=3))
    drf, slots = simulate(w, "drf"), simulate(w, "slots")
    assert all(j.finished is not None for r in (drf, slots) for j in r.jobs)
    drf_mean, slots_mean = mean_completion(drf), mean_completion(slots)
    assert drf_mean is not None and slots_mean is not None
    assert drf_mean < 0.9 * slots_mean
    until = max(j.arrival for j in w.jobs)
    assert mean_utilization(drf, until)["cpus"] > mean_utilization(slots, until)["cpus"]
    big = next(b for b in by_size(drf) if b.label == "51-150")
    big_slots = next(b for b in by_size(slots) if b.label == "51-150")
    assert big.mean_completion is not None and big_slots.mean_completion is not None
    assert big.mean_completion < 0.8 * big_slots.mean_completion


def test_the_generator_follows_its_parameters() -> None:
    p = FacebookParams(jobs=2000, agents=5, size_scale=1.0, seed=7)
    w = facebook_workload(p)
    assert w == facebook_workload(p)  # same seed, same workload
    assert len(w.jobs) == 2000
    sizes = [j.tasks for j in w.jobs]
    ones = sum(1 for s in sizes if s == 1) / len(sizes)
    assert abs(ones - JOB_SIZE_BINS[0][2]) < 0.05
    assert max(sizes) <= p.max_tasks
    gaps = [b.arrival - a.arrival for a, b in zip(w.jobs, w.jobs[1:], strict=False)]
    assert abs(sum(gaps) / len(gaps) - p.mean_interarrival) < 0.3
    for j in w.jobs:
        [g] = j.groups
        assert p.cpus_min <= g.resources.get_amount("cpus") <= p.cpus_max
        assert p.duration_min <= g.duration <= p.duration_max
    assert parse_workload(dump_workload(w)) == w


def test_a_workload_that_cannot_run_is_refused() -> None:
    too_big = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:5", count = 1, duration = 1 }]\n'
        )
    )
    with pytest.raises(WorkloadCannotRun, match="fits no agent"):
        simulate(too_big)
    # 4100 MB fits the agent's 5000, but as whole slots of 2 GB it needs 3 (6 GB).
    slots_only = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\n'
            'tasks = [{ resources = "cpus:1;mem:4100", count = 1, duration = 1 }]\n',
            cluster='[cluster]\nagents = [{ count = 1, resources = "cpus:4;mem:5000" }]\n',
        )
    )
    assert simulate(slots_only, "drf").jobs[0].finished is not None
    with pytest.raises(WorkloadCannotRun, match="whole slots"):
        simulate(slots_only, "slots")
    endless = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:1", count = 1, duration = inf }]\n'
        )
    )
    with pytest.raises(WorkloadCannotRun, match="needs an end"):
        simulate(endless)
    ended = parse_workload(
        workload(
            '[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:1", count = 1, duration = inf }]\n',
            simulation="[simulation]\nend = 100.0\n",
        )
    )
    r = simulate(ended, check_invariants=True)
    assert r.jobs[0].finished is None and r.end_time == 100.0


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (
            '[[jobs]]\nname = "a"\nbogus = 1\ntasks = [{ resources = "cpus:1" }]\n',
            8,
            "unknown key 'bogus'",
        ),
        ('[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:x" }]\n', 8, "resources"),
        (
            '[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:1", count = 0 }]\n',
            8,
            "count must be",
        ),
        (
            '[[jobs]]\nname = "a"\narrival = -1\ntasks = [{ resources = "cpus:1" }]\n',
            8,
            "arrival must be",
        ),
        ('[[jobs]]\nname = "a b"\ntasks = [{ resources = "cpus:1" }]\n', 7, "job name must be"),
        (
            '[[jobs]]\nname = "a"\nrole = "x//y"\ntasks = [{ resources = "cpus:1" }]\n',
            8,
            "invalid role",
        ),
        ('[[jobs]]\nname = "a"\ntasks = []\n', 8, "tasks must be"),
    ],
)
def test_bad_workload_files_are_refused_with_the_line(text: str, line: int, problem: str) -> None:
    with pytest.raises(SimWorkloadError, match=problem) as e:
        parse_workload(ONE_AGENT + "[simulation]\nend = 5.0\n" + text, "w.toml")
    assert e.value.line == line, str(e.value)


def test_repeated_job_names_and_missing_tables_are_refused() -> None:
    job = '[[jobs]]\nname = "a"\ntasks = [{ resources = "cpus:1" }]\n'
    with pytest.raises(SimWorkloadError, match="repeats"):
        parse_workload(ONE_AGENT + job + job)
    with pytest.raises(SimWorkloadError, match=r"\[cluster\]"):
        parse_workload(job)
    with pytest.raises(SimWorkloadError, match="at least one"):
        parse_workload(ONE_AGENT)


def test_declared_demand_ends_the_declining_churn() -> None:
    # MESOS-6111 in small: frameworks that wait for a whole agent, behind a job of small
    # tasks. With demand declared they are offered only what fits them.
    jobs = (
        '[[jobs]]\nname = "small"\n'
        'tasks = [{ resources = "cpus:1;mem:512", count = 60, duration = 1.5 },'
        ' { resources = "cpus:1;mem:512", count = 60, duration = 2.5 }]\n'
    ) + "".join(
        f'[[jobs]]\nname = "whole{i}"\narrival = 1.0\n'
        'tasks = [{ resources = "cpus:4;mem:4096", count = 1, duration = 5 }]\n'
        for i in range(10)
    )
    runs = {}
    for demand in (False, True):
        w = parse_workload(
            workload(
                jobs,
                cluster='[cluster]\nagents = [{ count = 3, resources = "cpus:4;mem:4096" }]\n',
                simulation=f"[simulation]\ndemand = {str(demand).lower()}\n",
            )
        )
        runs[demand] = simulate(w, check_invariants=True)
        assert all(j.finished is not None for j in runs[demand].jobs)
    assert runs[False].declines > 30
    assert runs[True].declines <= runs[False].declines / 10
