"""The domain model shared by the master, the agent and the framework SDK.

These are the types code works with; protobuf messages exist only at the wire
and are converted in `mesolite.convert`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mesolite.resources import Resources

DEFAULT_ROLE = "*"
DEFAULT_REFUSE_SECONDS = 5.0  # as in Mesos' Filters.refuse_seconds


class TaskState(enum.Enum):
    """Where a task is in its life, with Mesos' names (the value is the wire name).

    A launched task goes STAGING (the master accepted it) -> STARTING (its agent is
    starting it) -> RUNNING -> one terminal state, after which it reports nothing more.
    The states after TASK_KILLED below are terminal too.
    """

    STAGING = "TASK_STAGING"
    """Accepted by the master, not yet reported by its agent (seen in reconciliation)."""
    STARTING = "TASK_STARTING"
    """Its agent is making its sandbox and container and starting the command."""
    RUNNING = "TASK_RUNNING"
    """The command runs."""
    KILLING = "TASK_KILLING"
    """Being killed. Mesos' name; mesolite does not report it (a kill ends KILLED)."""
    FINISHED = "TASK_FINISHED"
    """Terminal: the command exited with status 0."""
    FAILED = "TASK_FAILED"
    """Terminal: it exited non-zero, was killed by a signal nobody asked for or by a
    limit of its container (`TaskStatus.reason` names it), or could not be started."""
    KILLED = "TASK_KILLED"
    """Terminal: killed on request (`Framework.kill`, a teardown)."""
    LOST = "TASK_LOST"
    """Terminal: its agent was removed (silent too long, or not back after a master
    restart), the agent no longer knew it, or a reconciliation asked about a task the
    master does not know. The process may still have run; mesolite kills what an agent
    that comes back still runs."""
    ERROR = "TASK_ERROR"
    """Terminal. Mesos' name for an invalid task; mesolite refuses those with an ERROR
    event instead, and does not report it."""
    DROPPED = "TASK_DROPPED"
    """Terminal. Mesos' name; mesolite does not report it."""
    UNREACHABLE = "TASK_UNREACHABLE"
    """Mesos' name for a task on a partitioned agent; mesolite does not report it
    (a partitioned agent's tasks become LOST when the agent is removed)."""
    GONE = "TASK_GONE"
    """Terminal. Mesos' name; mesolite does not report it."""

    @property
    def is_terminal(self) -> bool:
        """Whether the task has ended: no update follows, and its resources are free."""
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        TaskState.FINISHED,
        TaskState.FAILED,
        TaskState.KILLED,
        TaskState.LOST,
        TaskState.ERROR,
        TaskState.DROPPED,
        TaskState.GONE,
    }
)


class StatusSource(enum.Enum):
    """Who made a status update."""

    MASTER = "master"
    """The master, on its own authority: TASK_LOST, a reconciliation answer. Nothing
    to acknowledge (no `update_id`)."""
    AGENT = "agent"
    """The task's agent: acknowledged by the SDK after `on_update` returns."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What a framework asks to run: a shell command with the resources it needs.

    The command runs as `/bin/sh -c COMMAND` on the agent, in the task's sandbox (its
    working directory, also `$HOME` and `$MESOLITE_SANDBOX`), as the agent's task user,
    in a container limited to `resources`, with a clean environment (see
    docs/framework-guide.md, "The task's environment").
    """

    task_id: str
    """Unique among this framework's live tasks; as Mesos allows: 1-255 bytes, not ``.``
    or ``..``, without ``/``, ``\\`` or control characters.
    `new_task_id()` makes one. An id may be used again once its task has ended."""
    command: str
    """The shell command (up to 64 KiB); its exit status decides FINISHED or FAILED."""
    resources: Resources
    """What it needs, taken from the offer. ``cpus``: its CPU weight under contention
    (a hard quota on an agent run with ``--cpu-hard-limit``); ``mem``: MB, a hard
    limit (past it the kernel kills the task: FAILED with a memory reason; on an
    agent without cgroups, allocations fail instead); ``disk`` and any other name:
    counted by the allocator, not enforced."""
    name: str = ""
    """A name for people (views, logs); up to 256 characters."""
    agent_id: str = ""
    """The agent to run on; `launch` fills it in from the offer."""
    environment: dict[str, str] = field(default_factory=dict)
    """Variables added to the task's environment (at most 256, 64 KiB in all); they
    override the agent's few passed variables, never the `MESOLITE_*` ones."""


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """A task's state as of one moment: a status update, or a reconciliation answer."""

    task_id: str
    """The task it is about."""
    framework_id: str
    """The framework the task belongs to."""
    agent_id: str
    """The agent it runs (ran) on; may be empty in an answer about a task the master
    does not know."""
    state: TaskState
    """The state it reached."""
    message: str = ""
    """Why, for people: how it ended ("exited with status 1", "killed on request:
    ...", "memory limit of 48 MB reached: ..."), why it was lost, or
    "reconciliation"."""
    exit_code: int | None = None
    """The command's exit status once it has ended (128+N after signal N); None
    while it runs, or when it never ran or its end was not seen."""
    timestamp: float = 0.0
    """When it was made, in seconds since the epoch (by the agent, or the master)."""
    update_id: str = ""
    """Set on an agent's update: the SDK acknowledges it by this id after `on_update`
    returns, and shows each id once. Empty on the master's (LOST, reconciliation)."""
    source: StatusSource = StatusSource.AGENT
    """Who made it: the task's agent, or the master."""
    reason: str = ""
    """Mesos' `TaskStatus.Reason` name when a limit of the task's container ended it
    (``REASON_CONTAINER_LIMITATION_MEMORY``, ``REASON_CONTAINER_LIMITATION``) or the
    master preempted it (``REASON_CONTAINER_PREEMPTED``); else empty."""


@dataclass(frozen=True, slots=True)
class Offer:
    """Resources of one agent the master offers to one framework, until it is answered
    (`launch`, `decline`), rescinded (`on_rescind`) or lost with the connection. While
    outstanding, they are counted as the framework's in DRF and offered to no one else.
    """

    offer_id: str
    """Names it in `launch` and `decline` (and in `on_rescind`)."""
    framework_id: str
    """The framework it is for."""
    agent_id: str
    """The agent whose resources these are; tasks launched on it run there."""
    hostname: str
    """That agent's host name, as it registered (`--hostname`)."""
    resources: Resources
    """What is offered: all of the agent's free resources the framework may have."""
    attributes: dict[str, str] = field(default_factory=dict)
    """The agent's attributes (`--attributes "rack:r1;zone:a"`), to place tasks by."""
    revocable: Resources = field(default_factory=Resources)
    """The part of `resources` beyond what the framework's role is guaranteed: tasks
    launched on it may be preempted for a role below its guarantee or fair share
    (`on_preemption`). The rest is within the guarantee."""


@dataclass(frozen=True, slots=True)
class FrameworkInfo:
    name: str
    role: str = DEFAULT_ROLE
    failover_timeout: float = 0.0
    framework_id: str = ""
    # The Unix user its tasks run as (Mesos' FrameworkInfo.user); "": each agent's
    # --task-user.
    user: str = ""


@dataclass(frozen=True, slots=True)
class TaskUsage:
    """What a running task uses of what it was given, as its agent measured it in the
    task's cgroup (Mesos' ResourceStatistics)."""

    framework_id: str
    task_id: str
    cpus_used: float  # CPU seconds per second since the agent's previous sample
    cpu_seconds: float  # CPU time used since it started
    mem_used_mb: float  # memory charged to it now (what its limit counts)
    mem_peak_mb: float  # the most ever charged
    processes: int  # its processes and threads


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task an agent reports when it registers again."""

    framework_id: str
    task: TaskSpec
    state: TaskState
