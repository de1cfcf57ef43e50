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
import unicodedata
from collections.abc import Callable, Container, Mapping, Sequence

from mesolite.logs import clip as clip  # the one helper (offers, status updates use it too)
from mesolite.master.role_config import is_valid_role
from mesolite.model import DEFAULT_REFUSE_SECONDS, FrameworkInfo, RunningTask, TaskSpec
from mesolite.resources import EMPTY, Resources
from mesolite.sandbox_protocol import format_address, parse_address

ID = re.compile(r"^[A-Za-z0-9_.\-:]{1,200}\Z")  # \Z: "$" lets a final newline in
# A Unix account name as POSIX's portable set allows it and useradd takes it: a letter
# or "_" first (never "-", read as an option, nor a digit, read as a uid), then letters,
# digits, "_", "." and "-", and at most a final "$" (Samba machine accounts).
USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*\$?\Z")

# Bounds on every size a client controls. Messages are at most 4 MiB on the wire
# (mesolite/grpc_utils.py); these bound what the master keeps and shows.
MAX_NAME = 256  # framework, task and host names; role paths
MAX_RESOURCE_NAMES = 64  # named scalars per agent or task
MAX_RESOURCE_NAME = 64
MAX_ATTRIBUTES = 64  # per agent
MAX_ATTRIBUTE_KEY = 128
MAX_ATTRIBUTE_VALUE = 1024
MAX_COMMAND = 64 * 1024
MAX_ENVIRONMENT = 256  # variables per task
MAX_ENVIRONMENT_NAME = 256
MAX_ENVIRONMENT_VALUE = 16 * 1024
MAX_ENVIRONMENT_TOTAL = 64 * 1024  # names and values of a task's variables together
MAX_TASKS_PER_CALL = 1000  # tasks in one ACCEPT
MAX_IDS_PER_CALL = 10_000  # offer ids in an ACCEPT or DECLINE, task ids in a RECONCILE
MAX_TASKS_PER_AGENT = 10_000  # tasks an agent may report when it registers
MAX_FAILOVER_TIMEOUT = 365 * 24 * 3600.0  # a year; Marathon's default is a week
# Distinct updates applied per task (a task has a handful: starting, running, its end).
# Past it an agent's live updates for the task are acknowledged and dropped; its end
# is still applied.
MAX_UPDATES_PER_TASK = 64
MAX_USER = 32  # a framework's user: Linux's useradd takes no longer name
MAX_BATCH_CALLS = 10_000  # calls in one batch message (each still bounded on its own)


# A task id as Mesos allows it (src/common/validation.cpp, validateID): it names the
# task's sandbox directory, so at most NAME_MAX bytes, never "." or "..", no path
# separator, no control character (nor, here, a Unicode format character: ids are shown
# in logs and terminals).
MAX_TASK_ID_BYTES = 255


def task_id_problem(value: str) -> str | None:
    """What is wrong with a task id (Mesos' rules, `MAX_TASK_ID_BYTES`); None if fine."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800
        size = MAX_TASK_ID_BYTES + 1
    if (
        not value
        or size > MAX_TASK_ID_BYTES
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in value)
    ):
        return (
            f"invalid task id {clip(value)!r}: 1-{MAX_TASK_ID_BYTES} bytes, not '.' or '..', "
            "without '/', '\\' or control characters"
        )
    return None


def id_problem(what: str, value: str) -> str | None:
    if not ID.match(value):
        return f"invalid {what} {clip(value)!r}: 1-200 of A-Z a-z 0-9 _ . - :"
    return None


def _name_problem(what: str, value: str) -> str | None:
    if len(value) > MAX_NAME:
        return f"{what} {clip(value)!r} is longer than {MAX_NAME} characters"
    return _text_problem(what, value)


def _text_problem(what: str, value: str) -> str | None:
    """Free text an operator will read (in logs, views, the UI) holds no control or
    format characters: no newlines to forge log lines, no terminal escapes."""
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in value):
        return f"{what} {clip(value)!r} holds control characters"
    return None


def resources_problem(what: str, resources: Resources) -> str | None:
    if len(resources) > MAX_RESOURCE_NAMES:
        return f"{what} names {len(resources)} resources, more than {MAX_RESOURCE_NAMES}"
    for name in resources:
        if len(name) > MAX_RESOURCE_NAME:
            return f"resource name {clip(name)!r} is longer than {MAX_RESOURCE_NAME} characters"
    return None


def framework_info_problem(info: FrameworkInfo) -> str | None:
    """What is wrong with a SUBSCRIBE's FrameworkInfo (its role already defaulted)."""
    if not info.name:
        return "framework name must not be empty"
    if problem := _name_problem("framework name", info.name):
        return problem
    if len(info.role) > MAX_NAME or not is_valid_role(info.role):
        return f"invalid role {clip(info.role)!r}"
    if info.framework_id and (problem := id_problem("framework id", info.framework_id)):
        return problem
    if not (0 <= info.failover_timeout <= MAX_FAILOVER_TIMEOUT):
        return (
            f"failover timeout must be a number of seconds from 0 to {MAX_FAILOVER_TIMEOUT:.0f}"
            f" (a year), got {info.failover_timeout}"
        )
    return user_problem(info.user) if info.user else None


def user_problem(user: str) -> str | None:
    """What is wrong with a framework's user (Mesos' FrameworkInfo.user): a Unix account
    name, at most `MAX_USER` characters of the portable set (`USER`)."""
    if problem := _text_problem("user", user):
        return problem
    if len(user) > MAX_USER:
        return f"user {clip(user)!r} is longer than {MAX_USER} characters"
    if not USER.match(user):
        return (
            f"invalid user {clip(user)!r}: a Unix account name, A-Z a-z 0-9 _ . - "
            "(a letter or _ first, at most a final $)"
        )
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
    if len(tasks) > MAX_TASKS_PER_CALL:
        return f"{len(tasks)} tasks in one call, more than {MAX_TASKS_PER_CALL}"
    seen: set[str] = set()
    for spec in tasks:
        if problem := task_problem(spec, in_use, seen, agent_id):
            return problem
        seen.add(spec.task_id)
    return None


def task_problem(
    spec: TaskSpec, in_use: Container[str], seen: Container[str], agent_id: str
) -> str | None:
    """What is wrong with one task to launch on `agent_id`; `in_use`: the framework's
    live task ids; `seen`: those of the tasks before it in the same call."""
    if problem := task_id_problem(spec.task_id):
        return problem
    if spec.task_id in seen:
        return f"task id {spec.task_id} appears twice in the call"
    if spec.task_id in in_use:
        return f"task id {spec.task_id} is already in use"
    if spec.agent_id and spec.agent_id != agent_id:
        return (
            f"task {spec.task_id} names agent {clip(spec.agent_id)} "
            f"but the offers are for agent {agent_id}"
        )
    return _task_spec_problem(spec)


def _task_spec_problem(spec: TaskSpec) -> str | None:
    task = f"task {spec.task_id}"
    if not spec.command.strip():
        return f"{task} has no command"
    if len(spec.command) > MAX_COMMAND:
        return f"{task}: its command is longer than {MAX_COMMAND} characters"
    if problem := _name_problem(f"{task}: name", spec.name):
        return problem
    if spec.resources.is_empty():
        return f"{task} asks for no resources"
    if problem := resources_problem(task, spec.resources):
        return problem
    return _environment_problem(task, spec.environment)


def _environment_problem(task: str, environment: Mapping[str, str]) -> str | None:
    if len(environment) > MAX_ENVIRONMENT:
        return f"{task} has {len(environment)} environment variables, more than {MAX_ENVIRONMENT}"
    size = sum(len(name) + len(value) for name, value in environment.items())
    if size > MAX_ENVIRONMENT_TOTAL:
        return f"{task}'s environment holds {size} characters, more than {MAX_ENVIRONMENT_TOTAL}"
    for name, value in environment.items():
        if not name or len(name) > MAX_ENVIRONMENT_NAME or "=" in name or "\0" in name:
            return f"{task}: invalid environment variable name {clip(name)!r}"
        if len(value) > MAX_ENVIRONMENT_VALUE or "\0" in value:
            return (
                f"{task}: environment variable {clip(name)} is longer than "
                f"{MAX_ENVIRONMENT_VALUE} characters or holds a NUL"
            )
    return None


def batch_problem(calls: int) -> str | None:
    """A batch of calls: not more than the bound (each call is then checked alone)."""
    if calls > MAX_BATCH_CALLS:
        return f"{calls} calls in one batch, more than {MAX_BATCH_CALLS}"
    return None


def ids_problem(what: str, ids: Sequence[str]) -> str | None:
    """Ids a call names (offers to accept or decline, tasks to reconcile)."""
    if len(ids) > MAX_IDS_PER_CALL:
        return f"{len(ids)} {what} in one call, more than {MAX_IDS_PER_CALL}"
    for value in ids:
        if len(value) > MAX_TASK_ID_BYTES:
            return (
                f"one of the {what} is longer than {MAX_TASK_ID_BYTES} characters: {clip(value)!r}"
            )
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
    if problem := resources_problem("the agent", total):
        return problem
    if agent_id and (problem := id_problem("agent id", agent_id)):
        return problem
    if not agent_id and running:
        return "a new agent cannot have tasks"
    if len(running) > MAX_TASKS_PER_AGENT:
        return f"the agent reports {len(running)} tasks, more than {MAX_TASKS_PER_AGENT}"
    used = _live_resources(running)
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


def agent_info_problem(
    hostname: str, attributes: Mapping[str, str], isolation: str = "", task_user: str = ""
) -> str | None:
    """What is wrong with how an agent describes itself."""
    if problem := (
        _name_problem("hostname", hostname)
        or _name_problem("isolation", isolation)
        or _name_problem("task user", task_user)
    ):
        return problem
    if len(attributes) > MAX_ATTRIBUTES:
        return f"the agent has {len(attributes)} attributes, more than {MAX_ATTRIBUTES}"
    for key, value in attributes.items():
        if not key or len(key) > MAX_ATTRIBUTE_KEY or _text_problem("", key):
            return f"invalid attribute name {clip(key)!r}"
        if len(value) > MAX_ATTRIBUTE_VALUE:
            return f"attribute {clip(key)} is longer than {MAX_ATTRIBUTE_VALUE} characters"
        if problem := _text_problem(f"attribute {clip(key)}", value):
            return problem
    return None


def reported_tasks_problem(
    agent_id: str,
    running: Sequence[RunningTask],
    placed_on: Callable[[str, str], str | None],
    capacity: Resources,
) -> str | None:
    """What is wrong with the tasks a known agent reports when it registers again.

    `placed_on(framework_id, task_id)`: the agent the master placed that task on,
    if any. An agent may not claim another agent's task (it would take over the
    master's record of it), nor report more than its known `capacity`.
    """
    seen: set[tuple[str, str]] = set()
    for rt in running:
        key = (rt.framework_id, rt.task.task_id)
        if problem := id_problem("framework id", key[0]) or task_id_problem(key[1]):
            return problem
        if key in seen:
            return f"task {key[1]} of framework {key[0]} is reported twice"
        seen.add(key)
        if problem := _task_spec_problem(rt.task):
            return problem
        # An ended task holds nothing and changes no record: its id may be in use
        # again, elsewhere.
        where = None if rt.state.is_terminal else placed_on(*key)
        if where is not None and where != agent_id:
            return f"task {key[1]} of framework {key[0]} runs on agent {where}, not {agent_id}"
    used = _live_resources(running)
    if not capacity.contains(used):
        return f"the reported tasks use {used}, more than agent {agent_id}'s {capacity}"
    return None


def _live_resources(running: Sequence[RunningTask]) -> Resources:
    """What the reported tasks hold: those that ended (reported until their end is
    acknowledged) hold nothing."""
    return sum((t.task.resources for t in running if not t.state.is_terminal), EMPTY)
