"""What the master sends: domain messages, turned into protobuf only by the servicers."""

from __future__ import annotations

from dataclasses import dataclass

from mesolite.model import Offer, TaskStatus

# To frameworks ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    framework_id: str
    heartbeat_interval: float


@dataclass(frozen=True, slots=True)
class Offers:
    offers: list[Offer]


@dataclass(frozen=True, slots=True)
class Rescind:
    offer_id: str


@dataclass(frozen=True, slots=True)
class Update:
    status: TaskStatus


@dataclass(frozen=True, slots=True)
class AgentFailure:
    agent_id: str


@dataclass(frozen=True, slots=True)
class Error:
    message: str
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Reconciled:
    """Every answer to the implicit reconciliation `call_id` has been sent."""

    call_id: str
    tasks: int


@dataclass(frozen=True, slots=True)
class Preemption:
    """The task will be killed after `grace_seconds`, for `for_role` (master/preemptions.py)."""

    task_id: str
    agent_id: str
    grace_seconds: float
    for_role: str


FrameworkMessage = (
    Subscribed
    | Offers
    | Rescind
    | Update
    | AgentFailure
    | Error
    | Heartbeat
    | Reconciled
    | Preemption
)

# To agents: defined once, for the master and the agent alike.

from mesolite.agent_messages import (  # noqa: E402
    AcknowledgeUpdate,
    AgentMessage,
    AgentRegistered,
    KillTask,
    LaunchTask,
)

__all__ = [
    "AcknowledgeUpdate",
    "AgentFailure",
    "AgentMessage",
    "AgentRegistered",
    "Error",
    "FrameworkMessage",
    "Heartbeat",
    "KillTask",
    "LaunchTask",
    "Offers",
    "Preemption",
    "Reconciled",
    "Rescind",
    "Subscribed",
    "Update",
]
