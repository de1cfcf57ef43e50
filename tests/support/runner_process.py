"""A task runner in a process of its own, as an agent runs one, for tests that SIGKILL it.

    python -m tests.support.runner_process [--cgroups ROOT] WORK_DIR COMMAND...

Launches one task per COMMAND (task ids ``t0``, ``t1``, ...) under framework
``fw-1``, prints ``running <supervisor pid>`` once every task is TASK_RUNNING,
then prints each transition as it happens and runs until killed. Tasks run
unconfined (the process-tree fallback), as the test's own user; with ``--cgroups``,
each in a cgroup under ROOT, as the task user (so the supervisor spawns them itself).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from mesolite import logs
from mesolite.agent.isolation import IsolationConfig, Isolator
from mesolite.agent.tasks import TaskRunner, TaskTransition
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources

FW = "fw-1"


async def main(work_dir: Path, commands: list[str], cgroups_root: str | None = None) -> None:
    running: set[str] = set()
    all_running = asyncio.Event()

    def report(t: TaskTransition) -> None:
        print(f"{t.task_id} {t.state.value} {t.exit_code}", flush=True)
        if t.state is TaskState.RUNNING:
            running.add(t.task_id)
            if len(running) == len(commands):
                all_running.set()

    isolator = None
    if cgroups_root is not None:
        config = IsolationConfig(cgroups_root=cgroups_root)
        isolator = Isolator(config, work_dir, announce=False)
    runner = TaskRunner(work_dir, report, isolator=isolator)
    for i, command in enumerate(commands):
        runner.launch(FW, TaskSpec(f"t{i}", command, Resources(cpus=0.1, mem=32)))
    await all_running.wait()
    print(f"running {runner.supervisor_pid}", flush=True)
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    logs.configure(level="warning")
    args = sys.argv[1:]
    root = None
    if args[:1] == ["--cgroups"]:
        root, args = args[1], args[2:]
    asyncio.run(main(Path(args[0]), args[1:], root))
