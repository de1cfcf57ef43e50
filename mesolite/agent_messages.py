"""What the master tells an agent, as domain values: one definition for both ends.

The master builds these and its servicer encodes them (`master/servicers.py`);
the agent's wire edge decodes the same messages into them (`agent/_wire.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mesolite.model import TaskSpec


@dataclass(frozen=True, slots=True)
class AgentRegistered:
    agent_id: str
    heartbeat_interval: float
    batches: bool = False  # the master reads AgentCall.batch


@dataclass(frozen=True, slots=True)
class LaunchTask:
    framework_id: str
    task: TaskSpec
    user: str = ""  # the framework's user; "": the agent's --task-user


@dataclass(frozen=True, slots=True)
class KillTask:
    framework_id: str
    task_id: str


@dataclass(frozen=True, slots=True)
class AcknowledgeUpdate:
    """The framework acknowledged a status update: stop retrying it."""

    framework_id: str
    task_id: str
    update_id: str


AgentMessage = AgentRegistered | LaunchTask | KillTask | AcknowledgeUpdate
