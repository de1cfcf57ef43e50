"""Running tasks as shell commands, each in its own sandbox. No gRPC here.

A task is ``/bin/sh -c <command>`` started as a real subprocess in a new
session, so it leads its own process group and a kill reaches everything it
spawned. Its working directory, output and checkpoint live in its sandbox:

    <work_dir>/sandboxes/<framework_id>/<task_id>/{stdout,stderr,task.json}

`task.json` records what was started (the task, pid, start time) and, once the
task ends, how it ended, so that a restarted agent can find what it left behind.

Every accepted launch reports TASK_STARTING, then TASK_RUNNING once the process
exists, then exactly one terminal state: TASK_FINISHED (exit status 0),
TASK_FAILED (non-zero exit, killed by a signal nobody asked for, or the command
could not be started) or TASK_KILLED (killed on request). A process killed by
signal N reports exit code 128 + N, as a shell would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

from mesolite.model import RunningTask, TaskSpec, TaskState

log = structlog.get_logger(__name__)

DEFAULT_KILL_GRACE_PERIOD = 3.0
CHECKPOINT_FILE = "task.json"


@dataclass(frozen=True, slots=True)
class TaskTransition:
    """A task entered `state`; the agent turns this into a status update."""

    framework_id: str
    task_id: str
    state: TaskState
    message: str = ""
    exit_code: int | None = None


StatusCallback = Callable[[TaskTransition], None]


@dataclass(eq=False)
class _Task:
    framework_id: str
    spec: TaskSpec
    sandbox: Path
    state: TaskState = TaskState.STARTING
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    kill_requested: bool = False
    sigkilled: bool = False
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    lifecycle: asyncio.Task[None] | None = None
    escalation: asyncio.Task[None] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.framework_id, self.spec.task_id)


class TaskRunner:
    """Starts, watches and kills task processes; reports each transition to `on_status`.

    `on_status` is called synchronously on the event loop, in the order the
    transitions happen; it must not block.
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
        self._tasks: dict[tuple[str, str], _Task] = {}

    def sandbox_path(self, framework_id: str, task_id: str) -> Path:
        return self._sandboxes / framework_id / task_id

    def is_active(self, framework_id: str, task_id: str) -> bool:
        """True from launch until the terminal transition has been reported."""
        return (framework_id, task_id) in self._tasks

    def running_tasks(self) -> list[RunningTask]:
        """Tasks not yet in a terminal state, with their current state."""
        return [RunningTask(t.framework_id, t.spec, t.state) for t in self._tasks.values()]

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
        problem = _check_id("framework id", framework_id) or _check_id("task id", task.task_id)
        if problem:
            bound.warning("launch rejected", reason=problem)
            self._report(TaskTransition(framework_id, task.task_id, TaskState.FAILED, problem))
            return False
        t = _Task(framework_id, task, self.sandbox_path(framework_id, task.task_id))
        self._tasks[key] = t
        bound.info("task starting", sandbox=str(t.sandbox), command=task.command)
        self._report(TaskTransition(framework_id, task.task_id, TaskState.STARTING))
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

    # Internals, in the order a task goes through them.

    def _report(self, transition: TaskTransition) -> None:
        try:
            self._on_status(transition)
        except Exception:
            # A broken callback must not leave a task half-tracked.
            log.exception(
                "status callback failed",
                framework_id=transition.framework_id,
                task_id=transition.task_id,
                state=transition.state.value,
            )

    def _transition(
        self, t: _Task, state: TaskState, message: str = "", exit_code: int | None = None
    ) -> TaskTransition:
        t.state = state
        return TaskTransition(t.framework_id, t.spec.task_id, state, message, exit_code)

    async def _lifecycle(self, t: _Task) -> None:
        try:
            final = await self._execute(t)
            if t.process is not None:
                await _checkpoint(t, final)
        except asyncio.CancelledError:
            # Cancelled from outside, e.g. the loop is closing: leave no process behind.
            if t.process is not None and t.process.returncode is None:
                _signal_group(t.process.pid, signal.SIGKILL)
            raise
        finally:
            if t.escalation is not None:
                t.escalation.cancel()
            self._tasks.pop(t.key, None)
        log.info(
            "task ended",
            framework_id=t.framework_id,
            task_id=t.spec.task_id,
            state=final.state.value,
            exit_code=final.exit_code,
            reason=final.message,
        )
        self._report(final)

    async def _execute(self, t: _Task) -> TaskTransition:
        """Run the task to its end and return its terminal transition."""
        try:
            stdout, stderr = await asyncio.to_thread(_prepare_sandbox, t.sandbox)
        except OSError as e:
            return self._transition(t, TaskState.FAILED, f"could not create the sandbox: {e}")
        try:
            if t.kill_requested:
                return self._transition(t, TaskState.KILLED, "killed before it started")
            t.process = await asyncio.create_subprocess_exec(
                self._shell,
                "-c",
                t.spec.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                cwd=t.sandbox,
                env=self._environment(t),
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            return self._transition(t, TaskState.FAILED, f"could not start the command: {e}")
        finally:
            stdout.close()
            stderr.close()
        t.started = time.time()
        await _checkpoint(t)
        log.info(
            "task running", framework_id=t.framework_id, task_id=t.spec.task_id, pid=t.process.pid
        )
        self._report(self._transition(t, TaskState.RUNNING))
        if t.kill_requested:
            self._start_escalation(t)
        returncode = await t.process.wait()
        t.exited.set()
        # Like Mesos destroying a container: what the command left running in its
        # process group ends with it. (The group id stays reserved while members
        # exist, so this cannot hit an unrelated process group.)
        _signal_group(t.process.pid, signal.SIGKILL)
        return self._outcome(t, returncode)

    def _environment(self, t: _Task) -> dict[str, str]:
        env = {**os.environ, **t.spec.environment}
        # Set last so a task cannot be misled about where and what it is.
        env["MESOLITE_FRAMEWORK_ID"] = t.framework_id
        env["MESOLITE_TASK_ID"] = t.spec.task_id
        env["MESOLITE_SANDBOX"] = str(t.sandbox)
        if t.spec.agent_id:
            env["MESOLITE_AGENT_ID"] = t.spec.agent_id
        return env

    def _outcome(self, t: _Task, returncode: int) -> TaskTransition:
        exit_code, how = _describe_exit(returncode)
        if t.kill_requested:
            if t.sigkilled:
                how += f" (still alive {self._grace:g} s after SIGTERM)"
            return self._transition(t, TaskState.KILLED, f"killed on request: {how}", exit_code)
        if returncode == 0:
            return self._transition(t, TaskState.FINISHED, how, exit_code)
        return self._transition(t, TaskState.FAILED, how, exit_code)

    def _request_kill(self, t: _Task) -> None:
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id)
        if t.kill_requested:
            bound.info("kill already in progress")
            return
        t.kill_requested = True
        bound.info("kill requested", state=t.state.value)
        if t.process is not None:
            self._start_escalation(t)
        # Otherwise the task is still starting: `_execute` checks the flag.

    def _start_escalation(self, t: _Task) -> None:
        if t.escalation is None and not t.exited.is_set():
            t.escalation = asyncio.create_task(self._escalate(t))

    async def _escalate(self, t: _Task) -> None:
        assert t.process is not None
        pid = t.process.pid
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id, pid=pid)
        bound.info("sending SIGTERM to the task's process group")
        _signal_group(pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(t.exited.wait(), self._grace)
        except TimeoutError:
            bound.warning("task outlived its grace period; sending SIGKILL", grace=self._grace)
            t.sigkilled = True
            _signal_group(pid, signal.SIGKILL)


def _check_id(kind: str, value: str) -> str | None:
    """Why `value` cannot name a sandbox directory, or None if it can."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        return f"invalid {kind} {value!r}: must be non-empty, not '.' or '..', without '/'"
    return None


def _describe_exit(returncode: int) -> tuple[int, str]:
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return 128 + signum, f"command terminated by {name}"
    return returncode, f"command exited with status {returncode}"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the whole group is already gone
    except PermissionError:
        log.warning("not allowed to signal process group", pgid=pgid, signal=sig.name)


def _prepare_sandbox(sandbox: Path) -> tuple[IO[bytes], IO[bytes]]:
    sandbox.mkdir(parents=True, exist_ok=True)
    stdout = open(sandbox / "stdout", "wb")  # noqa: SIM115 - handed to the child, closed by the caller
    try:
        stderr = open(sandbox / "stderr", "wb")  # noqa: SIM115
    except OSError:
        stdout.close()
        raise
    return stdout, stderr


async def _checkpoint(t: _Task, final: TaskTransition | None = None) -> None:
    record: dict[str, Any] = {
        "framework_id": t.framework_id,
        "task": {
            "task_id": t.spec.task_id,
            "name": t.spec.name,
            "command": t.spec.command,
            "resources": t.spec.resources.to_dict(),
            "agent_id": t.spec.agent_id,
            "environment": t.spec.environment,
        },
        "pid": t.process.pid if t.process is not None else None,
        "started": t.started,
        "state": t.state.value,
    }
    if final is not None:
        record.update(finished=time.time(), exit_code=final.exit_code, message=final.message)
    try:
        await asyncio.to_thread(_write_json_atomically, t.sandbox / CHECKPOINT_FILE, record)
    except OSError as e:
        # The checkpoint only helps recovery; the task itself is unaffected.
        log.warning(
            "could not write checkpoint",
            framework_id=t.framework_id,
            task_id=t.spec.task_id,
            error=str(e),
        )


def _write_json_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
