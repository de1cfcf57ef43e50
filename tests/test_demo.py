"""`mesolite demo`: the scenario's DRF splits, the shares read from /state, and the demo
run as a user runs it (a subprocess): what it prints and in which order, where its logs
go, and that no process outlives it, after a full run or a Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import aiohttp
import pytest

from mesolite.lab.demo_scenario import AGENT_RESOURCES, JOBS, phases
from mesolite.lab.demo_table import NOTHING, DemoSample, Measured, measure, settled
from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import ClusterTotals
from tests.support.snapshots import empty_snapshot, framework_snapshot
from tests.waiting import within

CLUSTER = AGENT_RESOURCES + AGENT_RESOURCES + AGENT_RESOURCES


@pytest.mark.unit
def test_each_phase_has_drfs_split_in_whole_tasks_that_fit_the_agents() -> None:
    split = [
        {
            name: (e.tasks, Fraction(e.dominant_share).limit_denominator(100))
            for name, e in p.expected.items()
        }
        for p in phases(60, CLUSTER)
    ]
    assert split == [
        {"cpu-heavy": (20, Fraction(2, 3)), "memory-heavy": (10, Fraction(2, 3))},
        {
            "cpu-heavy": (12, Fraction(2, 5)),
            "memory-heavy": (6, Fraction(2, 5)),
            "balanced": (12, Fraction(2, 5)),
        },
        {"cpu-heavy": (15, Fraction(1, 2)), "balanced": (15, Fraction(1, 2))},
    ]
    tasks = {job.name: job.task for job in JOBS}
    for phase in phases(60, CLUSTER):
        # Dealt out round robin, largest first, the split fits on the three agents: the
        # demo's measured shares can reach it.
        agents = [Resources()] * 3
        dealt = 0
        for name in sorted(phase.expected, key=lambda n: -tasks[n]["mem"]):
            for _ in range(int(phase.expected[name].tasks)):
                agents[dealt % 3] = agents[dealt % 3] + tasks[name]
                dealt += 1
        assert all(AGENT_RESOURCES.contains(held) for held in agents), (phase.number, agents)


@pytest.mark.unit
def test_phases_scale_with_the_duration_and_say_what_happens() -> None:
    assert [(p.start, p.end, p.event) for p in phases(30, CLUSTER)] == [
        (0.0, 10.0, "cpu-heavy and memory-heavy start"),
        (10.0, 20.0, "balanced joins"),
        (20.0, 30.0, "memory-heavy finishes"),
    ]


@pytest.mark.unit
def test_shares_are_measured_from_what_the_tasks_hold() -> None:
    memory_heavy = framework_snapshot(
        id="F1",
        name="memory-heavy",
        allocated=Resources(cpus=12, mem=61440),
        used=Resources(cpus=10, mem=61440),
        offered=Resources(cpus=2),
        dominant_share=2 / 3,
        weighted_dominant_share=2 / 3,
        running_tasks=10,
        used_dominant_share=2 / 3,
    )
    total = Resources(cpus=30, mem=92160)
    snapshot = empty_snapshot(
        cluster=ClusterTotals(total, total, EMPTY, 3, 1, 10, 1), frameworks=(memory_heavy,)
    )
    measured = measure(snapshot, ["memory-heavy", "balanced"])
    assert measured["balanced"] == NOTHING  # not registered (yet, or any more)
    m = measured["memory-heavy"]
    assert (m.tasks, round(m.cpu_share, 3), round(m.mem_share, 3)) == (10, 0.333, 0.667)
    assert round(m.dominant_share, 3) == 0.667  # memory: its dominant resource


@pytest.mark.unit
def test_a_phase_is_judged_on_its_second_half() -> None:
    first = phases(30, CLUSTER)[0]  # 0-10 s
    samples = [
        DemoSample(t, {"cpu-heavy": Measured(n, n / 30, 0.0, n / 30)})
        for t, n in [(1.0, 0), (4.0, 10), (5.0, 18), (9.5, 20), (10.0, 12)]
    ]
    rows = [r for r in settled([first], samples) if r.job == "cpu-heavy"]
    assert [(r.samples, r.tasks, r.expected_tasks) for r in rows] == [(2, 19.0, 20.0)]


# -- the demo as a user runs it -------------------------------------------------------------

MESOLITE = Path(sys.executable).with_name("mesolite")
# What structlog's console renderer puts on every line: none may reach the terminal.
LOG_LINE = re.compile(r"\[(debug|info|warning|error|critical)\s*\]")
SUMMARY_ROW = re.compile(
    r"^\s*(\d) \(\d+-\d+s\)\s+(\S+)\s+([\d.]+)\s+(\d+)\s+(\d+)%\s+(\d+)%\s*$", re.MULTILINE
)


@dataclass
class DemoRun:
    process: asyncio.subprocess.Process
    first_line: str
    url: str  # the web UI's, from the first line
    work_dir: Path

    async def finish(self, timeout: float) -> tuple[str, str]:
        out, err = await within(self.process.communicate(), timeout, "the demo to end")
        return self.first_line + out.decode(), err.decode()


@asynccontextmanager
async def demo(
    work_dir: Path,
    *args: str,
    command: Path = MESOLITE,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[DemoRun]:
    """Start `mesolite demo` and read its first line; kill it if the test fails early."""
    process = await asyncio.create_subprocess_exec(
        str(command),
        "demo",
        "--work-dir",
        str(work_dir),
        "--http-port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd or work_dir.parent,
        env=env,
    )
    try:
        assert process.stdout is not None
        first = (await within(process.stdout.readline(), 60, "the demo's first line")).decode()
        found = re.search(r"web UI at (http://127\.0\.0\.1:\d+/)", first)
        assert found, f"the first line does not give the web UI's address: {first!r}"
        yield DemoRun(process, first, found.group(1), work_dir)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, response.content_type, await response.text()


def processes_under(root: Path) -> list[str]:
    """Processes whose working directory or command line lies under `root` (an agent's
    task wrapper names its sandbox; the task itself runs in it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or not ours to look at
        if cwd.startswith(str(root)) or str(root) in cmdline:
            found.append(f"{pid}: {cmdline.strip()} (in {cwd})")
    return found


def check_quiet_and_logged(output: str, err: str, work_dir: Path) -> None:
    """The terminal shows the demo's own lines only; every log line went to a file."""
    assert err == "", err
    assert "Traceback" not in output
    assert not LOG_LINE.search(output), [
        line for line in output.splitlines() if LOG_LINE.search(line)
    ]
    logs = work_dir / "logs"
    expected = {
        "master.log": "master started",
        "agents.log": "agent starting",
        "frameworks.log": "subscribed",
    }
    for name, line in expected.items():
        assert line in (logs / name).read_text(), f"{name} lacks {line!r}"
    assert (logs / "demo.log").exists()
    last = output.rstrip().splitlines()[-1]
    assert last.startswith(f"logs: {logs}/ (master.log, agents.log, frameworks.log, demo.log)"), (
        output[-500:]
    )


@pytest.mark.slow
async def test_the_demo_shows_shares_moving_to_each_drf_split(tmp_path: Path) -> None:
    """A 30 s run: three 10 s phases, tasks of 1.3-2.7 s."""
    async with demo(tmp_path / "demo", "--duration", "30", "--task-seconds", "2") as run:
        # The address is the live master's: it serves the web UI and /state.
        status, content_type, _ = await get(run.url)
        assert (status, content_type) == (200, "text/html")
        status, _, _ = await get(run.url + "state")
        assert status == 200
        output, err = await run.finish(timeout=120)
    assert run.process.returncode == 0, output + err
    check_quiet_and_logged(output, err, run.work_dir)
    lines = output.splitlines()
    timeline = [line for line in lines if re.match(r"(\[\s*\d+s\]|\s+DRF: )", line)]
    times = [int(m.group(1)) for m in map(re.compile(r"\[\s*(\d+)s\]").match, timeline) if m]
    events = [re.sub(r"^\[\s*\d+s\]", "", line).strip() for line in timeline]
    assert events == [
        "phase 1: cpu-heavy and memory-heavy start",
        "DRF: cpu-heavy 20 tasks (67%), memory-heavy 10 (67%)",
        "phase 2: balanced joins",
        "DRF: cpu-heavy 12 tasks (40%), memory-heavy 6 (40%), balanced 12 (40%)",
        "phase 3: memory-heavy finishes",
        "DRF: cpu-heavy 15 tasks (50%), balanced 15 (50%)",
        "memory-heavy's last task ended: it unregistered",
    ], output
    # Phases start on time (give or take a late tick); memory-heavy leaves within its
    # longest task.
    assert all(abs(t - at) <= 1 for t, at in zip(times, [0, 10, 20], strict=False)), times
    assert 20 <= times[3] <= 24, times

    # Each phase's second half, averaged, against DRF's split. Tolerance: 1.5 tasks, or
    # a fifth of the split for large ones. Tasks are whole; a task that ends is replaced
    # only after its status update, the next allocation cycle (<= 0.5 s) and a process
    # start, a gap that on a loaded two-core machine reaches a tenth of a 2 s task.
    rows = {(int(m[0]), m[1]): (float(m[2]), int(m[3])) for m in SUMMARY_ROW.findall(output)}
    assert set(rows) == {
        (1, "cpu-heavy"),
        (1, "memory-heavy"),
        (2, "cpu-heavy"),
        (2, "memory-heavy"),
        (2, "balanced"),
        (3, "cpu-heavy"),
        (3, "balanced"),
    }, output
    for (phase, job), (tasks, drf_tasks) in rows.items():
        assert abs(tasks - drf_tasks) <= max(1.5, drf_tasks / 5), (phase, job, tasks, drf_tasks)
    # And the shares moved: down when balanced joined, up when memory-heavy left.
    assert rows[(2, "cpu-heavy")][0] < rows[(1, "cpu-heavy")][0]
    assert rows[(2, "memory-heavy")][0] < rows[(1, "memory-heavy")][0]
    assert rows[(3, "cpu-heavy")][0] > rows[(2, "cpu-heavy")][0]
    assert rows[(3, "balanced")][0] > rows[(2, "balanced")][0]
    assert (run.work_dir / "shares.csv").read_text().startswith("time_s,job,")
    assert processes_under(run.work_dir) == []


async def test_ctrl_c_stops_the_jobs_agents_and_tasks_cleanly(tmp_path: Path) -> None:
    async with demo(tmp_path / "demo", "--duration", "600") as run:

        async def cpus_busy() -> bool:
            _, _, text = await get(run.url + "state")
            return bool(json.loads(text)["cluster"]["running_tasks"] >= 20)

        await eventually(cpus_busy, 60, "20 tasks or more running")
        assert processes_under(run.work_dir), "the tasks should be running"
        run.process.send_signal(signal.SIGINT)
        output, err = await run.finish(timeout=60)
    assert run.process.returncode == 0, output + err
    assert "Ctrl-C: stopping the jobs, agents and master" in output
    assert "stopped in" in output
    check_quiet_and_logged(output, err, run.work_dir)
    assert processes_under(run.work_dir) == []


# -- from a wheel, without the clone -------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


async def run(*command: str | Path, cwd: Path, timeout: float, env: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        *map(str, command),
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await within(process.communicate(), timeout, " ".join(map(str, command)))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, out.decode()
    return out.decode()


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_wheel_installed_in_a_fresh_venv_runs_the_demo(tmp_path: Path) -> None:
    """The package alone (no examples/, no tests/, no clone) has everything the demo runs.
    Needs the package index for the dependencies; about a minute, most of it pip."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Built from a copy, so that the build leaves nothing in the clone.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "work-dirs", "__pycache__", ".*_cache"
        ),
    )
    dist = tmp_path / "dist"
    await run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source,
        cwd=tmp_path, timeout=300, env=env,
    )  # fmt: skip
    (wheel,) = dist.glob("mesolite-*.whl")
    venv = tmp_path / "venv"
    await run(sys.executable, "-m", "venv", venv, cwd=tmp_path, timeout=120, env=env)
    python = venv / "bin" / "python"
    await run(python, "-m", "pip", "install", wheel, cwd=tmp_path, timeout=400, env=env)

    elsewhere = tmp_path / "elsewhere"  # nowhere near a clone
    elsewhere.mkdir()
    where = await run(
        python, "-c", "import mesolite.master, mesolite.agent, mesolite.framework_sdk as sdk; "
        "print(mesolite.__file__, mesolite.master.__file__, mesolite.agent.__file__, sdk.__file__)",
        cwd=elsewhere, timeout=60, env=env,
    )  # fmt: skip
    assert all(path.startswith(str(venv)) for path in where.split()), where
    # The wheel claims no generic top-level name (only `mesolite`).
    site = next(venv.glob("lib/python*/site-packages"))
    top_level = {p.name for p in site.iterdir() if not p.name.startswith(("_", "."))}
    assert not {"master", "agent", "framework_sdk"} & top_level, top_level
    async with demo(
        elsewhere / "demo",
        "--duration", "12", "--task-seconds", "2",
        command=venv / "bin" / "mesolite", cwd=elsewhere, env=env,
    ) as run_:  # fmt: skip
        output, err = await run_.finish(timeout=120)
    assert run_.process.returncode == 0, output + err
    check_quiet_and_logged(output, err, run_.work_dir)
    assert "phase 2: balanced joins" in output
    assert "phase 3: memory-heavy finishes" in output
    assert len(SUMMARY_ROW.findall(output)) == 7, output
    assert processes_under(tmp_path) == []
