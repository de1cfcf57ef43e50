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
    STAGING = "TASK_STAGING"
    STARTING = "TASK_STARTING"
    RUNNING = "TASK_RUNNING"
    KILLING = "TASK_KILLING"
    FINISHED = "TASK_FINISHED"
    FAILED = "TASK_FAILED"
    KILLED = "TASK_KILLED"
    LOST = "TASK_LOST"
    ERROR = "TASK_ERROR"
    DROPPED = "TASK_DROPPED"
    UNREACHABLE = "TASK_UNREACHABLE"
    GONE = "TASK_GONE"

    @property
    def is_terminal(self) -> bool:
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
    MASTER = "master"
    AGENT = "agent"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What a framework asks to run: a shell command with the resources it needs."""

    task_id: str
    command: str
    resources: Resources
    name: str = ""
    agent_id: str = ""
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TaskStatus:
    task_id: str
    framework_id: str
    agent_id: str
    state: TaskState
    message: str = ""
    exit_code: int | None = None
    timestamp: float = 0.0
    # Set on agent updates; the framework acknowledges the update by this id.
    update_id: str = ""
    source: StatusSource = StatusSource.AGENT
    # Mesos' TaskStatus.Reason name when a limit of the task's container ended it
    # (REASON_CONTAINER_LIMITATION_MEMORY, REASON_CONTAINER_LIMITATION); else empty.
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    offer_id: str
    framework_id: str
    agent_id: str
    hostname: str
    resources: Resources
    attributes: dict[str, str] = field(default_factory=dict)


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
