"""Mesos v1 protobuf <-> mesolite's domain types, in one place.

What Mesos frameworks send is read here into the types the master core works with
(`FrameworkInfo`, `TaskSpec`), and what the core sends them (`master.messages`) is
written as Mesos' `Event`s. Where Mesos means something mesolite does not do, the
choice is made here and said:

- a framework has one role: `roles` may name one (with MULTI_ROLE), not several;
- a task is a command: `command.value` run by the shell (with `shell: false`, the
  executable and its `arguments`, quoted for the shell); executors, containers,
  URIs to fetch, secrets, and resources that are not unreserved scalars make the
  task invalid (TASK_ERROR), never silently dropped;
- resources are scalars; in offers each is unreserved (`role` "*"), with
  `allocation_info` for a MULTI_ROLE framework, as Mesos offers them;
- attributes are text;
- an update's `uuid` is the bytes of mesolite's update id (acknowledged as it came);
  updates from a task's agent are SOURCE_EXECUTOR (its wrapper plays Mesos' command
  executor), the master's are SOURCE_MASTER and carry no uuid;
- TASK_UNREACHABLE, TASK_DROPPED and TASK_GONE reach a framework that is not
  PARTITION_AWARE as TASK_LOST, as Mesos sends them.
"""

from __future__ import annotations

import contextlib
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.errors import MasterError
from mesolite.master.offers import InvalidTask
from mesolite.model import FrameworkInfo, Offer, StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import InvalidResources, Resources
from mesolite.v1.mesos import mesos_pb2, scheduler_pb2

M = mesos_pb2
Event = scheduler_pb2.Event

# Mesos' Filters.refuse_seconds: beyond a year is a year; negative or not a number of
# seconds is the default (master/allocator/mesos/hierarchical.cpp).
DEFAULT_REFUSE_SECONDS = 5.0
MAX_REFUSE_SECONDS = 365 * 24 * 3600.0

_CAPABILITY = M.FrameworkInfo.Capability
PARTITION_AWARE = _CAPABILITY.PARTITION_AWARE
MULTI_ROLE = _CAPABILITY.MULTI_ROLE

# Lists of one TaskInfo (what the core keeps is bounded again by master/validation.py).
MAX_TASK_RESOURCES = 4 * validation.MAX_RESOURCE_NAMES  # entries (one name may repeat)
MAX_ARGUMENTS = 4096
MAX_ENVIRONMENT = validation.MAX_ENVIRONMENT

_PARTITION_STATES = frozenset({TaskState.UNREACHABLE, TaskState.DROPPED, TaskState.GONE})


class ConvertError(MasterError, ValueError):
    """What a framework sent that mesolite cannot take (the reason, for people)."""


@dataclass(frozen=True, slots=True)
class MesosFramework:
    """A SUBSCRIBE's FrameworkInfo: what the core takes, and what the front door keeps."""

    info: FrameworkInfo
    principal: str | None  # FrameworkInfo.principal, if it names one
    partition_aware: bool
    multi_role: bool


def framework_from_mesos(info: mesos_pb2.FrameworkInfo) -> MesosFramework:
    capabilities = {c.type for c in info.capabilities}
    multi_role = MULTI_ROLE in capabilities
    if multi_role:
        if len(info.roles) > 1:
            raise ConvertError(
                f"the framework names {len(info.roles)} roles; mesolite gives a framework one"
            )
        role = info.roles[0] if info.roles else "*"
    elif info.roles:
        raise ConvertError("'roles' is set but the MULTI_ROLE capability is not")
    else:
        role = info.role
    timeout = info.failover_timeout
    if not math.isfinite(timeout):
        raise ConvertError(f"failover_timeout {timeout} is not a number of seconds")
    return MesosFramework(
        FrameworkInfo(
            name=info.name,
            role=role,
            failover_timeout=timeout,
            framework_id=info.id.value if info.HasField("id") else "",
            user=info.user,
        ),
        info.principal if info.HasField("principal") else None,
        PARTITION_AWARE in capabilities,
        multi_role,
    )


def refuse_seconds(filters: mesos_pb2.Filters | None) -> float | None:
    """The refuse filter a Filters asks for, clamped as Mesos clamps it (never refused);
    None without Filters (the core's default, Mesos' 5 s)."""
    if filters is None:
        return None
    value = filters.refuse_seconds
    if value > MAX_REFUSE_SECONDS:
        return MAX_REFUSE_SECONDS
    if not value >= 0:  # negative, or NaN
        return DEFAULT_REFUSE_SECONDS
    return value


def _resources(resources: Iterable[mesos_pb2.Resource], task: str) -> Resources:
    amounts: dict[str, float] = {}
    for r in resources:
        if r.type != M.Value.SCALAR or not r.HasField("scalar"):
            raise ConvertError(
                f"task {task}: resource {r.name!r} is not a scalar (mesolite has only scalars)"
            )
        if r.reservations or r.HasField("reservation") or r.role not in ("", "*"):
            raise ConvertError(f"task {task}: resource {r.name!r} is reserved (unsupported)")
        amounts[r.name] = amounts.get(r.name, 0.0) + r.scalar.value
    try:
        return Resources(amounts)
    except InvalidResources as e:
        raise ConvertError(f"task {task}: {e}") from None


def _command(command: mesos_pb2.CommandInfo, task: str, user: str) -> tuple[str, dict[str, str]]:
    if command.uris:
        raise ConvertError(f"task {task}: URIs to fetch are not supported")
    if command.HasField("user") and command.user != user:
        raise ConvertError(
            f"task {task}: command.user {command.user!r} differs from the framework's user"
        )
    if command.shell:
        line = command.value
    else:
        line = shlex.join([command.value, *command.arguments[1:]]) if command.value else ""
    environment: dict[str, str] = {}
    for variable in command.environment.variables:
        if variable.type == M.Environment.Variable.SECRET:
            raise ConvertError(f"task {task}: secret environment variables are not supported")
        environment[variable.name] = variable.value
    return line, environment


def _lists_problem(task: mesos_pb2.TaskInfo) -> str | None:
    """A list in a TaskInfo past its bound (checked before any is converted)."""
    for what, n, bound in (
        ("resources", len(task.resources), MAX_TASK_RESOURCES),
        ("arguments", len(task.command.arguments), MAX_ARGUMENTS),
        ("environment variables", len(task.command.environment.variables), MAX_ENVIRONMENT),
    ):
        if n > bound:
            return f"{n} {what}, more than {bound}"
    return None


def task_from_mesos(task: mesos_pb2.TaskInfo, user: str) -> TaskSpec | InvalidTask:
    """A LAUNCH's TaskInfo, or why it cannot run (it then ends TASK_ERROR)."""
    task_id = task.task_id.value
    try:
        if problem := _lists_problem(task):
            raise ConvertError(f"task {task_id}: {problem}")
        if task.HasField("executor"):
            raise ConvertError(f"task {task_id}: executors are not supported, only commands")
        if task.HasField("container"):
            raise ConvertError(f"task {task_id}: containers are not supported")
        if not task.HasField("command"):
            raise ConvertError(f"task {task_id} has no command")
        command, environment = _command(task.command, task_id, user)
        return TaskSpec(
            task_id=task_id,
            command=command,
            resources=_resources(task.resources, task_id),
            name=task.name,
            agent_id=task.agent_id.value,
            environment=environment,
        )
    except ConvertError as e:
        return InvalidTask(task_id, str(e))


# Out: the core's messages as Mesos events ------------------------------------------


def _scalars(resources: Resources, role: str, multi_role: bool) -> list[mesos_pb2.Resource]:
    out = []
    for name, amount in sorted(resources.to_dict().items()):
        r = M.Resource(name=name, type=M.Value.SCALAR, scalar=M.Value.Scalar(value=amount))
        r.role = "*"
        if multi_role:
            r.allocation_info.role = role
        out.append(r)
    return out


def offer_to_mesos(offer: Offer, role: str, multi_role: bool) -> mesos_pb2.Offer:
    pb = M.Offer(
        id=M.OfferID(value=offer.offer_id),
        framework_id=M.FrameworkID(value=offer.framework_id),
        agent_id=M.AgentID(value=offer.agent_id),
        hostname=offer.hostname,
        resources=_scalars(offer.resources, role, multi_role),
        attributes=[
            M.Attribute(name=k, type=M.Value.TEXT, text=M.Value.Text(value=v))
            for k, v in sorted(offer.attributes.items())
        ],
    )
    if multi_role:
        pb.allocation_info.role = role
    return pb


def _state(state: TaskState, partition_aware: bool) -> TaskState:
    if state in _PARTITION_STATES and not partition_aware:
        return TaskState.LOST
    return state


def status_to_mesos(status: TaskStatus, partition_aware: bool) -> mesos_pb2.TaskStatus:
    pb = M.TaskStatus(
        task_id=M.TaskID(value=status.task_id),
        state=M.TaskState.Value(_state(status.state, partition_aware).value),
        timestamp=status.timestamp,
    )
    message = status.message
    if status.exit_code is not None and str(status.exit_code) not in message:
        message = (
            f"{message} (exit code {status.exit_code})"
            if message
            else (f"exit code {status.exit_code}")
        )
    if message:
        pb.message = message
    if status.agent_id:
        pb.agent_id.value = status.agent_id
    if status.source is StatusSource.MASTER:
        pb.source = M.TaskStatus.SOURCE_MASTER
    else:
        pb.source = M.TaskStatus.SOURCE_EXECUTOR
        if status.update_id:
            pb.uuid = status.update_id.encode()
    reason = status.reason
    if not reason and status.source is StatusSource.MASTER:
        reason = _MASTER_REASONS.get(status.state, "")
        if status.message == "reconciliation" or status.message.startswith("reconciliation:"):
            reason = "REASON_RECONCILIATION"
    if reason:
        with contextlib.suppress(ValueError):  # a reason Mesos does not name: none
            pb.reason = M.TaskStatus.Reason.Value(reason)
    return pb


# The reason of an update the master makes on its own without one.
_MASTER_REASONS = {TaskState.LOST: "REASON_AGENT_REMOVED"}


def update_id_of(uuid: bytes) -> str:
    """The update id an ACKNOWLEDGE's uuid names (what `status_to_mesos` sent)."""
    try:
        return uuid.decode()
    except UnicodeDecodeError:
        return ""


def event_of(
    message: msg.FrameworkMessage, role: str, partition_aware: bool, multi_role: bool
) -> scheduler_pb2.Event | None:
    """The Mesos event for a core message; None for those Mesos has no event for."""
    match message:
        case msg.Subscribed(framework_id, interval):
            return Event(
                type=Event.SUBSCRIBED,
                subscribed=Event.Subscribed(
                    framework_id=M.FrameworkID(value=framework_id),
                    heartbeat_interval_seconds=interval,
                ),
            )
        case msg.Offers(offers):
            return Event(
                type=Event.OFFERS,
                offers=Event.Offers(offers=[offer_to_mesos(o, role, multi_role) for o in offers]),
            )
        case msg.Rescind(offer_id):
            return Event(
                type=Event.RESCIND, rescind=Event.Rescind(offer_id=M.OfferID(value=offer_id))
            )
        case msg.Update(status):
            return Event(
                type=Event.UPDATE,
                update=Event.Update(status=status_to_mesos(status, partition_aware)),
            )
        case msg.AgentFailure(agent_id):
            return Event(
                type=Event.FAILURE, failure=Event.Failure(agent_id=M.AgentID(value=agent_id))
            )
        case msg.Error(text, _):
            return error_event(text)
        case msg.Heartbeat():
            return Event(type=Event.HEARTBEAT)
    return None  # Reconciled: mesolite's own marker


def error_event(text: str) -> scheduler_pb2.Event:
    return Event(type=Event.ERROR, error=Event.Error(message=text))
