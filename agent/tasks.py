"""Running tasks as shell commands, each in its own sandbox, and finding them again
after the agent restarts. No gRPC here.

A task is ``/bin/sh -c <command>`` run by a task wrapper (`agent._task_wrapper`)
that the agent starts in a new session: the wrapper leads the task's process
group, so a kill reaches everything the command spawned, and it writes the
command's exit status to the sandbox, so the status survives the agent.

    <work_dir>/sandboxes/<framework_id>/<task_id>/
        stdout, stderr   the command's output
        task.json        the agent's checkpoint of the task (below)
        exit.json        written by the wrapper when the command ends

`task.json` holds the task, its run id (one per launch of a task id), the
wrapper's pid and start time (field 22 of /proc/<pid>/stat: a pid alone may be
reused), the state, `killing` once a kill has started and, when the agent saw
the task end, how it ended. It is written atomically at launch (STARTING, no
pid yet), once the wrapper runs, when a kill starts and at the end.

Every accepted launch reports TASK_STARTING, then TASK_RUNNING once the wrapper
exists, then exactly one terminal state: TASK_FINISHED (exit status 0),
TASK_FAILED (non-zero exit, killed by a signal nobody asked for, the command
could not be started, or its wrapper died without recording a status) or
TASK_KILLED (killed on request). A process killed by signal N reports exit code
128 + N, as a shell would.

The terminal state is reported first and checkpointed second: the status
callback returns an awaitable that resolves once the update is durable (the
agent journals it), and only then does `task.json` say the task ended. A
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

A task that ended stays in `ended_tasks()` until the agent says its terminal
update was acknowledged (`acknowledged_end`), so that re-registration can tell
the master about tasks whose end it may not have heard of yet.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path

import structlog

from mesolite.agent import _task_wrapper
from mesolite.agent._checkpoint import read_json, write_json_atomically
from mesolite.agent._procs import (
    find_process,
    is_alive,
    process_start_time,
    signal_group,
    wait_for_exit,
    wait_readable,
)
from mesolite.agent._task_records import (
    CHECKPOINT_FILE,
    EXIT_FILE,
    WRAPPER_FILE,
    EndedTask,
    StatusCallback,
    TaskRun,
    TaskTransition,
    check_id,
    checkpoint_record,
    describe_exit,
    new_run_id,
    prepare_sandbox,
    returncode_of,
    scan_checkpoints,
    task_from_checkpoint,
)
from mesolite.model import RunningTask, TaskSpec, TaskState

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD = 3.0
# Run by path with -I: fast to start, and no import of this package (grpc and all).
_WRAPPER = Path(_task_wrapper.__file__).absolute()


class TaskRunner:
    """Starts, watches, kills and recovers task processes; reports each transition.

    `on_status` is called synchronously on the event loop, in the order the
    transitions happen; it must not block. It may return an awaitable that
    resolves once the transition is durable: the runner then checkpoints a
    task's end only after that.
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        on_status: StatusCallback,
        *,
        kill_grace_period: float = DEFAULT_KILL_GRACE_PERIOD,
        shell: str = "/bin/sh",
    ) -> None:
        self._sandboxes = Path(work_dir).absolute() / "sandboxes"
        self._on_status = on_status
        self._grace = kill_grace_period
        self._shell = shell
        self._tasks: dict[tuple[str, str], TaskRun] = {}
        self._ended: dict[tuple[str, str], EndedTask] = {}

    def sandbox_path(self, framework_id: str, task_id: str) -> Path:
        return self._sandboxes / framework_id / task_id

    def is_active(self, framework_id: str, task_id: str) -> bool:
        """True from launch until the terminal transition has been reported."""
        return (framework_id, task_id) in self._tasks

    def running_tasks(self) -> list[RunningTask]:
        """Tasks not yet in a terminal state, with their current state."""
        return [RunningTask(t.framework_id, t.spec, t.state) for t in self._tasks.values()]

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

    def launch(self, framework_id: str, task: TaskSpec) -> bool:
        """Start `task` in the background; False if it was not started.

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
        t = TaskRun(framework_id, task, self.sandbox_path(framework_id, task.task_id), new_run_id())
        previous = self._ended.get(key)
        t.previous = previous.lifecycle if previous is not None else None
        self._tasks[key] = t
        bound.info("task starting", sandbox=str(t.sandbox), command=task.command, run_id=t.run_id)
        self._report(
            TaskTransition(framework_id, task.task_id, TaskState.STARTING, run_id=t.run_id)
        )
        t.lifecycle = asyncio.create_task(self._lifecycle(t), name=f"task-{task.task_id}")
        return True

    def kill(self, framework_id: str, task_id: str) -> None:
        """SIGTERM the task's process group, then SIGKILL after the grace period."""
        t = self._tasks.get((framework_id, task_id))
        if t is None:
            log.info(
                "kill ignored: no such active task", framework_id=framework_id, task_id=task_id
            )
            return
        self._request_kill(t)

    async def shutdown(self) -> None:
        """Kill every active task and wait until all of them have ended.

        The runner stays usable: tasks can be launched again afterwards.
        """
        tasks = list(self._tasks.values())
        if tasks:
            log.info("killing all tasks", count=len(tasks))
        for t in tasks:
            self._request_kill(t)
        await asyncio.gather(*(t.lifecycle for t in tasks if t.lifecycle), return_exceptions=True)

    async def recover(self, journaled_ends: Mapping[tuple[str, str], TaskTransition]) -> None:
        """Take back the tasks a previous agent process left in the sandboxes.

        `journaled_ends` holds, per task, the terminal transition whose update
        is still pending in the agent's journal, if any. Call once, before any
        launch. See the module docstring for what happens to each task.
        """
        for sandbox, record in await asyncio.to_thread(scan_checkpoints, self._sandboxes):
            try:
                t = task_from_checkpoint(sandbox, record)
            except (KeyError, TypeError, ValueError) as e:
                log.warning(
                    "ignoring an unreadable task checkpoint", path=str(sandbox), error=str(e)
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
                    await self._checkpoint(t, end)
                continue
            self._tasks[t.key] = t
            log.info(
                "task recovered",
                framework_id=t.framework_id,
                task_id=t.spec.task_id,
                run_id=t.run_id,
                pid=t.pid,
                killing=t.kill_requested,
            )
            t.lifecycle = asyncio.create_task(self._lifecycle(t), name=f"task-{t.spec.task_id}")

    # Internals, in the order a task goes through them.

    def _report(self, transition: TaskTransition) -> Awaitable[None] | None:
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

    def _transition(
        self, t: TaskRun, state: TaskState, message: str = "", exit_code: int | None = None
    ) -> TaskTransition:
        t.state = state
        return TaskTransition(t.framework_id, t.spec.task_id, state, message, exit_code, t.run_id)

    async def _lifecycle(self, t: TaskRun) -> None:
        try:
            if t.previous is not None:
                # The earlier run's last checkpoint must land before this run's first.
                await asyncio.wait({t.previous})
            try:
                final = await (self._watch(t) if t.recovered else self._execute(t))
            except Exception as e:
                log.exception("running the task failed", task_id=t.spec.task_id)
                final = self._transition(t, TaskState.FAILED, f"the agent failed to run it: {e}")
        except asyncio.CancelledError:
            # Cancelled from outside, e.g. the loop is closing: leave no process behind.
            pid = t.process.pid if t.process is not None else t.pid
            if pid is not None and not t.exited.is_set():
                signal_group(pid, signal.SIGKILL)
            self._tasks.pop(t.key, None)
            raise
        finally:
            if t.escalation is not None:
                t.escalation.cancel()
        await self._finish(t, final)

    async def _execute(self, t: TaskRun) -> TaskTransition:
        """Run the task to its end and return its terminal transition."""
        try:
            stdout, stderr = await asyncio.to_thread(prepare_sandbox, t.sandbox)
        except OSError as e:
            return self._transition(t, TaskState.FAILED, f"could not create the sandbox: {e}")
        t.sandbox_ready = True
        try:
            # Before the wrapper exists: a restarted agent then knows the run
            # never got going, rather than finding nothing at all.
            await self._checkpoint(t)
            if t.kill_requested:
                return self._transition(t, TaskState.KILLED, "killed before it started")
            ready_read, ready_write = os.pipe()
            try:
                t.process = await asyncio.create_subprocess_exec(
                    *self._wrapper_argv(t),
                    "--ready-fd",
                    str(ready_write),
                    "--",
                    self._shell,
                    "-c",
                    t.spec.command,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=t.sandbox,
                    env=self._environment(t),
                    start_new_session=True,
                    pass_fds=(ready_write,),
                )
            except BaseException:
                os.close(ready_read)
                raise
            finally:
                os.close(ready_write)
        except (OSError, ValueError) as e:
            return self._transition(t, TaskState.FAILED, f"could not start the command: {e}")
        finally:
            stdout.close()
            stderr.close()
        # Our unreaped child, so its /proc entry is there to read.
        t.start_time = process_start_time(t.process.pid)
        try:
            # The pid on disk at once: a restarted agent must find the wrapper.
            await self._checkpoint(t)
        except BaseException:
            os.close(ready_read)
            raise
        ready = await _wait_ready(ready_read)
        # Only now may a kill signal the group: before its handlers are in place,
        # a SIGTERM would end the wrapper before it could record anything.
        t.pid = t.process.pid
        if ready:
            t.started = time.time()
            t.state = t.live_state = TaskState.RUNNING
            await self._checkpoint(t)
            log.info("task running", framework_id=t.framework_id, task_id=t.spec.task_id, pid=t.pid)
            self._report(self._transition(t, TaskState.RUNNING))
            if t.kill_requested:
                self._start_escalation(t)
        returncode = await t.process.wait()
        t.exited.set()
        return await self._outcome(t, returncode, ended_while_down=False)

    async def _watch(self, t: TaskRun) -> TaskTransition:
        """A recovered task: wait for its wrapper if it still runs; return how it ended."""
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id, pid=t.pid)
        if t.pid is None:
            # The agent died before checkpointing the pid: the wrapper may have
            # written its own, or be about to (it starts in its own session and
            # outlived the agent), or never have been started.
            found = await self._find_wrapper(t)
            if found is None:
                if t.kill_requested:
                    return self._transition(t, TaskState.KILLED, "killed before it started")
                return self._transition(
                    t, TaskState.LOST, "the agent stopped before the task could start"
                )
            t.pid, t.start_time = found
            bound = bound.bind(pid=t.pid)
            await self._checkpoint(t)
        if t.start_time is not None and is_alive(t.pid, t.start_time):
            bound.info("re-attached to a running task")
            if t.live_state is TaskState.STARTING:
                # The previous agent died before it could say so.
                t.state = t.live_state = TaskState.RUNNING
                await self._checkpoint(t)
                self._report(self._transition(t, TaskState.RUNNING))
            if t.kill_requested:
                bound.info("resuming the kill that was under way")
                self._start_escalation(t)
            await wait_for_exit(t.pid, t.start_time)
            t.exited.set()
            return await self._outcome(t, None, ended_while_down=False)
        t.exited.set()
        bound.info("the task ended while the agent was down")
        return await self._outcome(t, None, ended_while_down=True)

    async def _find_wrapper(self, t: TaskRun) -> tuple[int, int] | None:
        """(pid, start time) of a task's wrapper that the last agent did not checkpoint."""
        for _ in range(2):
            try:
                wrapper = await asyncio.to_thread(read_json, t.sandbox / WRAPPER_FILE)
            except (OSError, ValueError):
                wrapper = None
            if wrapper is not None:
                return int(wrapper["pid"]), int(wrapper["start_time"])
            # Not written yet: is the wrapper running, still on its way to writing it?
            pid = await asyncio.to_thread(find_process, self._wrapper_argv(t))
            if pid is None:
                return None
            start_time = process_start_time(pid)
            if start_time is not None:
                log.info("found the wrapper of a task caught starting", task_id=t.spec.task_id)
                return pid, start_time
        return None

    @staticmethod
    def _wrapper_argv(t: TaskRun) -> list[str]:
        return [sys.executable, "-I", str(_WRAPPER), str(t.sandbox)]

    async def _outcome(
        self, t: TaskRun, wrapper_returncode: int | None, *, ended_while_down: bool
    ) -> TaskTransition:
        """The terminal transition, from the wrapper's `exit.json` when it wrote one."""
        assert t.pid is not None
        try:
            record = await asyncio.to_thread(read_json, t.sandbox / EXIT_FILE)
        except (OSError, ValueError) as e:
            log.warning("unreadable exit status", task_id=t.spec.task_id, error=str(e))
            record = None
        returncode = returncode_of(record)
        wrapper_cleaned_up = record is not None and (returncode is not None or "error" in record)
        # Unless the wrapper ended its process group itself, do it for it; but not
        # when the pid names a live process again (then the group is not ours).
        if not wrapper_cleaned_up and process_start_time(t.pid) is None:
            signal_group(t.pid, signal.SIGKILL)
        if record is not None and "error" in record:
            return self._transition(
                t, TaskState.FAILED, f"could not start the command: {record['error']}"
            )
        if returncode is None and t.sigkilled:
            returncode = -signal.SIGKILL  # the group was SIGKILLed, wrapper included
        if returncode is not None:
            exit_code, how = describe_exit(returncode)
            if t.kill_requested:
                if t.sigkilled:
                    how += f" (still alive {self._grace:g} s after SIGTERM)"
                return self._transition(t, TaskState.KILLED, f"killed on request: {how}", exit_code)
            state = TaskState.FINISHED if returncode == 0 else TaskState.FAILED
            return self._transition(t, state, how, exit_code)
        if ended_while_down:
            why = "the task's wrapper died while the agent was down"
        elif wrapper_returncode is not None:
            how = describe_exit(wrapper_returncode)[1].replace("command", "wrapper")
            why = f"the task's wrapper ended without recording an exit status: {how}"
        else:
            why = "the task's wrapper ended without recording an exit status"
        if t.kill_requested:
            return self._transition(t, TaskState.KILLED, f"killed on request: {why}")
        return self._transition(t, TaskState.FAILED, why)

    async def _finish(self, t: TaskRun, final: TaskTransition) -> None:
        self._tasks.pop(t.key, None)
        self._ended[t.key] = EndedTask(
            RunningTask(t.framework_id, t.spec, final.state), t.run_id, asyncio.current_task()
        )
        log.info(
            "task ended",
            framework_id=t.framework_id,
            task_id=t.spec.task_id,
            state=final.state.value,
            exit_code=final.exit_code,
            reason=final.message,
        )
        durable = self._report(final)
        if durable is not None:
            # Not `await`: a journal that shut down cancels its futures, and the
            # checkpoint below is still worth writing then.
            await asyncio.wait({asyncio.ensure_future(durable)})
        if t.sandbox_ready:
            await self._checkpoint(t, final)

    def _environment(self, t: TaskRun) -> dict[str, str]:
        env = {**os.environ, **t.spec.environment}
        # Set last so a task cannot be misled about where and what it is.
        env["MESOLITE_FRAMEWORK_ID"] = t.framework_id
        env["MESOLITE_TASK_ID"] = t.spec.task_id
        env["MESOLITE_SANDBOX"] = str(t.sandbox)
        if t.spec.agent_id:
            env["MESOLITE_AGENT_ID"] = t.spec.agent_id
        return env

    def _request_kill(self, t: TaskRun) -> None:
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id)
        if t.kill_requested:
            bound.info("kill already in progress")
            return
        t.kill_requested = True
        bound.info("kill requested", state=t.state.value)
        if t.pid is not None:
            self._start_escalation(t)
        # Otherwise the task is still starting: `_execute` checks the flag.

    def _start_escalation(self, t: TaskRun) -> None:
        if t.escalation is None and not t.exited.is_set():
            t.escalation = asyncio.create_task(self._escalate(t))

    async def _escalate(self, t: TaskRun) -> None:
        assert t.pid is not None
        pid = t.pid
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id, pid=pid)
        # `killing` on disk first, so that an agent restarted after the signal
        # reports the end as KILLED, not as a failure.
        await self._checkpoint(t)
        if t.exited.is_set():
            return
        bound.info("sending SIGTERM to the task's process group")
        signal_group(pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self._grace):
                await t.exited.wait()
        except TimeoutError:
            bound.warning("task outlived its grace period; sending SIGKILL", grace=self._grace)
            t.sigkilled = True
            signal_group(pid, signal.SIGKILL)

    async def _checkpoint(self, t: TaskRun, final: TaskTransition | None = None) -> None:
        # One writer at a time per task, each writing the state as of its turn,
        # so an older view can never land after a newer one.
        async with t.checkpoint_lock:
            record = checkpoint_record(t, final)
            try:
                await asyncio.to_thread(write_json_atomically, t.sandbox / CHECKPOINT_FILE, record)
            except OSError as e:
                # The task itself is unaffected; only recovery would know less.
                log.warning(
                    "could not write checkpoint",
                    framework_id=t.framework_id,
                    task_id=t.spec.task_id,
                    error=str(e),
                )


async def _wait_ready(fd: int) -> bool:
    """Whether the wrapper said on `fd` that the command runs; closes `fd`."""
    try:
        await wait_readable(fd)
        return bool(os.read(fd, 64))
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


__all__ = [
    "CHECKPOINT_FILE",
    "EXIT_FILE",
    "WRAPPER_FILE",
    "StatusCallback",
    "TaskRunner",
    "TaskTransition",
]
