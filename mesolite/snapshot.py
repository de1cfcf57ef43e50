"""The cluster as its readers see it: one typed, immutable snapshot of a master.

`GET /state` is `ClusterSnapshot.to_json()`; the web UI's event stream, the
Prometheus collectors, the CLI views, the demo and the experiment all read the
same types. The master builds a snapshot in one place
(`master.read_model.build_snapshot`), deriving every figure there once; the CLI,
which only has the JSON, gets the same types back with `ClusterSnapshot.from_json`.

The JSON is a contract that tools read: add fields, never rename. Its schema,
generated from these classes (`state_json_schema()`), is committed as
`docs/state.schema.json` (`scripts/gen_state_schema.py` writes and checks it).

Shares are fractions of the cluster's total (0 to 1, before weights); amounts
are in each resource's unit (cpus: cores; mem, disk: MB); times in seconds
since the epoch, except `seconds_since_heartbeat`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mesolite._dataclass_json import DocumentError, decode, doc, encode, json_schema
from mesolite.model import TaskState
from mesolite.resources import EMPTY, Resources

SCHEMA_ID = "urn:mesolite:master:state"

_RESOURCE_WEIGHTS = (
    "a weight vector: the weight of each resource it names (weight is the others'); the "
    "weighted share is then the policy's with each resource's part divided by its weight "
    "(drf: the largest of share/weight over the resources); null for one weight for all"
)


class AgentHealth(enum.StrEnum):
    HEALTHY = "healthy"  # connected, heartbeats on time
    UNHEALTHY = "unhealthy"  # connected, heartbeats late
    DISCONNECTED = "disconnected"  # stream broken: no offers of its resources


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    """The cluster as a whole: resources of all registered agents, and counts."""

    total: Resources = field(metadata=doc("resources of all registered agents"))
    allocated: Resources = field(metadata=doc("held by tasks and by outstanding offers"))
    free: Resources = field(metadata=doc("total minus allocated"))
    agents: int = field(metadata=doc("registered agents, connected or not"))
    frameworks: int = field(metadata=doc("registered frameworks, connected or not"))
    running_tasks: int = field(metadata=doc("tasks not yet in a terminal state"))
    outstanding_offers: int = field(metadata=doc("offers sent and not yet answered or rescinded"))
    usage: Resources = field(
        default=EMPTY,
        metadata=doc(
            "what running tasks use, as their agents measure it in their cgroups "
            "(cpus: CPUs over the last sample, mem: MB); agents without cgroups add nothing"
        ),
    )


@dataclass(frozen=True, slots=True)
class ReservationSnapshot:
    """An agent held for one task of a framework's that does not fit yet (with
    --packing; master/reservations.py): those behind it in order are offered only what
    the task would not need."""

    framework_id: str
    shape: Resources = field(metadata=doc("the task it is held for"))
    seconds: float = field(metadata=doc("how long it has been held"))


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    """One registered agent: its resources, what is allocated on it, and its health."""

    id: str
    hostname: str
    address: str = field(
        metadata=doc(
            "HOST:PORT where the master reads its sandboxes: the IP address it connects "
            "from and the port it registered; empty if it serves none"
        )
    )
    attributes: Mapping[str, str]
    total: Resources
    allocated: Resources = field(metadata=doc("held by tasks and outstanding offers on this agent"))
    free: Resources
    connected: bool
    healthy: bool = field(metadata=doc("connected and its last heartbeat within the agent timeout"))
    seconds_since_heartbeat: float
    running_tasks: int
    registered_at: float
    used: Resources = field(
        default=EMPTY, metadata=doc("what the running tasks on this agent hold")
    )
    offered: Resources = field(
        default=EMPTY, metadata=doc("what outstanding offers of this agent hold")
    )
    usage: Resources = field(
        default=EMPTY,
        metadata=doc(
            "what its running tasks use, as it measures them in their cgroups (cpus: CPUs "
            "over its last sample, mem: MB charged); compare with used, what they hold"
        ),
    )
    isolation: str = field(
        default="",
        metadata=doc(
            "how it contains tasks: cgroups-v2 or cgroups-v1 (a cgroup per task: memory, "
            "CPU and pids limits), or process-tree (the fallback: per-process rlimits and a "
            "process-tree kill); empty if it did not say"
        ),
    )
    task_user: str = field(default="", metadata=doc("the user its tasks run as"))
    reservation: ReservationSnapshot | None = field(
        default=None, metadata=doc("set while the agent is reserved, null otherwise")
    )

    @property
    def health(self) -> AgentHealth:
        if not self.connected:
            return AgentHealth.DISCONNECTED
        return AgentHealth.HEALTHY if self.healthy else AgentHealth.UNHEALTHY


@dataclass(frozen=True, slots=True)
class FrameworkSnapshot:
    """One registered framework: what it holds, and its shares of the cluster."""

    id: str
    name: str
    role: str
    weight: float = field(
        metadata=doc("its role's weight (with resource_weights: for the resources not named there)")
    )
    connected: bool
    suppressed: bool = field(metadata=doc("it asked for no offers"))
    removing: bool = field(metadata=doc("torn down, waiting for its last tasks to end"))
    failover_timeout: float
    allocated: Resources = field(metadata=doc("used plus offered: what the allocator counts"))
    used: Resources = field(metadata=doc("what its running tasks hold"))
    offered: Resources = field(metadata=doc("what its outstanding offers hold"))
    dominant_share: float = field(
        metadata=doc("allocated's largest fraction of any cluster resource")
    )
    weighted_dominant_share: float = field(
        metadata=doc(
            "its share under the master's policy divided by its role's weight: "
            "the allocator offers to the lowest first"
        )
    )
    running_tasks: int
    completed_tasks: int = field(metadata=doc("ended tasks the master remembers"))
    registered_at: float
    used_dominant_share: float = field(
        default=0.0,
        metadata=doc("used's largest fraction of any cluster resource (offers not counted)"),
    )
    user: str = field(
        default="",
        metadata=doc(
            "the Unix user its tasks run as on agents that switch users (FrameworkInfo.user); "
            "empty: each agent's task_user"
        ),
    )
    resource_weights: Mapping[str, float] | None = field(
        default=None, metadata=doc(_RESOURCE_WEIGHTS)
    )


@dataclass(frozen=True, slots=True)
class RoleSnapshot:
    """One role of the role tree: its settings, allocation and fair shares."""

    path: str = field(metadata=doc("'*' or a path like eng/ml"))
    weight: float = field(
        metadata=doc("its weight (with resource_weights: for the resources not named there)")
    )
    guarantee: Resources
    limit: Mapping[str, float] | None = field(
        metadata=doc("at most this much; null for no limit (an amount of 0 means none at all)")
    )
    configured: bool = field(metadata=doc("named in the roles file (not only created by use)"))
    allocated: Resources = field(metadata=doc("held by this role and the roles below it"))
    share: float = field(metadata=doc("allocated's share under the master's policy"))
    weighted_share: float = field(
        metadata=doc("share divided by weight: what the allocator orders by")
    )
    dominant_share: float = field(
        metadata=doc("allocated's largest fraction of any cluster resource")
    )
    steady_fair_share: Resources = field(
        metadata=doc("the cluster divided among all roles by weight")
    )
    instantaneous_fair_share: Resources = field(
        metadata=doc(
            "the cluster divided among active roles, each capped by its demand"
            " (what preemption measures it against)"
        )
    )
    active: bool = field(metadata=doc("a framework in or below it wants offers"))
    frameworks: int = field(metadata=doc("frameworks registered in exactly this role"))
    resource_weights: Mapping[str, float] | None = field(
        default=None, metadata=doc(_RESOURCE_WEIGHTS)
    )


@dataclass(frozen=True, slots=True)
class TaskUsageSnapshot:
    """What a running task uses of what it was given, as its agent last measured it."""

    cpus_used: float = field(metadata=doc("CPU seconds per second over the agent's last sample"))
    cpu_seconds: float = field(metadata=doc("CPU time used since it started"))
    mem_used_mb: float = field(metadata=doc("memory charged to its cgroup now"))
    mem_peak_mb: float = field(metadata=doc("the most memory ever charged to it"))
    processes: int = field(metadata=doc("its processes and threads"))


@dataclass(frozen=True, slots=True)
class PreemptionSnapshot:
    """A task its framework was told will be preempted (master/preemptions.py)."""

    for_role: str = field(metadata=doc("the role its resources are taken back for"))
    kind: str = field(metadata=doc("min_share (that role is below its guarantee) or fair_share"))
    kill_in: float = field(
        metadata=doc("seconds left of its grace period (0: the agent was told to kill it)")
    )


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """A task the master considers running (not yet in a terminal state)."""

    id: str
    name: str
    framework_id: str
    agent_id: str
    state: TaskState
    resources: Resources
    usage: TaskUsageSnapshot | None = field(
        default=None, metadata=doc("null where its agent does not measure it (no cgroups)")
    )
    preempting: PreemptionSnapshot | None = field(
        default=None, metadata=doc("set while the task is being preempted, null otherwise")
    )


@dataclass(frozen=True, slots=True)
class EndedTaskSnapshot:
    """A task that ended recently: its last state and how it ended."""

    id: str
    name: str
    framework_id: str
    agent_id: str
    state: TaskState
    resources: Resources
    message: str
    exit_code: int | None
    ended_at: float | None
    reason: str = field(
        default="",
        metadata=doc(
            "why, when a limit of its container ended it (Mesos' TaskStatus.Reason): "
            "REASON_CONTAINER_LIMITATION_MEMORY, REASON_CONTAINER_LIMITATION; else empty"
        ),
    )


@dataclass(frozen=True, slots=True)
class CompletedFrameworkSnapshot:
    """A framework that ended: torn down (by itself or an operator) or away past its
    failover timeout, and removed once its last task ended. Its ended tasks are in
    `ClusterSnapshot.completed_tasks` under its id."""

    id: str
    name: str
    role: str
    registered_at: float
    ended_at: float = field(metadata=doc("when it was torn down (its tasks then killed)"))
    reason: str = field(
        metadata=doc(
            "why it ended: torn down by the framework, torn down by an operator (named), "
            "its failover timeout expired, ..."
        )
    )
    completed_tasks: int = field(metadata=doc("its ended tasks the master remembers"))
    tasks_by_state: Mapping[str, int] = field(
        metadata=doc("how those tasks ended: a count per terminal state (TASK_FINISHED, ...)")
    )


@dataclass(frozen=True, slots=True)
class OfferSnapshot:
    """An offer sent to a framework and not yet accepted, declined or rescinded."""

    id: str
    framework_id: str
    agent_id: str
    resources: Resources


@dataclass(frozen=True, slots=True)
class WorkloadSnapshot:
    """What every workload submitted with `mesolite run` shows: a job or a service, run by
    the master's built-in frameworks."""

    name: str
    role: str
    owner: str | None = field(metadata=doc("the principal that submitted it; null: anonymous"))
    status: str = field(metadata=doc("active, completed, failed or stopped"))
    framework_id: str = field(
        metadata=doc("the framework that runs it; empty before it subscribes")
    )
    submitted_at: float
    finished_at: float | None
    message: str = field(metadata=doc("the last problem worth showing; empty if none"))
    resources: Resources = field(metadata=doc("what each of its tasks holds"))


@dataclass(frozen=True, slots=True)
class JobSnapshot(WorkloadSnapshot):
    """A job: a command run once per index, so many at a time, failed indices retried."""

    completions: int = field(metadata=doc("indices to run, 0 to completions - 1"))
    parallelism: int = field(metadata=doc("the most tasks running at once"))
    retries: int = field(metadata=doc("a failed index runs again up to this many times"))
    succeeded: int = field(metadata=doc("indices that finished"))
    failed: int = field(metadata=doc("indices that failed retries + 1 times"))
    running: int = field(metadata=doc("indices with a task launched or running"))
    pending: int = field(metadata=doc("indices waiting to be launched"))
    retried: int = field(metadata=doc("retries used, over all indices"))
    failed_indices: tuple[int, ...] = field(
        default=(), metadata=doc("the indices that failed every try (the first 100)")
    )


@dataclass(frozen=True, slots=True)
class ServiceSnapshot(WorkloadSnapshot):
    """A service: instances of a command kept running, each replaced when it ends."""

    instances: int = field(metadata=doc("instances wanted"))
    running: int = field(metadata=doc("instances whose task reported it runs"))
    starting: int = field(metadata=doc("instances launched, not yet reported running"))
    waiting: int = field(metadata=doc("instances waiting to be launched (a restart back-off)"))
    restarts: int = field(metadata=doc("instances replaced after their task ended"))
    restart_policy: str = field(metadata=doc("always, or on-failure"))
    task_ids: tuple[str, ...] = field(default=(), metadata=doc("the instances' live tasks"))


WorkloadViews = tuple[tuple[JobSnapshot, ...], tuple[ServiceSnapshot, ...]]
"""What the built-in workload frameworks show: their jobs and services."""


@dataclass(frozen=True, slots=True)
class MasterSnapshot:
    """One master of a highly available set (`mesolite master --registry etcd://...`)."""

    id: str
    grpc: str = field(metadata=doc("HOST:PORT its gRPC port is reached at"))
    http: str = field(metadata=doc("the base URL of its HTTP port"))


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The state of a master at one moment (GET /state)."""

    master_id: str
    policy: str = field(metadata=doc("the share policy: drf, asset or slots"))
    started_at: float
    time: float = field(metadata=doc("when the snapshot was taken"))
    cluster: ClusterTotals
    frameworks: tuple[FrameworkSnapshot, ...]
    roles: tuple[RoleSnapshot, ...] = field(metadata=doc("every role, sorted by path"))
    agents: tuple[AgentSnapshot, ...]
    offers: tuple[OfferSnapshot, ...]
    tasks: tuple[TaskSnapshot, ...]
    removed_agents: tuple[str, ...] = field(
        metadata=doc(
            "agents removed from the cluster, sorted; they must register again as new agents"
        )
    )
    completed_tasks: tuple[EndedTaskSnapshot, ...] = field(
        default=(),
        metadata=doc(
            "ended tasks, newest first, of the frameworks here and of the completed ones: "
            "every one the master keeps (up to its --max-completed-tasks-per-framework "
            "per framework) in GET /state, the newest 50 in the web UI's events"
        ),
    )
    completed_frameworks: tuple[CompletedFrameworkSnapshot, ...] = field(
        default=(),
        metadata=doc(
            "frameworks that ended, newest first: the master's last "
            "--max-completed-frameworks, kept in memory (a restarted master has none)"
        ),
    )
    jobs: tuple[JobSnapshot, ...] = field(
        default=(), metadata=doc("jobs submitted with `mesolite run`, running and finished")
    )
    services: tuple[ServiceSnapshot, ...] = field(
        default=(), metadata=doc("services submitted with `mesolite run`, running and stopped")
    )
    leader: MasterSnapshot | None = field(
        default=None,
        metadata=doc(
            "the leading master, the one answering (highly available masters on etcd); "
            "None for a single master (the SQLite registry)"
        ),
    )
    standbys: tuple[MasterSnapshot, ...] = field(
        default=(),
        metadata=doc("the masters standing by to take over (as the leader last read them)"),
    )

    def to_json(self) -> dict[str, Any]:
        """The JSON document (GET /state)."""
        document: dict[str, Any] = encode(self)
        return document

    @classmethod
    def from_json(cls, document: Any) -> ClusterSnapshot:
        """Read a GET /state document; raises `DocumentError` if it is not one."""
        return decode(cls, document)

    def framework(self, framework_id: str) -> FrameworkSnapshot | None:
        return next((f for f in self.frameworks if f.id == framework_id), None)

    def framework_names(self) -> dict[str, str]:
        """Every framework's name by id, live and completed."""
        names = {f.id: f.name for f in self.completed_frameworks}
        names.update((f.id, f.name) for f in self.frameworks)
        return names

    def agent(self, agent_id: str) -> AgentSnapshot | None:
        return next((a for a in self.agents if a.id == agent_id), None)


def state_json_schema() -> dict[str, Any]:
    """The JSON Schema of GET /state (committed as docs/state.schema.json)."""
    return json_schema(ClusterSnapshot, id=SCHEMA_ID, title="mesolite master: GET /state")


__all__ = [
    "AgentHealth",
    "AgentSnapshot",
    "ClusterSnapshot",
    "ClusterTotals",
    "CompletedFrameworkSnapshot",
    "DocumentError",
    "EndedTaskSnapshot",
    "FrameworkSnapshot",
    "JobSnapshot",
    "OfferSnapshot",
    "RoleSnapshot",
    "ServiceSnapshot",
    "TaskSnapshot",
    "TaskUsageSnapshot",
    "WorkloadSnapshot",
    "WorkloadViews",
    "state_json_schema",
]
