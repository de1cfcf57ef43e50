"""Conversions between protobuf messages and the domain model, in one place.

Everything that reads a message from the wire goes through here, so malformed
input (bad resource amounts, unknown enum values) is rejected at the boundary
with `InvalidResources` or `ValueError` before any state is touched.
"""

from __future__ import annotations

from mesolite.model import (
    FrameworkInfo,
    Offer,
    RunningTask,
    StatusSource,
    TaskSpec,
    TaskState,
    TaskStatus,
    TaskUsage,
)
from mesolite.resources import Resources
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2


def resources_from_proto(msg: common_pb2.Resources) -> Resources:
    return Resources(dict(msg.scalars))


def resources_to_proto(resources: Resources) -> common_pb2.Resources:
    return common_pb2.Resources(scalars=resources.to_dict())


# Enum conversions as tables built once: on the hot path (every status update, both
# ways) a dict lookup, not protobuf's descriptor search by name.
_STATES_BACK: dict[int, TaskState] = {
    common_pb2.TaskState.Value(state.value): state for state in TaskState
}
_STATES = {state: number for number, state in _STATES_BACK.items()}
_REASONS_BACK: dict[int, str] = {
    v.number: v.name for v in common_pb2.TaskStatus.Reason.DESCRIPTOR.values
}
_REASONS = {name: number for number, name in _REASONS_BACK.items()}


def task_state_from_proto(value: int) -> TaskState:
    try:
        return _STATES_BACK[value]
    except KeyError:
        raise ValueError(f"unknown task state {value}") from None


def task_state_to_proto(state: TaskState) -> common_pb2.TaskState.ValueType:
    return _STATES[state]  # type: ignore[return-value]


def task_from_proto(msg: common_pb2.TaskInfo) -> TaskSpec:
    return TaskSpec(
        task_id=msg.task_id,
        name=msg.name,
        command=msg.command,
        resources=resources_from_proto(msg.resources),
        agent_id=msg.agent_id,
        environment=dict(msg.environment),
    )


def task_to_proto(task: TaskSpec) -> common_pb2.TaskInfo:
    return common_pb2.TaskInfo(
        task_id=task.task_id,
        name=task.name,
        command=task.command,
        resources=resources_to_proto(task.resources),
        agent_id=task.agent_id,
        environment=task.environment,
    )


_SOURCES = {
    StatusSource.MASTER: common_pb2.TaskStatus.SOURCE_MASTER,
    StatusSource.AGENT: common_pb2.TaskStatus.SOURCE_AGENT,
}
_SOURCES_BACK = {v: k for k, v in _SOURCES.items()}


def status_from_proto(msg: common_pb2.TaskStatus) -> TaskStatus:
    reason = ""
    if msg.reason:
        try:
            reason = _REASONS_BACK[msg.reason]
        except KeyError:
            raise ValueError(f"unknown task status reason {msg.reason}") from None
    return TaskStatus(
        task_id=msg.task_id,
        framework_id=msg.framework_id,
        agent_id=msg.agent_id,
        state=task_state_from_proto(msg.state),
        message=msg.message,
        exit_code=msg.exit_code if msg.HasField("exit_code") else None,
        timestamp=msg.timestamp,
        update_id=msg.update_id,
        source=_SOURCES_BACK.get(msg.source, StatusSource.AGENT),
        reason=reason,
    )


def status_to_proto(status: TaskStatus) -> common_pb2.TaskStatus:
    msg = common_pb2.TaskStatus(
        task_id=status.task_id,
        framework_id=status.framework_id,
        agent_id=status.agent_id,
        state=task_state_to_proto(status.state),
        message=status.message,
        timestamp=status.timestamp,
        update_id=status.update_id,
        source=_SOURCES[status.source],
    )
    if status.exit_code is not None:
        msg.exit_code = status.exit_code
    if status.reason in _REASONS:  # one this version does not know: unspecified
        msg.reason = _REASONS[status.reason]  # type: ignore[assignment]
    return msg


def offer_from_proto(msg: scheduler_pb2.Offer) -> Offer:
    return Offer(
        offer_id=msg.offer_id,
        framework_id=msg.framework_id,
        agent_id=msg.agent_id,
        hostname=msg.hostname,
        resources=resources_from_proto(msg.resources),
        attributes=dict(msg.attributes),
        revocable=resources_from_proto(msg.revocable),
    )


def offer_to_proto(offer: Offer) -> scheduler_pb2.Offer:
    return scheduler_pb2.Offer(
        offer_id=offer.offer_id,
        framework_id=offer.framework_id,
        agent_id=offer.agent_id,
        hostname=offer.hostname,
        resources=resources_to_proto(offer.resources),
        attributes=offer.attributes,
        revocable=resources_to_proto(offer.revocable),
    )


def framework_info_from_proto(msg: scheduler_pb2.FrameworkInfo) -> FrameworkInfo:
    return FrameworkInfo(
        name=msg.name,
        role=msg.role,
        failover_timeout=msg.failover_timeout_seconds,
        framework_id=msg.framework_id,
        user=msg.user,
    )


def framework_info_to_proto(info: FrameworkInfo) -> scheduler_pb2.FrameworkInfo:
    return scheduler_pb2.FrameworkInfo(
        name=info.name,
        role=info.role,
        failover_timeout_seconds=info.failover_timeout,
        framework_id=info.framework_id,
        user=info.user,
    )


def running_task_from_proto(msg: agent_pb2.RunningTask) -> RunningTask:
    return RunningTask(
        framework_id=msg.framework_id,
        task=task_from_proto(msg.task),
        state=task_state_from_proto(msg.state),
    )


def running_task_to_proto(task: RunningTask) -> agent_pb2.RunningTask:
    return agent_pb2.RunningTask(
        framework_id=task.framework_id,
        task=task_to_proto(task.task),
        state=task_state_to_proto(task.state),
    )


def usage_from_proto(msg: agent_pb2.TaskUsage) -> TaskUsage:
    """Raises ValueError for figures no measurement gives (negative, not finite)."""
    figures = (msg.cpus_used, msg.cpu_seconds, msg.mem_used_mb, msg.mem_peak_mb)
    if not all(0.0 <= f < float("inf") for f in figures):
        raise ValueError(f"invalid usage of task {msg.task_id!r}: {figures}")
    return TaskUsage(
        framework_id=msg.framework_id,
        task_id=msg.task_id,
        cpus_used=msg.cpus_used,
        cpu_seconds=msg.cpu_seconds,
        mem_used_mb=msg.mem_used_mb,
        mem_peak_mb=msg.mem_peak_mb,
        processes=msg.processes,
    )


def usage_to_proto(usage: TaskUsage) -> agent_pb2.TaskUsage:
    return agent_pb2.TaskUsage(
        framework_id=usage.framework_id,
        task_id=usage.task_id,
        cpus_used=usage.cpus_used,
        cpu_seconds=usage.cpu_seconds,
        mem_used_mb=usage.mem_used_mb,
        mem_peak_mb=usage.mem_peak_mb,
        processes=usage.processes,
    )
