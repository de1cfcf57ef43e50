"""The agent's edge of the AgentGateway stream: AgentEvent messages in, AgentCall
messages out. The rest of the agent only sees domain values: the master's
messages (`mesolite.agent_messages`, shared with the master) and `InvalidLaunch`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mesolite import convert
from mesolite.agent_messages import AcknowledgeUpdate as Acknowledge
from mesolite.agent_messages import AgentRegistered as Registered
from mesolite.agent_messages import KillTask, LaunchTask
from mesolite.model import RunningTask, TaskState, TaskStatus, TaskUsage
from mesolite.resources import InvalidResources, Resources
from mesolite.v1 import agent_pb2

__all__ = [
    "Acknowledge",
    "Event",
    "InvalidLaunch",
    "KillTask",
    "LaunchTask",
    "Registered",
    "batch_call",
    "event_from_proto",
    "events_from_proto",
    "heartbeat_call",
    "register_call",
    "status_update_call",
]


@dataclass(frozen=True, slots=True)
class InvalidLaunch:
    """A launch whose task could not be read; the agent reports it as failed."""

    framework_id: str
    task_id: str
    reason: str


Event = Registered | LaunchTask | InvalidLaunch | KillTask | Acknowledge


def events_from_proto(msg: agent_pb2.AgentEvent) -> list[Event | None]:
    """The events in `msg`, in order: those of a batch, or the one it is."""
    if msg.WhichOneof("event") == "batch":
        return [event_from_proto(event) for event in msg.batch.events]
    return [event_from_proto(msg)]


def event_from_proto(msg: agent_pb2.AgentEvent) -> Event | None:
    """The event in `msg`, or None for an empty or unknown one."""
    kind = msg.WhichOneof("event")
    if kind == "registered":
        r = msg.registered
        return Registered(r.agent_id, r.heartbeat_interval_seconds, r.batches)
    if kind == "launch_task":
        launch = msg.launch_task
        try:
            task = convert.task_from_proto(launch.task)
        except (InvalidResources, ValueError) as e:
            return InvalidLaunch(launch.framework_id, launch.task.task_id, str(e))
        return LaunchTask(launch.framework_id, task, launch.user)
    if kind == "kill_task":
        return KillTask(msg.kill_task.framework_id, msg.kill_task.task_id)
    if kind == "acknowledge":
        a = msg.acknowledge
        return Acknowledge(a.framework_id, a.task_id, a.update_id)
    return None


def register_call(
    *,
    agent_id: str,
    hostname: str,
    address: str,
    total: Resources,
    attributes: Mapping[str, str],
    tasks: Iterable[RunningTask],
    isolation: str = "",
    task_user: str = "",
) -> agent_pb2.AgentCall:
    return agent_pb2.AgentCall(
        register=agent_pb2.AgentCall.Register(
            agent_id=agent_id,
            hostname=hostname,
            address=address,
            total=convert.resources_to_proto(total),
            attributes=dict(attributes),
            tasks=[convert.running_task_to_proto(t) for t in tasks],
            isolation=isolation,
            task_user=task_user,
            batches=True,
        )
    )


def batch_call(calls: list[agent_pb2.AgentCall]) -> agent_pb2.AgentCall:
    """Several calls in one message (only once the master said it reads them)."""
    return agent_pb2.AgentCall(batch=agent_pb2.AgentCall.Batch(calls=calls))


def heartbeat_call(usage: Iterable[TaskUsage] = ()) -> agent_pb2.AgentCall:
    return agent_pb2.AgentCall(
        heartbeat=agent_pb2.AgentCall.Heartbeat(usage=[convert.usage_to_proto(u) for u in usage])
    )


def status_update_call(status: TaskStatus, latest_state: TaskState) -> agent_pb2.AgentCall:
    return agent_pb2.AgentCall(
        status_update=agent_pb2.AgentCall.StatusUpdate(
            status=convert.status_to_proto(status),
            latest_state=convert.task_state_to_proto(latest_state),
        )
    )
