"""What the master sends: domain messages, turned into protobuf only by the servicers."""

from __future__ import annotations

from dataclasses import dataclass

from mesolite.model import Offer, TaskSpec, TaskStatus

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


FrameworkMessage = Subscribed | Offers | Rescind | Update | AgentFailure | Error | Heartbeat

# To agents ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRegistered:
    agent_id: str
    heartbeat_interval: float


@dataclass(frozen=True, slots=True)
class LaunchTask:
    framework_id: str
    task: TaskSpec


@dataclass(frozen=True, slots=True)
class KillTask:
    framework_id: str
    task_id: str


@dataclass(frozen=True, slots=True)
class AcknowledgeUpdate:
    framework_id: str
    task_id: str
    update_id: str


AgentMessage = AgentRegistered | LaunchTask | KillTask | AcknowledgeUpdate
