"""A task as the agent keeps it: its record in memory, and that record on disk.

`TaskRun` is what the task runner (`agent/tasks.py`) knows of one run of a
task; `checkpoint_record` and `task_from_checkpoint` turn it into the checkpoint
a restarted agent reads back (one line of the agent's task log,
`agent/_task_log.py`), and `returncode_of` / `describe_exit` read the wrapper's
`exit.json`. Nothing here starts, signals or waits for a process.

A wrapper's records (its `exit.json` and `wrapper.json`) are in the run's records
directory, ``<work_dir>/meta/<framework_id>/<task_id>/``, under a ``meta`` that only
the agent's user may enter (0700): tasks, which may run as another user and own
their sandboxes, can neither read nor replace them. A command the supervisor
spawns itself has its end in the supervisor's exit log instead, and no records
directory. (Agents before the task log kept a ``task.json`` checkpoint there, and
before that in the sandbox; `scan_checkpoints` still finds those.)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import structlog

from mesolite.agent import _task_wrapper
from mesolite.agent._checkpoint import read_json
from mesolite.agent.isolation import Container, TaskUser
from mesolite.files import fsync_directory
from mesolite.model import RunningTask, TaskSpec, TaskState
from mesolite.resources import Resources

log = structlog.get_logger(__name__)
R = TypeVar("R")

CHECKPOINT_FILE = "task.json"
RECORDS_DIR = "meta"  # under the work dir, beside "sandboxes"
SANDBOXES_DIR = "sandboxes"
SANDBOX_PARENT_MODE = 0o711  # sandboxes/ and sandboxes/<framework_id>/: pass, never list
SANDBOX_MODE = 0o700  # a sandbox: its task's user's alone
EXIT_FILE = _task_wrapper.EXIT_FILE
WRAPPER_FILE = _task_wrapper.WRAPPER_FILE


@dataclass(frozen=True, slots=True)
class TaskTransition:
    """A task entered `state`; the agent turns this into a status update.

    `run_id` names the launch the transition belongs to (a task id can be
    launched again after it ended); empty for launches refused outright.
    `reason` names, as Mesos' TaskStatus.Reason does, a limit that ended the
    task (e.g. REASON_CONTAINER_LIMITATION_MEMORY); empty otherwise.
    """

    framework_id: str
    task_id: str
    state: TaskState
    message: str = ""
    exit_code: int | None = None
    run_id: str = ""
    reason: str = ""


# May return an awaitable that resolves once the transition is durable.
StatusCallback = Callable[[TaskTransition], Awaitable[None] | None]


@dataclass(eq=False)
class TaskRun:
    framework_id: str
    spec: TaskSpec
    sandbox: Path
    run_id: str
    records: Path  # a wrapper's exit.json and wrapper.json: the agent's, not the task's
    user: str = ""  # its framework's user, as the launch named it ("": the task user)
    state: TaskState = TaskState.STARTING
    live_state: TaskState = TaskState.STARTING  # the last non-terminal state reported
    # "spawn": the supervisor started the command itself (pid: the command's, its end in
    # the supervisor's exit log); "wrapper": a task wrapper runs it (pid: the wrapper's).
    launcher: str = "wrapper"
    wrapper_pid: int | None = None  # as soon as this agent's supervisor forked it
    pid: int | None = None  # the wrapper's (also its group's), once a kill may signal it
    start_time: int | None = None  # the wrapper's, in clock ticks since boot
    started: float = 0.0
    kill_requested: bool = False
    sigkilled: bool = False
    recovered: bool = False  # found on disk by a restarted agent
    sandbox_ready: bool = False
    container: Container | None = None  # once set up; from the checkpoint when recovered
    previous: asyncio.Task[None] | None = None  # an earlier run still finishing
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    lifecycle: asyncio.Task[None] | None = None
    escalation: asyncio.Task[None] | None = None
    checkpoint_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def key(self) -> tuple[str, str]:
        return (self.framework_id, self.spec.task_id)

    def transition(
        self, state: TaskState, message: str = "", exit_code: int | None = None, reason: str = ""
    ) -> TaskTransition:
        """Enter `state`; returns the transition to report."""
        self.state = state
        return TaskTransition(
            self.framework_id, self.spec.task_id, state, message, exit_code, self.run_id, reason
        )


@dataclass(frozen=True, slots=True)
class EndedTask:
    task: RunningTask
    run_id: str
    lifecycle: asyncio.Task[None] | None


def new_run_id() -> str:
    return uuid.uuid4().hex


def check_id(kind: str, value: str) -> str | None:
    """Why `value` cannot name a sandbox directory, or None if it can."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        return f"invalid {kind} {value!r}: must be non-empty, not '.' or '..', without '/'"
    return None


def returncode_of(record: dict[str, Any] | None) -> int | None:
    """The command's return code as `subprocess` gives it (-N for signal N)."""
    if record is None:
        return None
    code, signum = record.get("exit_code"), record.get("signal")
    if isinstance(code, int):
        return code
    if isinstance(signum, int):
        return -signum
    return None


def describe_exit(returncode: int) -> tuple[int, str]:
    if returncode < 0:
        signum = -returncode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return 128 + signum, f"command terminated by {name}"
    return returncode, f"command exited with status {returncode}"


def prepare_records(records: Path) -> None:
    """The run's records directory, under a ``meta`` only the agent's user may enter."""
    meta = records.parent.parent
    meta.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(meta, 0o700)  # also when an older agent made it
    records.mkdir(parents=True, exist_ok=True)
    # A status left by an earlier run of this task id must not pass for this run's:
    # removed, durably (before the STARTING checkpoint), if there was one.
    removed = False
    for name in (EXIT_FILE, WRAPPER_FILE):
        with contextlib.suppress(FileNotFoundError):
            (records / name).unlink()
            removed = True
    if removed:
        fsync_directory(records)


def prepare_sandbox(sandbox: Path, owner: TaskUser | None) -> tuple[IO[bytes], IO[bytes]]:
    """The sandbox, owned by `owner` if given, 0700, and its fresh stdout and stderr files.

    The directories above it (``sandboxes/`` and ``sandboxes/<framework_id>/``) stay
    the agent's, 0711: a task reaches its own sandbox through them but can list
    neither, and another user's sandbox it can neither list nor read. The agent
    writes into a directory its task owns, so it never follows what the task may
    have left there: stdout and stderr are unlinked and created anew, never opened
    through a link. A sandbox made now has nothing to unlink: its files are made
    before its owner gets it.
    """
    for directory in (sandbox.parent.parent, sandbox.parent):
        directory.mkdir(mode=SANDBOX_PARENT_MODE, parents=True, exist_ok=True)
        os.chmod(directory, SANDBOX_PARENT_MODE)  # also when an older agent made it 0755
    try:
        sandbox.mkdir(mode=SANDBOX_MODE)
        fresh = True
    except FileExistsError:
        fresh = False
    if not fresh:
        _give(sandbox, owner)
    files: list[IO[bytes]] = []
    try:
        for name in ("stdout", "stderr"):
            path = sandbox / name
            if not fresh:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o644)
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
            files.append(os.fdopen(fd, "wb"))
        if fresh:
            _give(sandbox, owner)
    except OSError:
        for f in files:
            f.close()
        raise
    return files[0], files[1]


def _give(sandbox: Path, owner: TaskUser | None) -> None:
    # Its owner may loosen it; the agent sets it again at each launch.
    os.chmod(sandbox, SANDBOX_MODE)
    if owner is not None:
        os.chown(sandbox, owner.uid, owner.gid, follow_symlinks=False)


def checkpoint_record(
    t: TaskRun, final: TaskTransition | None, container: Container | None = None
) -> dict[str, Any]:
    """`t` as its checkpoint holds it (with `container`, if given, as its container)."""
    container = container or t.container
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
        "run_id": t.run_id,
        "records": str(t.records),
        "user": t.user,
        "launcher": t.launcher,
        "pid": t.pid,
        "pid_start_time": t.start_time,
        "started": t.started,
        "state": t.state.value,
        "killing": t.kill_requested,
    }
    if container is not None:
        record["container"] = container.record()
    if final is not None:
        record.update(
            state=final.state.value,
            finished=time.time(),
            exit_code=final.exit_code,
            message=final.message,
        )
        if final.reason:
            record["reason"] = final.reason
    return record


# Per-task file work (sandboxes, cgroups, fsynced checkpoints), on threads of its own so
# that it never queues behind the rest of the agent's blocking calls. Eight: more wait on
# fsyncs together no faster here, and cost CPU in switching (32 doubled the agent's CPU
# per task for the same tasks per second, scripts/bench_task_starts.py).
_IO_THREADS = 8
_io = ThreadPoolExecutor(max_workers=_IO_THREADS, thread_name_prefix="mesolite-task-io")


async def off_loop(fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` on the task I/O threads (as `asyncio.to_thread`, context and all)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_io, context.run, fn, *args)


def task_from_checkpoint(records: Path, sandbox: Path, record: dict[str, Any]) -> TaskRun:
    """A recovered `TaskRun` from its checkpoint, its records directory `records`;
    raises KeyError, TypeError or ValueError."""
    spec = record["task"]
    environment = spec.get("environment") or {}
    resources = spec["resources"]
    if not isinstance(environment, dict) or not isinstance(resources, dict):
        raise TypeError("environment and resources must be objects")
    task = TaskSpec(
        task_id=_str(spec["task_id"]),
        command=_str(spec["command"]),
        resources=Resources(resources),
        name=_str(spec.get("name", "")),
        agent_id=_str(spec.get("agent_id", "")),
        environment={_str(k): _str(v) for k, v in environment.items()},
    )
    pid, start_time = record.get("pid"), record.get("pid_start_time")
    if pid is not None and not isinstance(pid, int):
        raise TypeError("pid must be an integer")
    if start_time is not None and not isinstance(start_time, int):
        raise TypeError("pid_start_time must be an integer")
    container = record.get("container")
    if container is not None and not isinstance(container, dict):
        raise TypeError("container must be an object")
    t = TaskRun(
        _str(record["framework_id"]),
        task,
        sandbox,
        _str(record.get("run_id", "")),
        records,
        user=_str(record.get("user", "")),
        launcher="spawn" if record.get("launcher") == "spawn" else "wrapper",
        state=TaskState(record["state"]),
        pid=pid,
        start_time=start_time,
        started=float(record.get("started") or 0.0),
        kill_requested=bool(record.get("killing", False)),
        recovered=True,
        sandbox_ready=True,
        container=Container.from_record(container) if container is not None else None,
    )
    if t.state.is_terminal:
        # Which live state came last is not recorded once the task ended.
        t.live_state = TaskState.RUNNING if pid is not None else TaskState.STARTING
    elif pid is None:
        t.state = t.live_state = TaskState.STARTING
    else:
        t.live_state = t.state
    return t


def scan_checkpoints(work_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(records directory, `task.json`) of every task an agent from before the task log
    checkpointed under `work_dir`, in both of its layouts."""
    found = []
    meta, sandboxes = work_dir / RECORDS_DIR, work_dir / SANDBOXES_DIR
    paths = sorted(meta.glob(f"*/*/{CHECKPOINT_FILE}"))
    newer = {p.parent.relative_to(meta) for p in paths}
    for path in sorted(sandboxes.glob(f"*/*/{CHECKPOINT_FILE}")):
        if path.parent.relative_to(sandboxes) not in newer:
            paths.append(path)  # written by an agent from before the records directory
    for path in paths:
        try:
            record = read_json(path)
        except (OSError, ValueError) as e:
            log.warning("ignoring an unreadable task checkpoint", path=str(path), error=str(e))
            continue
        if record is not None:
            found.append((path.parent, record))
    return found


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value
