"""Preemption on the simulator (`mesolite/lab/sim/`, the real core in virtual time):
long-running tasks converge to the DRF split with preemption on and never without it,
weighted and guaranteed roles too, and preemption does not thrash on random workloads."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mesolite.lab.sim.engine import REACTION, SimResult, simulate
from mesolite.lab.sim.workload import parse_workload

GRACE = 5.0
INTERVAL = 1.0


def run(roles: str, jobs: str, preemption: bool = True, end: float = 200.0) -> SimResult:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "roles.toml").write_text(roles)
        w = parse_workload(
            '[cluster]\nagents = [{ count = 2, resources = "cpus:4;mem:8192" }]\n'
            f"[simulation]\nend = {end}\nsample_interval = 1.0\n"
            f'roles_file = "roles.toml"\npreemption = {str(preemption).lower()}\n'
            f"preemption_grace = {GRACE}\n" + jobs,
            base=Path(d),
        )
        return simulate(w, check_invariants=True)


def endless(name: str, role: str, arrival: float, count: int = 16) -> str:
    return (
        f'[[jobs]]\nname = "{name}"\nrole = "{role}"\narrival = {arrival}\n'
        f'tasks = [{{ resources = "cpus:1;mem:1024", count = {count}, duration = inf }}]\n'
    )


def cpus(r: SimResult, role: str, at: float) -> float:
    """The role's CPUs in use at `at` (tasks of 1 CPU on 8)."""
    shares = {t: s for t, rl, s in r.shares if rl == role}
    return round(8 * shares.get(at, 0.0), 6)


def first_time(r: SimResult, role: str, amount: float) -> float | None:
    for s in r.samples:
        if cpus(r, role, s.time) >= amount:
            return s.time
    return None


def test_two_endless_frameworks_reach_the_drf_split_only_with_preemption() -> None:
    roles = "[roles.a]\nfair_share_timeout = 10\n[roles.b]\nfair_share_timeout = 10\n"
    jobs = endless("a", "a", 0.0) + endless("b", "b", 50.0)
    on, off = run(roles, jobs), run(roles, jobs, preemption=False)
    assert on.invariant_violations == [] and off.invariant_violations == []
    # Stated bound: the fair-share timeout, the check (an allocation interval), the grace
    # period, the offer (an interval) and the prompt cycle after the kill.
    bound = 50.0 + 10 + INTERVAL + GRACE + INTERVAL + REACTION
    reached = first_time(on, "b", 4)
    assert reached is not None and reached <= bound + 1.0, reached  # samples each second
    for t in (reached, 100.0, 199.0):
        assert (cpus(on, "a", t), cpus(on, "b", t)) == (4, 4), t
    assert len(on.preemptions) == 4  # exactly what the split needed, once
    # Without preemption the late one never gets anything.
    assert max(cpus(off, "b", s.time) for s in off.samples) == 0
    assert off.preemptions == []


def test_a_weighted_role_reaches_its_weighted_share() -> None:
    roles = "[roles.a]\nfair_share_timeout = 10\n[roles.b]\nweight = 3\nfair_share_timeout = 10\n"
    r = run(roles, endless("a", "a", 0.0) + endless("b", "b", 30.0))
    reached = first_time(r, "b", 6)
    assert reached is not None and reached <= 30 + 10 + 2 * INTERVAL + GRACE + REACTION + 1
    assert (cpus(r, "a", 199.0), cpus(r, "b", 199.0)) == (2, 6)


def test_a_guarantee_is_honoured_by_default_whoever_came_first() -> None:
    # The case: gold guaranteed 6 of 8 CPUs, `*` first with tasks that never end;
    # no preemption settings at all.
    roles = "[roles.gold]\nguarantee = { cpus = 6 }\n"
    jobs = endless("first", "*", 0.0) + endless("gold", "gold", 20.0, count=6)
    on, off = run(roles, jobs), run(roles, jobs, preemption=False)
    # At most min_share_timeout (15 s) + check + grace + offer + the prompt cycle.
    reached = first_time(on, "gold", 6)
    assert reached is not None and reached <= 20 + 15 + 2 * INTERVAL + GRACE + REACTION + 1
    assert cpus(on, "*", 199.0) == 2
    assert max(cpus(off, "gold", s.time) for s in off.samples) == 0


@st.composite
def workloads(draw: st.DrawFn) -> tuple[str, str, int]:
    roles, jobs = [], []
    names = [f"r{i}" for i in range(draw(st.integers(2, 3)))]
    for name in names:
        lines = [f"[roles.{name}]", f"weight = {draw(st.sampled_from([1, 2]))}"]
        if draw(st.booleans()):
            lines.append(f"guarantee = {{ cpus = {draw(st.integers(1, 3))} }}")
        timeout = draw(st.sampled_from([None, 5, 10]))
        if timeout is not None:
            lines.append(f"fair_share_timeout = {timeout}")
            lines.append(f"fair_share_preemption_threshold = {draw(st.sampled_from([0.5, 1.0]))}")
        roles.append("\n".join(lines))
    for i in range(draw(st.integers(2, 5))):
        cpu = draw(st.integers(1, 2))
        mem = draw(st.sampled_from([256, 1024, 2048]))
        duration = draw(st.sampled_from(["inf", "5.0", "20.0", "60.0"]))
        jobs.append(
            f'[[jobs]]\nname = "j{i}"\nrole = "{draw(st.sampled_from(names))}"\n'
            f"arrival = {draw(st.integers(0, 60))}\n"
            f'tasks = [{{ resources = "cpus:{cpu};mem:{mem}", count = {draw(st.integers(1, 10))},'
            f" duration = {duration} }}]\n"
        )
    return "\n".join(roles) + "\n", "".join(jobs), draw(st.integers(1, 3))


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(workloads())
def test_preemption_never_gives_back_what_it_took_on_random_workloads(
    workload: tuple[str, str, int],
) -> None:
    roles, jobs, _ = workload
    r = run(roles, jobs, end=150.0)
    assert r.invariant_violations == []
    assert r.given_back == [], (r.given_back, r.preemptions)
