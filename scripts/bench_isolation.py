"""What containment costs a task's launch: the same tasks with a cgroup each and with
the process-tree fallback, side by side.

    python scripts/bench_isolation.py [--tasks 40] [--command true]

One agent's task runner (no master, no network) launches `--tasks` tasks one after
the other in each mode, alternating modes task by task so that a busy machine
weighs on both alike, and times, per task, the launch until TASK_RUNNING (sandbox,
cgroup and its limits, checkpoint, wrapper started and the command in its cgroup)
and until its end is reported (the command ran, the cgroup was killed, read and
removed). Both modes switch to the task user when run as root. Prints the medians
and 90th percentiles in milliseconds. Needs root for the cgroup mode; cleans up its
work dir and cgroups.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from mesolite import logs
from mesolite.agent._cgroups import parse_mounts
from mesolite.agent._task_wrapper import kill_cgroup
from mesolite.agent.isolation import IsolationConfig, Isolator
from mesolite.agent.tasks import TaskRunner, TaskTransition
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources


class Timings:
    def __init__(self) -> None:
        self.launched: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.states: dict[str, TaskState] = {}
        self.done = asyncio.Event()

    def __call__(self, t: TaskTransition) -> None:
        now = time.perf_counter()
        if t.state is TaskState.RUNNING:
            self.running[t.task_id] = now
        elif t.state.is_terminal:
            self.ended[t.task_id] = now
            self.states[t.task_id] = t.state
            self.done.set()


async def run_one(runner: TaskRunner, timings: Timings, task_id: str, command: str) -> None:
    timings.done.clear()
    timings.launched[task_id] = time.perf_counter()
    runner.launch("bench", TaskSpec(task_id, command, Resources(cpus=0.1, mem=64)))
    while task_id not in timings.ended:
        await timings.done.wait()
        timings.done.clear()


def summary(timings: Timings, ids: list[str]) -> tuple[float, float, float, float]:
    to_running = [(timings.running[i] - timings.launched[i]) * 1000 for i in ids]
    to_end = [(timings.ended[i] - timings.launched[i]) * 1000 for i in ids]
    return (
        statistics.median(to_running),
        statistics.quantiles(to_running, n=10)[-1],
        statistics.median(to_end),
        statistics.quantiles(to_end, n=10)[-1],
    )


def _cgroup_round_trip(isolator: Isolator, name: str) -> float:
    """Milliseconds to create a task's cgroup with its limits and to clean it up."""
    started = time.perf_counter()
    container = isolator.create(name, {"cpus": 0.1, "mem": 64}, isolator.user)
    container.clean_up()
    return (time.perf_counter() - started) * 1000


def remove_cgroups(root: str) -> None:
    v2, v1 = parse_mounts(Path("/proc/self/mounts").read_text())
    for mount in {*v1.values(), *([v2] if v2 else [])}:
        top = mount / root
        if top.is_dir():
            for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                kill_cgroup([Path(directory)])
                with contextlib.suppress(OSError):
                    Path(directory).rmdir()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=40, help="tasks per mode")
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    logs.configure(level="warning")
    root = f"mesolite-bench-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="mesolite-bench-"))
    modes = {"cgroups": "auto", "process-tree": "process-tree"}
    timings = {name: Timings() for name in modes}
    runners = {}
    try:
        for name, mode in modes.items():
            config = IsolationConfig(mode=mode, cgroups_root=root)
            isolator = Isolator(config, work / name, announce=False)
            if name == "cgroups" and isolator.mode.value == "process-tree":
                print(f"no cgroups here ({isolator.fallback_reason}): run as root")
                return 2
            runners[name] = (TaskRunner(work / name, timings[name], isolator=isolator), isolator)
        for i in range(args.tasks + 2):  # the first two of each are warm-up
            for name, (runner, _) in runners.items():
                await run_one(runner, timings[name], f"t{i}", args.command)
        ids = [f"t{i}" for i in range(2, args.tasks + 2)]
        print(
            f"{args.tasks} tasks per mode, `{args.command}`, alternating; "
            f"milliseconds (median / p90); {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(f"{'mode':<16}{'to RUNNING':>20}{'to its end reported':>24}")
        for name, (_, isolator) in runners.items():
            bad = [i for i in ids if timings[name].states[i] is not TaskState.FINISHED]
            run_med, run_p90, end_med, end_p90 = summary(timings[name], ids)
            label = isolator.mode.value
            print(
                f"{label:<16}{run_med:>11.1f} / {run_p90:<7.1f}{end_med:>15.1f} / {end_p90:<7.1f}"
                + (f"  ({len(bad)} did not finish)" if bad else "")
            )
        _, isolator = runners["cgroups"]
        setup = [_cgroup_round_trip(isolator, f"alone-{i}") for i in range(args.tasks)]
        print(
            f"{'of which: a cgroup created with its limits, then killed, read and removed':<60}"
            f"{statistics.median(setup):>8.1f} / {statistics.quantiles(setup, n=10)[-1]:.1f}"
        )
    finally:
        for runner, _ in runners.values():
            await runner.shutdown()
            runner.close()
        remove_cgroups(root)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
