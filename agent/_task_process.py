"""One run of a task as a process: start its wrapper or, after an agent restart, find
it and re-attach; wait for it and read how it ended; kill it. Which tasks exist, and
what becomes of their transitions, is the task runner's business (`agent/tasks.py`).

A task is ``/bin/sh -c <command>`` started by the agent's supervisor
(`agent/_supervisor.py`, reached through `agent/_supervisor_client.py`), which outlives
the agent, in a new session. With a cgroup (`launcher` "spawn") the supervisor spawns
the command itself, its shim joins the task's cgroup and switches to its user, and
the supervisor writes its exit status to its exit log (`agent/_exit_log.py`); in the
process-tree fallback ("wrapper") it forks a task wrapper (`agent._task_wrapper`)
that leads the task's process group, puts the command into its rlimits and user,
and writes its exit status to the task's records directory (`exit.json`). Either
way the status survives the agent. The agent hears of the end from the supervisor,
or, if the supervisor went away meanwhile, waits for the process with a pidfd and
reads the end from where it is recorded.
A kill is SIGTERM to the group, then, after the grace period, SIGKILL to
everything in the container. Whenever a run ends, what is left in its container is
killed, its cgroup's figures read (a memory-limit kill makes the task FAILED with
REASON_CONTAINER_LIMITATION_MEMORY) and the cgroup removed. A process killed by
signal N reports exit code 128 + N, as a shell would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import structlog

from mesolite.agent import _exit_log, _task_wrapper
from mesolite.agent._cgroups import CgroupStats
from mesolite.agent._checkpoint import read_json
from mesolite.agent._procs import (
    find_process,
    is_alive,
    process_start_time,
    signal_group,
    wait_for_exit,
)
from mesolite.agent._supervisor_client import Spawned, SupervisorClient, SupervisorGone
from mesolite.agent._task_env import task_environment
from mesolite.agent._task_log import TaskLogWriter
from mesolite.agent._task_records import (
    EXIT_FILE,
    WRAPPER_FILE,
    TaskRun,
    TaskTransition,
    describe_exit,
    off_loop,
    prepare_records,
    prepare_sandbox,
    returncode_of,
)
from mesolite.agent.errors import AgentError
from mesolite.agent.isolation import Container, Isolator, TaskUser, TaskUserError
from mesolite.model import TaskState

log = structlog.get_logger("mesolite.agent.tasks")

# How agents before the supervisor ran a wrapper: found by its command line on recovery.
_WRAPPER = Path(_task_wrapper.__file__).absolute()
# How long a spawned command that ended while the supervisor was away may take to have
# its end in the exit log (its keeper writes it once it has reaped it).
_LOGGED_END_TIMEOUT = 5.0
_LOG_REREAD = 0.05  # seconds: the exit log is read again at most this often


class _ExitLogCache:
    """The supervisor's exit log as last read, read again when older than `_LOG_REREAD`
    (only recovered and adopted runs read it; a live run hears its end from the
    supervisor)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._log = _exit_log.ExitLog()
        self._read_at = -_LOG_REREAD
        self._lock = asyncio.Lock()

    async def current(self, *, fresh: bool = False) -> _exit_log.ExitLog:
        async with self._lock:
            now = time.monotonic()
            if fresh or now - self._read_at >= _LOG_REREAD:
                self._log = await asyncio.to_thread(_exit_log.read, self._directory)
                self._read_at = now
            return self._log


class TaskProcesses:
    """Starts, re-attaches to and kills the wrapper processes of task runs.

    `report` hears of a run's live transitions as they happen (RUNNING); `run`
    returns its terminal one.
    """

    def __init__(
        self,
        report: Callable[[TaskTransition], object],
        *,
        checkpoints: TaskLogWriter,
        shell: str,
        kill_grace_period: float,
        isolator: Isolator,
        supervisor: SupervisorClient,
        spawn: bool = True,
    ) -> None:
        self._report = report
        self._checkpoints = checkpoints
        self._shell = shell
        self._grace = kill_grace_period
        self._isolator = isolator
        self._supervisor = supervisor
        self._spawn = spawn
        self._exit_log = _ExitLogCache(supervisor.directory)

    async def run(self, t: TaskRun) -> TaskTransition:
        """Run `t` to its end, or, recovered, watch it to its end; returns how it ended."""
        try:
            final = await (self._watch(t) if t.recovered else self._execute(t))
        except Exception:
            await self._end_container(t)  # the run is given up: nothing of it lives on
            raise
        if not t.exited.is_set():
            # A run that ended before its wrapper did (killed before it started, or the
            # wrapper could not start): no cgroup is left behind. (Once the wrapper
            # ended, `_outcome` removed it.)
            await self._end_container(t)
        return final

    @staticmethod
    async def _end_container(t: TaskRun) -> None:
        container = t.container
        if container is None:
            return
        wrapper = t.pid if t.pid is not None and not t.exited.is_set() else None

        def end() -> None:
            if wrapper is not None:
                container.kill(wrapper)
            container.clean_up()

        await off_loop(end)

    async def _execute(self, t: TaskRun) -> TaskTransition:
        """Run the task to its end and return its terminal transition."""
        try:
            # Only a framework's own user is looked up (the user database may block).
            if t.user:
                user = await asyncio.to_thread(self._isolator.user_for, t.user)
            else:
                user = self._isolator.user_for(t.user)
        except TaskUserError as e:
            log.warning(
                "cannot run a task as its framework's user",
                framework_id=t.framework_id,
                task_id=t.spec.task_id,
                user=t.user,
                reason=str(e),
            )
            return t.transition(TaskState.FAILED, str(e))
        try:
            # First: whether it can start the command itself decides the launcher.
            await self._supervisor.connect()
        except AgentError as e:
            return t.transition(TaskState.FAILED, f"could not start the command: {e}")
        try:
            stdout, stderr, container = await off_loop(self._set_up, t, user)
        except _SetUpFailed as e:
            t.sandbox_ready = e.sandbox_ready
            return t.transition(TaskState.FAILED, str(e))
        t.sandbox_ready = True
        t.container = container
        # Before the command exists: a restarted agent then knows the run never got
        # going (and which cgroup it had), rather than finding nothing.
        await self._checkpoints.checkpoint(t)
        try:
            if t.kill_requested:
                return t.transition(TaskState.KILLED, "killed before it started")
            try:
                if t.launcher == "spawn":
                    assert container.cgroup is not None
                    user_ids = container.user
                    spawned = await self._supervisor.spawn(
                        records=t.records,
                        run=t.run_id,
                        cgroups=list(container.cgroup.paths),
                        user=(user_ids.uid, user_ids.gid, list(user_ids.groups))
                        if user_ids is not None
                        else None,
                        argv=[self._shell, "-c", t.spec.command],
                        env=self._environment(t),
                        cwd=t.sandbox,
                        fds=(stdout.fileno(), stderr.fileno()),
                    )
                else:
                    spawned = await self._supervisor.launch(
                        records=t.records,
                        options=container.wrapper_args(),
                        argv=[self._shell, "-c", t.spec.command],
                        env=self._environment(t),
                        cwd=t.sandbox,
                        fds=(stdout.fileno(), stderr.fileno()),
                    )
            except SupervisorGone as e:
                return await self._adopt(t, None, e)
        except (OSError, ValueError, AgentError) as e:
            return t.transition(TaskState.FAILED, f"could not start the command: {e}")
        finally:
            stdout.close()
            stderr.close()
        t.wrapper_pid = spawned.pid
        if t.launcher == "spawn":
            return await self._follow_spawned(t, spawned)
        try:
            # The wrapper records its pid, then starts the command and says so.
            command = await spawned.ready
        except SupervisorGone as e:
            return await self._adopt(t, spawned, e)
        # Only now may a kill signal the group: before its handlers are in place,
        # a SIGTERM would end the wrapper before it could record anything.
        await self._running(t, spawned, command is not None)
        status = await spawned.exited
        if status is None:  # the supervisor went away: the wrapper is nobody's child now
            await wait_for_exit(spawned.pid, spawned.start_time)
        t.exited.set()
        returncode = os.waitstatus_to_exitcode(status) if isinstance(status, int) else None
        return await self._outcome(t, returncode, ended_while_down=False)

    async def _running(self, t: TaskRun, spawned: Spawned, started: bool) -> None:
        """The run's process is known (`spawned`); if its command `started`, the task
        is RUNNING: checkpointed, reported, and a kill asked for meanwhile begun."""
        t.pid, t.start_time = spawned.pid, spawned.start_time
        if not started:
            return
        t.started = time.time()
        t.state = t.live_state = TaskState.RUNNING
        await self._checkpoints.checkpoint(t, durable=False)  # its pid: no use after a crash
        log.debug("task running", framework_id=t.framework_id, task_id=t.spec.task_id, pid=t.pid)
        self._report(t.transition(TaskState.RUNNING))
        if t.kill_requested:
            self._start_escalation(t)

    async def _follow_spawned(self, t: TaskRun, spawned: Spawned) -> TaskTransition:
        """A command the supervisor started itself (in its own session): RUNNING once
        its shim is in its cgroup; followed to its end, which the supervisor tells once
        it is in the exit log."""
        try:
            # Its shim says so once it is in its cgroup (or it ends without a word).
            command = await spawned.ready
        except SupervisorGone as e:
            return await self._adopt(t, spawned, e)
        await self._running(t, spawned, command is not None)
        status = await spawned.exited
        record: dict[str, Any] | None
        if isinstance(status, str):
            record = _exit_log.error_record(spawned.pid, spawned.start_time, status)
        elif status is not None:
            record = _exit_log.exit_record(spawned.pid, spawned.start_time, status)
        else:  # the supervisor went away: its keeper writes the end to the log
            await wait_for_exit(spawned.pid, spawned.start_time)
            record = await self._logged_end(t)
        t.exited.set()
        return await self._outcome(t, None, ended_while_down=False, record=record)

    async def _logged_end(self, t: TaskRun) -> dict[str, Any] | None:
        """A spawned command's end from the exit log, waiting (bounded) for it to be
        written; None if it is not there in time (nobody was left to reap it)."""
        assert t.pid is not None and t.start_time is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LOGGED_END_TIMEOUT
        while True:
            end = (await self._exit_log.current()).end_of(t.pid, t.start_time)
            if end is not None or loop.time() > deadline:
                return end
            await asyncio.sleep(_LOG_REREAD)

    async def _adopt(
        self, t: TaskRun, spawned: Spawned | None, gone: SupervisorGone
    ) -> TaskTransition:
        """The supervisor went away as it started the run's wrapper: find the wrapper
        (if it exists) as after an agent restart, and follow it to its end."""
        log.warning(
            "the supervisor went away as it started a task", task_id=t.spec.task_id, why=str(gone)
        )
        # Once it is dead, a wrapper it forked has either recorded its pid or been
        # killed with it (PR_SET_PDEATHSIG) before its command could start.
        await self._supervisor.wait_gone()
        if spawned is not None:
            t.pid, t.start_time = spawned.pid, spawned.start_time
        return await self._watch(t, adopting=True)

    def _set_up(self, t: TaskRun, user: TaskUser | None) -> tuple[IO[bytes], IO[bytes], Container]:
        """The run's sandbox with its stdout and stderr, its container and, for a
        wrapper, its records directory. Blocking; raises `_SetUpFailed`."""
        # With a cgroup to join, the supervisor can start the command itself (its shim
        # joins the cgroup and switches user); else a wrapper (rlimits, a subreaper),
        # which records the command's end in the run's records directory.
        can_spawn = self._spawn and self._supervisor.can_spawn and self._isolator.has_cgroups
        t.launcher = "spawn" if can_spawn else "wrapper"
        try:
            if t.launcher == "wrapper":
                prepare_records(t.records)
            stdout, stderr = prepare_sandbox(t.sandbox, user)
        except OSError as e:
            raise _SetUpFailed(f"could not create the sandbox: {e}", sandbox_ready=False) from e
        try:
            container = self._isolator.create(t.run_id, t.spec.resources, user)
        except OSError as e:
            stdout.close()
            stderr.close()
            log.error("could not set up a task's container", task_id=t.spec.task_id, error=e)
            why = f"could not set up the task's cgroup: {e}"
            raise _SetUpFailed(why, sandbox_ready=True) from e
        assert t.launcher == "wrapper" or container.cgroup is not None
        return stdout, stderr, container

    async def _watch(self, t: TaskRun, *, adopting: bool = False) -> TaskTransition:
        """A recovered task (or, `adopting`, one whose supervisor went away as it
        started): wait for its wrapper if it still runs; return how it ended."""
        bound = log.bind(framework_id=t.framework_id, task_id=t.spec.task_id, pid=t.pid)
        if t.pid is None:
            # The agent died before checkpointing the pid: the wrapper may have
            # written its own, or be about to (it starts in its own session and
            # outlived the agent), or never have been started.
            found = await self._find_wrapper(t)
            if found is None:
                if t.kill_requested:
                    return t.transition(TaskState.KILLED, "killed before it started")
                if adopting:
                    why = "could not start the command: the supervisor stopped before it did"
                    return t.transition(TaskState.FAILED, why)
                return t.transition(TaskState.LOST, "the agent stopped before the task could start")
            t.pid, t.start_time = found
            bound = bound.bind(pid=t.pid)
            await self._checkpoints.checkpoint(t)
        if t.start_time is not None and is_alive(t.pid, t.start_time):
            bound.info("re-attached to a running task")
            if t.live_state is TaskState.STARTING:
                # The previous agent died before it could say so.
                t.state = t.live_state = TaskState.RUNNING
                await self._checkpoints.checkpoint(t)
                self._report(t.transition(TaskState.RUNNING))
            if t.kill_requested:
                bound.info("resuming the kill that was under way")
                self._start_escalation(t)
            await wait_for_exit(t.pid, t.start_time)
            t.exited.set()
            record = await self._logged_end(t) if t.launcher == "spawn" else None
            return await self._outcome(t, None, ended_while_down=False, record=record)
        t.exited.set()
        record = await self._logged_end(t) if t.launcher == "spawn" else None
        if adopting:
            return await self._outcome(t, None, ended_while_down=False, record=record)
        bound.info("the task ended while the agent was down")
        return await self._outcome(t, None, ended_while_down=True, record=record)

    async def _find_wrapper(self, t: TaskRun) -> tuple[int, int] | None:
        """(pid, start time) of a task's wrapper (or spawned command) that the last agent
        did not checkpoint."""
        if t.launcher == "spawn":
            # The supervisor wrote it to the exit log before it told any agent.
            spawned = (await self._exit_log.current(fresh=True)).spawned.get(t.run_id)
            if spawned is None:
                spawned = self._supervisor.wrapper_of(t.records)
            if spawned is not None:
                log.info("found the command of a task caught starting", task_id=t.spec.task_id)
            return spawned
        for _ in range(2):
            try:
                wrapper = await asyncio.to_thread(read_json, t.records / WRAPPER_FILE)
            except (OSError, ValueError):
                wrapper = None
            if wrapper is not None:
                return int(wrapper["pid"]), int(wrapper["start_time"])
            # Not written yet: is the wrapper running, still on its way to writing it?
            # Forked by the supervisor, which listed its wrappers when this agent
            # connected (after carrying out what the last agent had asked)...
            listed = self._supervisor.wrapper_of(t.records)
            if listed is not None:
                log.info("found the wrapper of a task caught starting", task_id=t.spec.task_id)
                return listed
            # ...or, started by an agent from before the supervisor, by its command line.
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
        """How agents before the supervisor started a wrapper."""
        return [sys.executable, "-I", str(_WRAPPER), str(t.records)]

    async def _outcome(
        self,
        t: TaskRun,
        wrapper_returncode: int | None,
        *,
        ended_while_down: bool,
        record: dict[str, Any] | None = None,
    ) -> TaskTransition:
        """The terminal transition, from the wrapper's `exit.json` when it wrote one, or,
        for a spawned command, from its `record` in the exit log."""
        assert t.pid is not None
        record, stats = await off_loop(self._end_of, t, record)
        returncode = returncode_of(record)
        limitation = t.container.limitation(stats) if t.container else None
        if record is not None and "error" in record:
            return t.transition(TaskState.FAILED, f"could not start the command: {record['error']}")
        if returncode is None and t.sigkilled:
            returncode = -signal.SIGKILL  # the group was SIGKILLed, wrapper included
        if returncode is not None:
            exit_code, how = describe_exit(returncode)
            if t.kill_requested:
                if t.sigkilled:
                    how += f" (still alive {self._grace:g} s after SIGTERM)"
                return t.transition(TaskState.KILLED, f"killed on request: {how}", exit_code)
            if returncode == 0:
                return t.transition(TaskState.FINISHED, how, exit_code)
            if limitation is not None:
                return t.transition(
                    TaskState.FAILED, f"{limitation.message} ({how})", exit_code, limitation.reason
                )
            return t.transition(TaskState.FAILED, how, exit_code)
        if t.launcher == "spawn":
            why = "the task's command ended with nobody left to record its exit status"
        elif ended_while_down:
            why = "the task's wrapper died while the agent was down"
        elif wrapper_returncode is not None:
            how = describe_exit(wrapper_returncode)[1].replace("command", "wrapper")
            why = f"the task's wrapper ended without recording an exit status: {how}"
        else:
            why = "the task's wrapper ended without recording an exit status"
        if t.kill_requested:
            return t.transition(TaskState.KILLED, f"killed on request: {why}")
        return t.transition(TaskState.FAILED, why)

    @staticmethod
    def _end_of(
        t: TaskRun, logged: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, CgroupStats | None]:
        """How the command ended (the wrapper's `exit.json`; for a spawned command, its
        `logged` end), and the container's last figures once whatever the command left
        behind is killed and the container removed. Blocking."""
        assert t.pid is not None
        record = logged
        if t.launcher == "wrapper":
            try:
                record = read_json(t.records / EXIT_FILE)
            except (OSError, ValueError) as e:
                log.warning("unreadable exit status", task_id=t.spec.task_id, error=str(e))
                record = None
        returncode = returncode_of(record)
        # A wrapper that recorded the end also killed its group; a spawned command
        # has nobody to do that for it.
        wrapper_cleaned_up = (
            t.launcher == "wrapper"
            and record is not None
            and (returncode is not None or "error" in record)
        )
        # Unless the wrapper ended its process group itself, do it for it; but not
        # when the pid names a live process again (then the group is not ours).
        if not wrapper_cleaned_up and process_start_time(t.pid) is None:
            signal_group(t.pid, signal.SIGKILL)
        # Whatever the command left (a setsid child, a double fork) ends with it.
        stats = t.container.clean_up() if t.container else None
        # The sandbox's age, for its garbage collection (`agent/_sandbox_gc.py`), counts
        # from the end of its task.
        with contextlib.suppress(OSError):
            os.utime(t.sandbox, follow_symlinks=False)
        return record, stats

    def _environment(self, t: TaskRun) -> dict[str, str]:
        user = t.container.user if t.container is not None else None
        return task_environment(
            os.environ,
            task_env=t.spec.environment,
            sandbox=t.sandbox,
            user=user.name if user is not None else _own_user(),
            framework_id=t.framework_id,
            task_id=t.spec.task_id,
            agent_id=t.spec.agent_id,
            pass_env=self._isolator.config.pass_env,
        )

    def request_kill(self, t: TaskRun) -> None:
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
        await self._checkpoints.checkpoint(t)
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
            if t.container is not None:
                await off_loop(t.container.kill, pid)
            else:
                signal_group(pid, signal.SIGKILL)


class _SetUpFailed(AgentError):
    """A run's sandbox or container could not be set up; the message says which."""

    def __init__(self, message: str, *, sandbox_ready: bool) -> None:
        super().__init__(message)
        self.sandbox_ready = sandbox_ready


def _own_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())
