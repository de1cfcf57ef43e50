"""Calls in, events out: Mesos' JSON (field names as in the protos, snake_case) and
binary protobuf bodies, to and from the protobuf types of `mesolite.v1.mesos`.

What a client sends is bounded before it is converted: the body's size (by the
endpoint), and here every list a call may carry, counted on the parsed JSON document
before `json_format` turns it into a message (the costly step, a few microseconds a
field) or on the decoded protobuf (where counting is free). So an ACCEPT with a
quarter of a million tiny tasks is refused in microseconds, before any of its tasks
is looked at.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from mesolite.master import validation
from mesolite.master.errors import MasterError
from mesolite.master.mesos_api import media
from mesolite.v1.mesos import scheduler_pb2

Call = scheduler_pb2.Call
Event = scheduler_pb2.Event

MAX_OPERATIONS = 64  # operations in one ACCEPT
MAX_LIST = validation.MAX_IDS_PER_CALL  # any other list in a call: ids, roles, requests


class BadCall(MasterError, ValueError):
    """A body that is not a Call, or one past a bound: 400, with Mesos' wording."""


def _items(document: Any, *path: str) -> list[Any]:
    """The list at `path` in a JSON document; [] when absent or not a list (then
    `json_format` refuses it with its own error)."""
    node = document
    for key in path:
        if not isinstance(node, dict):
            return []
        node = node.get(key)
    return node if isinstance(node, list) else []


def _tasks_in(operations: list[Any], tasks_of: Callable[[Any], list[Any]]) -> int:
    return sum(len(tasks_of(op)) for op in operations)


def _bounds_problem(lists: Iterator[tuple[str, int]], operations: int, tasks: int) -> str | None:
    if operations > MAX_OPERATIONS:
        return f"{operations} operations in one ACCEPT, more than {MAX_OPERATIONS}"
    if tasks > validation.MAX_TASKS_PER_CALL:
        return f"{tasks} tasks in one ACCEPT, more than {validation.MAX_TASKS_PER_CALL}"
    for what, n in lists:
        if n > MAX_LIST:
            return f"{n} {what} in one call, more than {MAX_LIST}"
    return None


def _json_bounds(document: dict[str, Any]) -> str | None:
    operations = _items(document, "accept", "operations")
    tasks = _tasks_in(
        operations[: MAX_OPERATIONS + 1],
        lambda op: (
            _items(op, "launch", "task_infos") + _items(op, "launch_group", "task_group", "tasks")
        ),
    )
    lists = ((f"{'.'.join(path)} entries", len(_items(document, *path))) for path in _LISTS)
    return _bounds_problem(lists, len(operations), tasks)


def _message_bounds(call: scheduler_pb2.Call) -> str | None:
    operations = call.accept.operations
    tasks = sum(
        len(op.launch.task_infos) + len(op.launch_group.task_group.tasks) for op in operations
    )
    lists = ((f"{'.'.join(path)} entries", len(_field(call, path))) for path in _LISTS)
    return _bounds_problem(lists, len(operations), tasks)


# The lists of a Call outside ACCEPT's operations, each bounded by MAX_LIST (the
# tasks' own lists, resources and environments, are bounded as each task is converted).
_LISTS = (
    ("accept", "offer_ids"),
    ("decline", "offer_ids"),
    ("reconcile", "tasks"),
    ("revive", "roles"),
    ("suppress", "roles"),
    ("request", "requests"),
    ("subscribe", "suppressed_roles"),
    ("subscribe", "framework_info", "roles"),
    ("subscribe", "framework_info", "capabilities"),
)


def _field(message: Message, path: tuple[str, ...]) -> Any:
    node: Any = message
    for name in path:
        node = getattr(node, name)
    return node


def parse_call(body: bytes, encoding: str) -> scheduler_pb2.Call:
    """The Call in a request body of `encoding` (media.JSON or media.PROTOBUF); raises
    BadCall for one that does not parse or is past a bound."""
    if encoding == media.PROTOBUF:
        try:
            call = Call.FromString(body)
        except DecodeError as e:
            raise BadCall(f"Failed to parse body into Call protobuf: {e}") from None
        if problem := _message_bounds(call):
            raise BadCall(problem)
        return call
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadCall(f"Failed to parse body into JSON: {str(e)[:200]}") from None
    if not isinstance(document, dict):
        raise BadCall("Failed to convert JSON into Call protobuf: not a JSON object")
    if problem := _json_bounds(document):
        raise BadCall(problem)
    try:
        return json_format.ParseDict(document, Call(), ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise BadCall(f"Failed to convert JSON into Call protobuf: {str(e)[:300]}") from None


def encode(message: Message, encoding: str) -> bytes:
    """A message (an Event) as `encoding` says: compact JSON with the protos' field
    names, enums by name, bytes in base64; or binary protobuf."""
    if encoding == media.PROTOBUF:
        return message.SerializeToString()
    document = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(document, separators=(",", ":")).encode()


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON form of a message as a dict (for tests and logs)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
