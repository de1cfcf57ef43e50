"""Running tasks as shell commands, each in its own sandbox, and finding them again
after the agent restarts. No gRPC here.

`TaskRunner` keeps the agent's tasks: which run, which ended, what each went
through; it reports every transition. Each run's process (its wrapper, its kill,
how it ended) is `agent/_task_process.py`'s.

    <work_dir>/sandboxes/<framework_id>/<task_id>/     (sandboxes, <framework_id>: 0711)
        stdout, stderr   the command's output; the rest is the task's (0700, its user's)
    <work_dir>/tasks.jsonl                          (0600, the agent's only)
        the agent's checkpoints of its tasks, one line each time (`agent/_task_log.py`)
    <work_dir>/meta/<framework_id>/<task_id>/      (meta: 0700, the agent's only; only
                                                    for a task run by a wrapper)
        exit.json        written by the wrapper when the command ends
        wrapper.json     the wrapper's pid, written by the wrapper as it starts
    <work_dir>/supervisor/                          (0700, the agent's only)
        socket, supervisor.log    the supervisor that forks wrappers (`agent/_supervisor.py`)

How a task is contained (its cgroup and limits, its user, its environment) is
`agent/isolation.py`'s; the `Isolator` the runner is given decides.

A task's checkpoint holds the task, its run id (one per launch of a task id), its
framework's user as the launch named it, the wrapper's pid and start time
(field 22 of /proc/<pid>/stat: a pid alone may be reused), its container (cgroup,
limits, user), the state, `killing` once a kill has started and, when the agent saw
the task end, how it ended. It is written (a line appended to the task log, in a
group commit with other tasks') at launch (STARTING, no pid yet: fsynced before the
command is started), once the command runs (not fsynced: a pid is of no use after a
crash of the machine), when a kill starts and at the end (both fsynced).

Every accepted launch reports TASK_STARTING, then TASK_RUNNING once the wrapper
exists, then exactly one terminal state: TASK_FINISHED (exit status 0),
TASK_FAILED (non-zero exit, killed by a signal nobody asked for, by a limit of
its container (the message says which, and the reason names it), the command
could not be started, or its wrapper died without recording a status) or
TASK_KILLED (killed on request).

The terminal state is reported first and checkpointed second: the status
callback returns an awaitable that resolves once the update is durable (the
agent journals it), and only then does the checkpoint say the task ended. A
restarted agent hands `recover()` the ends it has journaled, so a crash between
the two steps neither loses the end nor reports it twice.

`recover()` on start-up, for each checkpoint that does not say the task ended:

* its end is in the journal: only the checkpoint is brought up to date;
* the wrapper is alive (pid and start time match): the task is re-attached,
  RUNNING, and watched with a pidfd; a kill that was under way is resumed;
* the wrapper is gone and `exit.json` exists: the task ended while the agent
  was down, and is reported as it ended (KILLED if a kill had been started);
* the wrapper is gone without `exit.json`: TASK_FAILED, "the task's wrapper
  died while the agent was down" (KILLED if a kill had been started).

A task that ended has its cgroup killed and removed. After recovery, any cgroup
in the agent's scope that no recovered task owns (its checkpoint was lost, or
the agent died between creating it and checkpointing it) is killed and removed.

A task that ended stays in `ended_tasks()` until the agent says its terminal
update was acknowledged (`acknowledged_end`), so that re-registration can tell
the master about tasks whose end it may not have heard of yet.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import structlog

from mesolite.agent._procs import signal_group
from mesolite.agent._supervisor_client import SupervisorClient
from mesolite.agent._task_log import TASK_LOG_FILE, TaskLog, TaskLogWriter, record_key
from mesolite.agent._task_process import TaskProcesses
from mesolite.agent._task_records import (
    CHECKPOINT_FILE,
    EXIT_FILE,
    RECORDS_DIR,
    SANDBOXES_DIR,
    WRAPPER_FILE,
    EndedTask,
    StatusCallback,
    TaskRun,
    TaskTransition,
    check_id,
    new_run_id,
    scan_checkpoints,
    task_from_checkpoint,
)
from mesolite.agent.errors import AgentError
from mesolite.agent.isolation import Isolator, UsageMeter
from mesolite.model import RunningTask, TaskSpec, TaskState, TaskUsage
from mesolite.resources import EMPTY, Resources

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD = 3.0
SUPERVISOR_DIR = "supervisor"  # under the work dir: the supervisor's socket and log (0700)


class TaskRunner:
    """Starts, watches, kills and recovers task processes; reports each transition.

    `on_status` is called synchronously on the event loop, in the order the
    transitions happen; it must not block. It may return an awaitable that
    resolves once the transition is durable: the runner then checkpoints a
    task's end only after that.

    `isolator` contains the tasks (`agent/isolation.py`); without one, tasks run
    unconfined as the runner's own user (process-tree kill, no limits), which
    only tests and embedders want. `spawn` False: a wrapper per task even where the
    supervisor could start the command itself (`agent/_task_process.py`).
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        on_status: StatusCallback,
        *,
        kill_grace_period: float = DEFAULT_KILL_GRACE_PERIOD,
        shell: str = "/bin/sh",
        isolator: Isolator | None = None,
        spawn: bool = True,
    ) -> None:
        self._work_dir = Path(work_dir).absolute()
        self._sandboxes = self._work_dir / SANDBOXES_DIR
        self._records = self._work_dir / RECORDS_DIR
        self._on_status = on_status
        self.isolator = isolator or Isolator.unconfined()
        self._supervisor = SupervisorClient(
            self._work_dir / SUPERVISOR_DIR, self.isolator.supervisor_cgroup
        )
        self._checkpoints = TaskLogWriter(TaskLog(self._work_dir / TASK_LOG_FILE), self.live_keys)
        self._processes = TaskProcesses(
            self._report,
            checkpoints=self._checkpoints,
            shell=shell,
            kill_grace_period=kill_grace_period,
            isolator=self.isolator,
            supervisor=self._supervisor,
            spawn=spawn,
        )
        self._tasks: dict[tuple[str, str], TaskRun] = {}
        self._used = EMPTY  # what the tasks in `_tasks` were given, kept as they come and go
        self._ended: dict[tuple[str, str], EndedTask] = {}
        self._finishing: set[tuple[str, str]] = set()  # ended, end checkpoint not yet written
        self._meter = UsageMeter()
        self._activity: Counter[TaskState] = Counter()  # transitions, by state

    @property
    def supervisor_pid(self) -> int | None:
        """The pid of the supervisor this runner last reached (`agent/_supervisor.py`)."""
        return self._supervisor.pid

    def sandbox_path(self, framework_id: str, task_id: str) -> Path:
        return self._sandboxes / framework_id / task_id

    def records_path(self, framework_id: str, task_id: str) -> Path:
        """Where a task's wrapper keeps its `exit.json` and `wrapper.json`."""
        return self._records / framework_id / task_id

    def is_active(self, framework_id: str, task_id: str) -> bool:
        """True from launch until the terminal transition has been reported."""
        return (framework_id, task_id) in self._tasks

    def used(self) -> Resources:
        """What the tasks not yet ended were given, in O(1)."""
        return self._used

    def running_tasks(self) -> list[RunningTask]:
        """Tasks not yet in a terminal state, with their current state."""
        return [RunningTask(t.framework_id, t.spec, t.state) for t in self._tasks.values()]

    async def sample_usage(self) -> list[TaskUsage]:
        """What each running task uses now, from its cgroup (none without cgroups)."""
        runs = [
            (t.run_id, t.framework_id, t.spec.task_id, t.container)
            for t in self._tasks.values()
            if t.state is TaskState.RUNNING and t.container is not None and t.container.cgroup
        ]
        return await asyncio.to_thread(self._meter.measure, runs) if runs else []

    def live_keys(self) -> set[tuple[str, str]]:
        """(framework id, task id) of every task whose sandbox must stay: active, or
        ended with its end not yet acknowledged (`agent/gc_policy.py`)."""
        return set(self._tasks) | set(self._ended) | self._finishing

    def ended_tasks(self) -> list[RunningTask]:
        """Tasks that ended but whose end is not known to be acknowledged, in their end
        state (they hold nothing; the master forwards their updates when they come)."""
        return [e.task for key, e in self._ended.items() if key not in self._tasks]

    def acknowledged_end(self, framework_id: str, task_id: str, run_id: str) -> None:
        """The terminal update of run `run_id` was acknowledged: forget that run."""
        ended = self._ended.get((framework_id, task_id))
        if ended is not None and ended.run_id == run_id:
            del self._ended[(framework_id, task_id)]

    def forget_ended(self) -> None:
        """Forget every ended task, e.g. when the master no longer knows this agent."""
        self._ended.clear()

    def launch(self, framework_id: str, task: TaskSpec, user: str = "") -> bool:
        """Start `task` in the background; False if it was not started.

        `user`: its framework's user (""), whom it runs as where the agent switches
        users (`Isolator.user_for`); a user this agent does not have fails the task.

        A task id that is already active is a duplicate: it is logged and
        ignored, leaving the running task alone. Ids that cannot name a sandbox
        directory are reported as TASK_FAILED straight away.
        """
        bound = log.bind(framework_id=framework_id, task_id=task.task_id)
        key = (framework_id, task.task_id)
        if key in self._tasks:
            bound.warning("duplicate launch ignored: task is already active")
            return False
        problem = check_id("framework id", framework_id) or check_id("task id", task.task_id)
        if problem:
            bound.warning("launch rejected", reason=problem)
            self._report(TaskTransition(framework_id, task.task_id, TaskState.FAILED, problem))
            return False
        t = TaskRun(
            framework_id,
            task,
            self.sandbox_path(framework_id, task.task_id),
            new_run_id(),
            self.records_path(framework_id, task.task_id),
            user=user,
        )
        previous = self._ended.get(key)
        t.previous = previous.lifecycle if previous is not None else None
        self._add(t)
        bound.debug(  # per task at debug: counted in the activity line (`take_activity`)
            "task starting",
            sandbox=str(t.sandbox),
            command=task.command,
            resources=str(task.resources),
            run_id=t.run_id,
            user=user or None,
        )
        self._report(
            TaskTransition(framework_id, task.task_id, TaskState.STARTING, run_id=t.run_id)
        )
        t.lifecycle = asyncio.create_task(self._lifecycle(t), name=f"task-{task.task_id}")
        return True

    def kill(self, framework_id: str, task_id: str) -> None:
        """SIGTERM the task's process group, then, after the grace period, SIGKILL
        everything in its container."""
        t = self._tasks.get((framework_id, task_id))
        if t is None:
            log.info(
                "kill ignored: no such active task", framework_id=framework_id, task_id=task_id
            )
            return
        self._processes.request_kill(t)

    async def shutdown(self) -> None:
        """Kill every active task and wait until all of them have ended.

        The runner stays usable: tasks can be launched again afterwards.
        """
        tasks = list(self._tasks.values())
        if tasks:
            log.info("killing all tasks", count=len(tasks))
        for t in tasks:
            self._processes.request_kill(t)
        await asyncio.gather(*(t.lifecycle for t in tasks if t.lifecycle), return_exceptions=True)
        if not self._tasks:
            # No wrapper is left: the supervisor exits once told no agent is listening.
            await self._supervisor.stop()
            await asyncio.to_thread(self.isolator.remove_supervisor_cgroup)

    async def recover(self, journaled_ends: Mapping[tuple[str, str], TaskTransition]) -> None:
        """Take back the tasks a previous agent process left in the sandboxes.

        `journaled_ends` holds, per task, the terminal transition whose update
        is still pending in the agent's journal, if any. Call once, before any
        launch. See the module docstring for what happens to each task.
        """
        # The supervisor a previous agent left, if it runs: it lists the wrappers it
        # forked, among them any that has not recorded its pid yet.
        try:
            await self._supervisor.connect(start=False)
        except (OSError, AgentError) as e:
            log.warning("could not reach the supervisor", error=str(e))
        # Until it is known which tasks are live, a compaction could drop one.
        self._checkpoints.may_compact = False
        for records, record in await self._checkpoints_found():
            sandbox = self._sandboxes / records.parent.name / records.name
            try:
                t = task_from_checkpoint(records, sandbox, record)
            except (KeyError, TypeError, ValueError) as e:
                log.warning(
                    "ignoring an unreadable task checkpoint", path=str(records), error=str(e)
                )
                continue
            end = journaled_ends.get(t.key)
            journaled = end is not None and end.run_id == t.run_id
            if t.state.is_terminal or journaled:
                if journaled:
                    assert end is not None
                    self._ended[t.key] = EndedTask(
                        RunningTask(t.framework_id, t.spec, end.state), t.run_id, None
                    )
                if journaled and not t.state.is_terminal:
                    assert end is not None
                    # The agent stopped between journaling the end and checkpointing it.
                    t.state = end.state
                    await self._checkpoints.checkpoint(t, end)
                continue  # its cgroup, if the agent died before removing it: an orphan below
            self._add(t)
            log.info(
                "task recovered",
                framework_id=t.framework_id,
                task_id=t.spec.task_id,
                run_id=t.run_id,
                pid=t.pid,
                killing=t.kill_requested,
            )
            t.lifecycle = asyncio.create_task(self._lifecycle(t), name=f"task-{t.spec.task_id}")
        self._checkpoints.may_compact = True
        # Only now: a recovered task's lifecycle may still be reading its cgroup.
        live = {t.run_id for t in self._tasks.values()}
        orphans = await asyncio.to_thread(self.isolator.remove_orphans, live)
        if orphans:
            log.warning("removed cgroups that no task owned", count=orphans)

    async def _checkpoints_found(self) -> list[tuple[Path, dict[str, Any]]]:
        """(records directory, checkpoint) of every task in the task log; checkpoints an
        agent from before the log left as files (`task.json`) are moved into it."""
        logged = await self._checkpoints.load()
        legacy = await asyncio.to_thread(scan_checkpoints, self._work_dir)
        moved, stale = [], []
        for records, record in legacy:
            key = (records.parent.name, records.name)
            if key in logged:
                stale.append(records)  # the log has a later one
                continue
            try:
                if record_key(record) != key:
                    raise ValueError("the checkpoint names another task")
            except (KeyError, TypeError, ValueError) as e:
                log.warning(
                    "ignoring an unreadable task checkpoint", path=str(records), error=str(e)
                )
                continue
            logged[key] = {**record, "records": str(records)}
            moved.append((records, self._checkpoints.write(logged[key], durable=True)))
        written: list[Path] = []
        if moved:
            await asyncio.wait({future for _, future in moved})
            written = [r for r, f in moved if f.result()]
            log.info("moved task checkpoints into the task log", count=len(written))
        if written or stale:
            await asyncio.to_thread(_remove_legacy, written + stale)
        return [
            (Path(record.get("records") or self.records_path(*key)), record)
            for key, record in logged.items()
        ]

    def close(self) -> None:
        """The agent stops for good: give up what the isolator holds (its empty scope)."""
        self._checkpoints.close()
        self.isolator.close()

    # Internals, in the order a task goes through them.

    def take_activity(self) -> dict[str, int]:
        """How many tasks entered each state since the last take (e.g. ``task_running``),
        none that are 0; the agent logs them as one info line a period."""
        counts = {
            f"tasks_{state.value.removeprefix('TASK_').lower()}": n
            for state, n in sorted(self._activity.items(), key=lambda kv: kv[0].value)
        }
        self._activity.clear()
        return counts

    def _report(self, transition: TaskTransition) -> Awaitable[None] | None:
        self._activity[transition.state] += 1
        try:
            return self._on_status(transition)
        except Exception:
            # A broken callback must not leave a task half-tracked.
            log.exception(
                "status callback failed",
                framework_id=transition.framework_id,
                task_id=transition.task_id,
                state=transition.state.value,
            )
            return None

    async def _lifecycle(self, t: TaskRun) -> None:
        try:
            if t.previous is not None:
                # The earlier run's last checkpoint must land before this run's first.
                await asyncio.wait({t.previous})
            try:
                final = await self._processes.run(t)
            except Exception as e:
                log.exception("running the task failed", task_id=t.spec.task_id)
                final = t.transition(TaskState.FAILED, f"the agent failed to run it: {e}")
        except asyncio.CancelledError:
            # Cancelled from outside, e.g. the loop is closing: leave no process behind.
            pid = t.pid if t.pid is not None else t.wrapper_pid
            if t.container is not None:
                t.container.kill(pid if not t.exited.is_set() else None)
                t.container.clean_up()
            elif pid is not None and not t.exited.is_set():
                signal_group(pid, signal.SIGKILL)
            self._remove(t)
            raise
        finally:
            if t.escalation is not None:
                t.escalation.cancel()
        await self._finish(t, final)

    def _add(self, t: TaskRun) -> None:
        self._tasks[t.key] = t
        self._used = self._used + t.spec.resources

    def _remove(self, t: TaskRun) -> None:
        if self._tasks.get(t.key) is t:
            del self._tasks[t.key]
            self._used = self._used - t.spec.resources

    async def _finish(self, t: TaskRun, final: TaskTransition) -> None:
        self._finishing.add(t.key)
        try:
            await self._end(t, final)
        finally:
            self._finishing.discard(t.key)

    async def _end(self, t: TaskRun, final: TaskTransition) -> None:
        self._remove(t)
        self._ended[t.key] = EndedTask(
            RunningTask(t.framework_id, t.spec, final.state), t.run_id, asyncio.current_task()
        )
        # A task that finished: at debug (counted in the activity line); any other end
        # at info, with why.
        (log.debug if final.state is TaskState.FINISHED else log.info)(
            "task ended",
            framework_id=t.framework_id,
            task_id=t.spec.task_id,
            state=final.state.value,
            exit_code=final.exit_code,
            message=final.message,
            reason=final.reason or None,
        )
        durable = self._report(final)
        if durable is not None:
            # Not `await`: a journal that shut down cancels its futures, and the
            # checkpoint below is still worth writing then.
            await asyncio.wait({asyncio.ensure_future(durable)})
        if t.sandbox_ready:
            await self._checkpoints.checkpoint(t, final)


def _remove_legacy(records: list[Path]) -> None:
    """Remove the `task.json` in each of `records`, now in the task log. Blocking."""
    for directory in records:
        (directory / CHECKPOINT_FILE).unlink(missing_ok=True)


__all__ = [
    "CHECKPOINT_FILE",
    "EXIT_FILE",
    "RECORDS_DIR",
    "SANDBOXES_DIR",
    "WRAPPER_FILE",
    "StatusCallback",
    "TaskRunner",
    "TaskTransition",
]
