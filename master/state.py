"""What the master knows: its records of agents, frameworks, tasks and offers.

Plain mutable dataclasses, owned by the master's core (`master/core.py`) and
changed only by its handlers. Everything else reads them through the read
model (`master/read_model.py`), which turns them into one `ClusterSnapshot`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mesolite.master import messages as msg
from mesolite.master.effects import Cancellable, Peer
from mesolite.model import FrameworkInfo, Offer, TaskSpec, TaskState, TaskStatus, TaskUsage
from mesolite.resources import Resources


@dataclass(slots=True)
class TaskRecord:
    spec: TaskSpec
    framework_id: str
    agent_id: str
    state: TaskState = TaskState.STAGING
    status: TaskStatus | None = None
    applied_updates: set[str] = field(default_factory=set)
    # Ended (its resources given back) on an agent's word that a terminal update
    # is queued behind the ones the framework has not acknowledged yet; those
    # updates, the terminal one last, are still forwarded when they come.
    end_pending: bool = False
    # What it uses, as its agent last measured it (heartbeats); None if unmeasured.
    usage: TaskUsage | None = None
    # When the master saw it end (wall clock), for an end whose status has no time.
    ended_at: float | None = None
    launched_at: float = 0.0  # the core's clock when it was accepted (0: adopted)


@dataclass(slots=True)
class AgentRecord:
    agent_id: str
    hostname: str
    address: str
    total: Resources
    attributes: dict[str, str]
    outbox: Peer[msg.AgentMessage] | None
    last_seen: float
    registered_at: float
    tasks: dict[tuple[str, str], TaskRecord] = field(default_factory=dict)  # (framework, task)
    # Who registered it (from the connection; None without authentication): only
    # that principal may register with this agent id again.
    principal: str | None = None
    # How it contains its tasks, and as whom they run, as it said when it registered.
    isolation: str = ""
    task_user: str = ""

    @property
    def connected(self) -> bool:
        return self.outbox is not None


@dataclass(slots=True)
class FrameworkRecord:
    framework_id: str
    info: FrameworkInfo
    outbox: Peer[msg.FrameworkMessage] | None
    registered_at: float
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    completed: deque[TaskRecord] = field(default_factory=deque)
    completed_by_id: dict[str, TaskRecord] = field(default_factory=dict)  # the newest
    # Ended tasks pushed out of `completed` (the newest of their id) while their end is
    # still pending (`end_pending`): their updates must still reach the framework.
    ending: dict[str, TaskRecord] = field(default_factory=dict)
    # Task id -> agent id -> how many of `completed` and `ending` ran there (an id may be
    # used again, on another agent): which agents may still send updates of an ended task.
    completed_on: dict[str, dict[str, int]] = field(default_factory=dict)
    offers: set[str] = field(default_factory=set)
    suppressed: bool = False
    disconnected_at: float | None = None
    failover_timer: Cancellable | None = None
    # Updates the master made (say, TASK_LOST) while the framework was away,
    # sent when it subscribes again.
    undelivered: list[TaskStatus] = field(default_factory=list)
    # Call ids of implicit reconciliations on its current stream that wait for
    # agents re-registering after a restart (master/status_updates.py).
    deferred_reconciliations: list[str] = field(default_factory=list)
    # Torn down, waiting for its tasks to end; unknown to everyone else.
    removing: bool = False
    # What it declared it waits for: (task shape, count) pairs (None: nothing declared).
    demand: tuple[tuple[Resources, int], ...] | None = None
    # When it was torn down (wall clock) and why; kept in the history after it is
    # removed (`MasterCore.completed_frameworks`).
    ended_at: float | None = None
    end_reason: str = ""
    # Once in the history (its ended tasks no longer change): how many ended in each state.
    ended_counts: dict[str, int] = field(default_factory=dict)
    # Who subscribed it (from the connection; None without authentication): only
    # that principal may subscribe with this framework id again.
    principal: str | None = None

    @property
    def connected(self) -> bool:
        return self.outbox is not None


@dataclass(slots=True)
class OfferRecord:
    offer: Offer
    expiry_timer: Cancellable | None
