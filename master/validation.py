"""Pure validation of what frameworks and agents ask for, in one place.

Each function looks at a request and the little state it needs (passed in),
changes nothing, and returns what is wrong with it, or None. The handlers
call them before they change anything; the shape of messages (types, enums,
finite numbers) was already checked at the wire (`mesolite/convert.py`).
As Mesos' `master/validation.hpp`: `Option<Error> validate(...)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Sequence

from mesolite.logs import clip
from mesolite.master.roles import is_valid_role
from mesolite.model import DEFAULT_REFUSE_SECONDS, FrameworkInfo, RunningTask, TaskSpec
from mesolite.resources import EMPTY, Resources
from mesolite.sandbox_protocol import format_address, parse_address

ID = re.compile(r"^[A-Za-z0-9_.\-:]{1,200}$")


def framework_info_problem(info: FrameworkInfo) -> str | None:
    """What is wrong with a SUBSCRIBE's FrameworkInfo (its role already defaulted)."""
    if not info.name:
        return "framework name must not be empty"
    if not is_valid_role(info.role):
        return f"invalid role {clip(info.role)!r}"
    if not (0 <= info.failover_timeout < math.inf):
        return f"failover timeout must be a finite number >= 0, got {info.failover_timeout}"
    return None


def refuse_seconds_problem(value: float | None) -> str | None:
    if value is not None and not (0 <= value < math.inf):
        return f"refuse_seconds must be a finite number >= 0, got {value}"
    return None


def refuse_seconds(value: float | None) -> float:
    """The filter a decline or accept asks for (valid per `refuse_seconds_problem`)."""
    return DEFAULT_REFUSE_SECONDS if value is None else value


def tasks_problem(tasks: Sequence[TaskSpec], in_use: Container[str], agent_id: str) -> str | None:
    """What is wrong with tasks to launch on `agent_id`; `in_use`: the framework's live ids."""
    seen: set[str] = set()
    for spec in tasks:
        if not ID.match(spec.task_id):
            return f"invalid task id {clip(spec.task_id)!r}"
        if spec.task_id in seen:
            return f"task id {spec.task_id} appears twice in the call"
        if spec.task_id in in_use:
            return f"task id {spec.task_id} is already in use"
        if spec.agent_id and spec.agent_id != agent_id:
            return (
                f"task {spec.task_id} names agent {clip(spec.agent_id)} "
                f"but the offers are for agent {agent_id}"
            )
        if not spec.command.strip():
            return f"task {spec.task_id} has no command"
        if spec.resources.is_empty():
            return f"task {spec.task_id} asks for no resources"
        seen.add(spec.task_id)
    return None


def resources_of(tasks: Sequence[TaskSpec]) -> Resources:
    return sum((spec.resources for spec in tasks), EMPTY)


def agent_registration_problem(
    agent_id: str, total: Resources, running: Sequence[RunningTask], address: str = ""
) -> str | None:
    """What is wrong with a registration in itself (the agent id's standing aside)."""
    if total.is_empty():
        return "agent offers no resources"
    if address and parse_address(address) is None:
        return f"invalid sandbox address {clip(address)!r}: expected HOST:PORT"
    if agent_id and not ID.match(agent_id):
        return f"invalid agent id {clip(agent_id)!r}"
    if not agent_id and running:
        return "a new agent cannot have tasks"
    used = sum((t.task.resources for t in running), EMPTY)
    if not total.contains(used):
        return f"running tasks use {used}, more than the agent's {total}"
    return None


def sandbox_address(address: str, peer_host: str) -> str:
    """Where the master reads an agent's sandboxes: HOST:PORT, or "" for nowhere.

    `address` is what the agent registered (valid per `agent_registration_problem`);
    `peer_host` the IP address its connection comes from, if known. The port is the
    agent's to say; the host is the peer's, so an agent can only point the master at
    its own machine, never at another host (server-side request forgery).
    """
    parsed = parse_address(address) if address else None
    if parsed is None:
        return ""
    host, port = parsed
    return format_address(peer_host or host, port)
