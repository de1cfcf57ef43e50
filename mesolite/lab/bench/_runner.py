"""The bench's parent: starts the master and the workers, measures, prints a table.

Every part is a process of its own: the master (`_master_process.py`, on the source
tree under test), the simulated agents (`_sim_agents.py`) and the simulated frameworks
(`_sim_frameworks.py`), spread over `--agent-procs` and `--framework-procs` worker
processes, so the master's event loop has a core to itself as far as the machine allows.
The parent only steers and reads /proc.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from mesolite.lab.bench import _procstat, _sim_agents, _sim_frameworks
from mesolite.lab.bench._control import percentiles
from mesolite.lab.bench._profile import Profiler, summarise

_LAUNCHER = Path(__file__).with_name("_master_process.py")
_CTX = multiprocessing.get_context("spawn")  # grpc does not survive a fork


@dataclass(frozen=True)
class MasterUnderTest:
    label: str
    source: Path  # the source tree whose `mesolite` runs the master
    settings: dict[str, Any]  # MasterConfig fields
    log_dir: Path
    py_spy: str | None = None  # profile the master's measured window with py-spy


class RunningMaster:
    def __init__(self, master: MasterUnderTest) -> None:
        master.log_dir.mkdir(parents=True, exist_ok=True)
        settings = {"work_dir": str(master.log_dir / "work"), **master.settings}
        # The source under test first; what the bench's own path adds after it.
        path = os.pathsep.join(p for p in (str(master.source), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        self.log_path = master.log_dir / "master.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(_LAUNCHER), json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"the master did not start: see {self.log_path}")
        ready = json.loads(line)
        self.pid: int = ready["pid"]
        self.grpc = f"127.0.0.1:{ready['grpc']}"
        self.http = f"127.0.0.1:{ready['http']}"
        self.skipped: list[str] = ready["skipped"]

    def cpu(self) -> float:
        return _procstat.cpu_seconds(self.pid)

    def rss(self) -> int:
        return _procstat.rss_bytes(self.pid)

    def get_state(self) -> tuple[float, int]:
        """Seconds for one GET /state, and its size in bytes."""
        start = time.perf_counter()
        with urllib.request.urlopen(f"http://{self.http}/state", timeout=60) as response:
            body = response.read()
        return time.perf_counter() - start, len(body)

    def stop(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # the launcher stops at EOF
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class Worker:
    """One worker process, steered through a pipe (`_control.py`)."""

    def __init__(self, target: Callable[[Connection, Any], None], spec: Any) -> None:
        self.conn, child = _CTX.Pipe()
        self.process: BaseProcess = _CTX.Process(target=target, args=(child, spec), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(60) or self.conn.recv() != "ready":
            raise RuntimeError("a bench worker did not start")

    def send(self, command: str) -> None:
        self.conn.send((command,))

    def answer(self) -> Any:
        if not self.conn.poll(60):
            raise RuntimeError("a bench worker did not answer")
        return self.conn.recv()

    def cpu(self) -> float:
        assert self.process.pid is not None
        return _procstat.cpu_seconds(self.process.pid)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.send("stop")
            self.answer()
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def ask(workers: Sequence[Worker], command: str) -> list[Any]:
    """Send `command` to every worker at once, then collect their answers."""
    for w in workers:
        w.send(command)
    return [w.answer() for w in workers]


@contextlib.contextmanager
def workers_of(
    target: Callable[[Connection, Any], None], specs: Sequence[Any]
) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for spec in specs:
            started.append(Worker(target, spec))
        yield started
    finally:
        for w in started:
            w.stop()


def split(total: int, parts: int) -> list[tuple[int, int]]:
    """(first index, count) of `parts` nearly equal slices of `total`."""
    parts = max(1, min(parts, total))
    out, first = [], 0
    for i in range(parts):
        count = total // parts + (1 if i < total % parts else 0)
        out.append((first, count))
        first += count
    return out


def wait_until(check: Callable[[], bool], timeout: float, what: str, poll: float = 0.25) -> float:
    """Seconds until `check()` held; raises TimeoutError naming `what`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(poll)
    return time.monotonic() - start


@dataclass
class Row:
    """One line of the table."""

    label: str
    scenario: str
    figures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)


def _merge_counters(reports: list[dict[str, Any]], key: str) -> Counter[str]:
    total: Counter[str] = Counter()
    for r in reports:
        total.update(r[key])
    return total


def _ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.1f} ms"


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def offer_latencies(
    freed: Sequence[tuple[str, float]], offered: Sequence[tuple[str, float]]
) -> list[float]:
    """Per offer: how long the oldest resources in it had been free (since the agent
    told the master a task there ended). An offer holds all of its agent's free
    resources, so it covers every end on that agent since the agent's previous offer,
    whichever framework it went to. (Clocks: `time.monotonic`, one for all processes.)"""
    ends: dict[str, list[float]] = {}
    for agent_id, t in sorted(freed, key=lambda f: f[1]):
        ends.setdefault(agent_id, []).append(t)
    latencies = []
    cursor: dict[str, int] = {}
    for agent_id, t in sorted(offered, key=lambda o: o[1]):
        times = ends.get(agent_id, [])
        i = cursor.get(agent_id, 0)
        if i < len(times) and times[i] <= t:
            latencies.append(t - times[i])
            while i < len(times) and times[i] <= t:
                i += 1
        cursor[agent_id] = i
    return latencies


@dataclass(frozen=True)
class ThroughputPlan:
    agents: int
    agent_resources: dict[str, float]
    frameworks: int
    task: dict[str, float]
    tasks_per_offer: int
    task_seconds: float
    warmup: float
    duration: float
    agent_procs: int
    framework_procs: int
    batches: bool


def throughput(master: MasterUnderTest, plan: ThroughputPlan) -> Row:
    """Tasks through the master: greedy frameworks on simulated agents."""
    row = Row(master.label, f"throughput {plan.agents}a x {plan.frameworks}f")
    running = RunningMaster(master)
    try:
        agent_specs = [
            _sim_agents.AgentsSpec(
                running.grpc, first, count, plan.agent_resources, plan.task_seconds, plan.batches
            )
            for first, count in split(plan.agents, plan.agent_procs)
        ]
        fw_specs = [
            _sim_frameworks.FrameworksSpec(
                running.grpc, first, count, plan.task, plan.tasks_per_offer, plan.batches
            )
            for first, count in split(plan.frameworks, plan.framework_procs)
        ]
        with (
            workers_of(_sim_agents.run, agent_specs) as agents,
            workers_of(_sim_frameworks.run, fw_specs) as frameworks,
        ):
            ask(agents, "start")
            wait_until(
                lambda: sum(r["registered"] for r in ask(agents, "report")) >= plan.agents,
                120,
                "agents registered",
            )
            ask(frameworks, "start")
            wait_until(
                lambda: sum(r["subscribed"] for r in ask(frameworks, "report")) >= plan.frameworks,
                60,
                "frameworks subscribed",
            )
            time.sleep(plan.warmup)
            everyone = agents + frameworks
            ask(everyone, "mark")
            cpu0, gen0, t0 = running.cpu(), sum(w.cpu() for w in everyone), time.monotonic()
            profiler = _profiler(master, running, plan.duration)
            time.sleep(plan.duration)
            fw_reports = ask(frameworks, "report")
            agent_reports = ask(agents, "report")
            t1 = time.monotonic()
            cpu1, gen1 = running.cpu(), sum(w.cpu() for w in everyone)
            rss = running.rss()
            if profiler is not None:
                profiler.wait()
                row.profile = summarise(profiler.out)
        elapsed = t1 - t0
        finished = sum(r["finished"] for r in fw_reports)
        latency = offer_latencies(
            [f for r in agent_reports for f in r["freed"]],
            [o for r in fw_reports for o in r["offered"]],
        )
        trip = [x for r in fw_reports for x in r["round_trip"]]
        offer50, offer95 = percentiles(latency)
        trip50, trip95 = percentiles(trip)
        row.figures = {
            "tasks/s": f"{finished / elapsed:,.0f}",
            "master CPU": f"{(cpu1 - cpu0) / elapsed:.0%}",
            "load generator CPU": f"{(gen1 - gen0) / elapsed:.0%}",
            "master RSS": _mb(rss),
            "offer latency p50/p95": f"{_ms(offer50)} / {_ms(offer95)}",
            "task round trip p50/p95": f"{_ms(trip50)} / {_ms(trip95)}",
            "offers/s": f"{sum(r['offers'] for r in fw_reports) / elapsed:,.0f}",
            "updates re-sent/s": f"{sum(r['retries'] for r in agent_reports) / elapsed:,.0f}",
        }
        other = _merge_counters(fw_reports, "other_ends")
        errors = _merge_counters(fw_reports, "errors") + _merge_counters(agent_reports, "failures")
        if other:
            row.notes.append(f"other ends: {dict(other)}")
        if errors:
            row.notes.append(f"errors: {dict(errors.most_common(5))}")
    finally:
        running.stop()
    if running.skipped:
        row.notes.append(f"settings this master lacks: {', '.join(running.skipped)}")
    return row


@dataclass(frozen=True)
class AgentsPlan:
    agents: int
    agent_resources: dict[str, float]
    agent_procs: int
    settle: float
    idle: float
    state_requests: int
    storm_timeout: float
    batches: bool


def agents_at_scale(master: MasterUnderTest, plan: AgentsPlan) -> Row:
    """A registration storm of `plan.agents`, then the master idle, then GET /state."""
    row = Row(master.label, f"{plan.agents:,} agents")
    running = RunningMaster(master)
    try:
        specs = [
            _sim_agents.AgentsSpec(
                running.grpc, first, count, plan.agent_resources, 0.0, plan.batches
            )
            for first, count in split(plan.agents, plan.agent_procs)
        ]
        with workers_of(_sim_agents.run, specs) as agents:
            cpu0 = running.cpu()
            ask(agents, "start")
            storm_start = time.monotonic()
            last: list[dict[str, Any]] = []

            def all_registered() -> bool:
                last[:] = ask(agents, "report")
                return sum(int(r["registered"]) for r in last) >= plan.agents

            try:
                storm = wait_until(all_registered, plan.storm_timeout, "all agents registered", 0.5)
                row.figures["storm: all registered in"] = f"{storm:.1f} s"
            except TimeoutError:
                registered = sum(r["registered"] for r in last)
                row.figures["storm: all registered in"] = (
                    f"not within {plan.storm_timeout:g} s ({registered:,} registered)"
                )
            storm_cpu = running.cpu() - cpu0
            storm_elapsed = time.monotonic() - storm_start
            failures = _merge_counters(last, "failures")
            row.figures["storm: refused or reset"] = f"{sum(failures.values()):,}" + (
                f" {dict(failures.most_common(3))}" if failures else ""
            )
            row.figures["storm: master CPU"] = f"{storm_cpu / storm_elapsed:.0%}"
            time.sleep(plan.settle)
            cpu0, t0 = running.cpu(), time.monotonic()
            profiler = _profiler(master, running, plan.idle)
            time.sleep(plan.idle)
            cpu1, t1 = running.cpu(), time.monotonic()
            if profiler is not None:
                profiler.wait()
                row.profile = summarise(profiler.out)
            row.figures["idle master CPU"] = f"{(cpu1 - cpu0) / (t1 - t0):.0%}"
            row.figures["master RSS"] = _mb(running.rss())
            timings = [running.get_state() for _ in range(plan.state_requests)]
            if timings:
                seconds = statistics.median(t for t, _ in timings)
                row.figures["GET /state (median)"] = (
                    f"{seconds:.2f} s, {timings[0][1] / 1e6:.1f} MB"
                )
            after = ask(agents, "report")
            lost = plan.agents - sum(r["registered"] for r in after)
            if lost:
                row.notes.append(f"{lost} agents lost their stream after registering")
            late = _merge_counters(after, "failures") - failures
            if late:
                row.notes.append(f"after the storm: {dict(late.most_common(3))}")
    finally:
        running.stop()
    if running.skipped:
        row.notes.append(f"settings this master lacks: {', '.join(running.skipped)}")
    return row


def _profiler(master: MasterUnderTest, running: RunningMaster, seconds: float) -> Profiler | None:
    if master.py_spy is None:
        return None
    return Profiler(master.py_spy, running.pid, seconds, master.log_dir / "profile.txt")


def print_table(rows: Sequence[Row], header: str) -> None:
    print(header)
    for scenario in dict.fromkeys(r.scenario for r in rows):
        group = [r for r in rows if r.scenario == scenario]
        measures = list(dict.fromkeys(k for r in group for k in r.figures))
        width = max(len(m) for m in measures) if measures else 10
        cols = [max(len(r.label), *(len(r.figures.get(m, "")) for m in measures)) for r in group]
        print(f"\n{scenario}")
        print(
            f"  {'measure':<{width}}  "
            + "  ".join(f"{r.label:>{c}}" for r, c in zip(group, cols, strict=True))
        )
        for m in measures:
            cells = "  ".join(
                f"{r.figures.get(m, '-'):>{c}}" for r, c in zip(group, cols, strict=True)
            )
            print(f"  {m:<{width}}  {cells}")
        for r in group:
            for note in r.notes:
                print(f"  ({r.label}: {note})")
        for r in group:
            if r.profile:
                print(f"\n  profile of the master ({r.label}), py-spy:")
                for line in r.profile:
                    print(f"    {line}")


def temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="mesolite-bench-"))
