"""Authorization: which principal may do what, from an ACL file in the style of Mesos' `--acls`.

Pure: parsing and decisions, no I/O but `load_acls` reading the file. The master
asks `Acls.allows(action, principal, object)`; where each action is checked:

    register_frameworks   SUBSCRIBE (and re-subscribe), and submitting a workload
                          (`mesolite run`, POST /workloads), object: the role
    run_tasks             SUBSCRIBE (and re-subscribe) of a framework that names a user
                          (FrameworkInfo.user), object: that user; see `may_run_tasks_as`
    register_agents       agent REGISTER (and re-register); no object
    teardown_frameworks   an operator's teardown of a framework (POST
                          /api/v1/frameworks/{id}/teardown), object: the
                          framework's principal; and stopping another principal's
                          workload (`mesolite stop`, POST /workloads/{name}/stop),
                          object: the workload's submitter
    kill_tasks            an operator's kill of one task (POST
                          /api/v1/frameworks/{id}/tasks/{task}/kill), object: the
                          framework's principal. An action of its own, not
                          teardown's rule: killing one task of a service (to see it
                          replaced, say) is a smaller right than ending the service.
    view_state            GET /state, /metrics, /events and the web UI; no object
    access_sandboxes      a task's stdout/stderr through the master,
                          object: the principal of the task's framework

The file is JSON, one list of entries per action, read in order:

    {
      "permissive": false,
      "register_frameworks": [
        {"principals": {"values": ["team-a"]}, "roles": {"values": ["a", "a/*"]}},
        {"principals": {"type": "ANY"}, "roles": {"type": "NONE"}}
      ],
      "run_tasks": [
        {"principals": {"values": ["team-a"]}, "users": {"values": ["team-a"]}}
      ],
      "register_agents": [{"principals": {"values": ["agent-1", "agent-2"]}}],
      "view_state": [{"principals": {"type": "ANY"}}],
      "access_sandboxes": [
        {"principals": {"values": ["admin"]}, "framework_principals": {"type": "ANY"}}
      ]
    }

An entity is `{"values": [...]}`, `{"type": "ANY"}` or `{"type": "NONE"}`; an
entry without its object key means ANY. For a request, the first entry whose
`principals` match decides if its object matches (allowed) or is NONE (denied);
an entry whose object does not match is passed over. When no entry decides,
`permissive` does (default false: what the file does not allow is denied, the
opposite of Mesos' default, which is true). A role value `a/*` matches every role
below `a` (`a/x`, `a/x/y`), not `a` itself: `["a", "a/*"]` is a's whole subtree.
Unauthenticated requests (no principal) match only `ANY`.

`run_tasks` and root: a framework that names no user runs its tasks as each agent's
`--task-user` and needs no `run_tasks` entry. The user `root` must be named: a `users`
of ANY, `permissive`, or having no ACL file at all never lets a framework run tasks as
root (Mesos lets ANY cover root; mesolite does not). Agents refuse other names for uid 0.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mesolite.master.errors import MasterError

MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 10_000  # per entity


class AclError(MasterError):
    """The ACL file cannot be used; the master keeps the ACLs it had."""


class Action(enum.Enum):
    REGISTER_FRAMEWORKS = "register_frameworks"
    REGISTER_AGENTS = "register_agents"
    RUN_TASKS = "run_tasks"
    TEARDOWN_FRAMEWORKS = "teardown_frameworks"
    KILL_TASKS = "kill_tasks"
    VIEW_STATE = "view_state"
    ACCESS_SANDBOXES = "access_sandboxes"


# The key of each action's object in an entry (None: the action has no object).
OBJECT_KEY: Mapping[Action, str | None] = {
    Action.REGISTER_FRAMEWORKS: "roles",
    Action.REGISTER_AGENTS: None,
    Action.RUN_TASKS: "users",
    Action.TEARDOWN_FRAMEWORKS: "framework_principals",
    Action.KILL_TASKS: "framework_principals",
    Action.VIEW_STATE: None,
    Action.ACCESS_SANDBOXES: "framework_principals",
}


@dataclass(frozen=True, slots=True)
class Entity:
    """A set of principals, roles, ...: some values, any, or none."""

    values: frozenset[str] = frozenset()
    any: bool = False
    none: bool = False

    def matches(self, name: str | None, *, roles: bool = False) -> bool:
        if self.any:
            return True
        if self.none or name is None:
            return False
        if name in self.values:
            return True
        return roles and any(v.endswith("/*") and name.startswith(v[:-1]) for v in self.values)


ANY = Entity(any=True)
ROOT = "root"  # the one user `run_tasks` must name: ANY does not cover it


@dataclass(frozen=True, slots=True)
class Entry:
    principals: Entity
    objects: Entity = ANY


@dataclass(frozen=True, slots=True)
class Acls:
    entries: Mapping[Action, tuple[Entry, ...]]
    permissive: bool = False

    def allows(self, action: Action, principal: str | None, obj: str | None = None) -> bool:
        roles = action is Action.REGISTER_FRAMEWORKS
        named_only = action is Action.RUN_TASKS and obj == ROOT
        for entry in self.entries.get(action, ()):
            if not entry.principals.matches(principal):
                continue
            if entry.objects.none:
                return False
            if named_only:
                if obj in entry.objects.values:
                    return True
            elif entry.objects.matches(obj, roles=roles):
                return True
        return self.permissive and not named_only


def may_run_tasks_as(acls: Acls | None, principal: str | None, user: str) -> bool:
    """Whether a framework of `principal` may name `user` as its tasks' user.

    No user (""): the agents' `--task-user`, always allowed. Without ACLs (`acls` None)
    every user is allowed but root, which only an ACL entry naming it allows."""
    if not user:
        return True
    if acls is None:
        return user != ROOT
    return acls.allows(Action.RUN_TASKS, principal, user)


def load_acls(path: Path) -> Acls:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise AclError(f"cannot read ACL file {path}: {e.strerror}") from e
    if len(data) > MAX_FILE_BYTES:
        raise AclError(f"ACL file {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        parsed = json.loads(data)
    except ValueError as e:
        raise AclError(f"ACL file {path} is not JSON: {e}") from e
    try:
        return parse_acls(parsed)
    except AclError as e:
        raise AclError(f"ACL file {path}: {e}") from e


def parse_acls(data: object) -> Acls:
    if not isinstance(data, dict):
        raise AclError("the top level must be an object")
    known = {a.value for a in Action} | {"permissive"}
    if unknown := sorted(set(data) - known):
        raise AclError(f"unknown keys {unknown}; known: {sorted(known)}")
    permissive = data.get("permissive", False)
    if not isinstance(permissive, bool):
        raise AclError("'permissive' must be true or false")
    entries: dict[Action, tuple[Entry, ...]] = {}
    for action in Action:
        raw = data.get(action.value, [])
        if not isinstance(raw, list):
            raise AclError(f"{action.value!r} must be a list of entries")
        entries[action] = tuple(
            _entry(action, item, f"{action.value}[{i}]") for i, item in enumerate(raw)
        )
    return Acls(entries, permissive)


def _entry(action: Action, item: object, where: str) -> Entry:
    if not isinstance(item, dict):
        raise AclError(f"{where} must be an object")
    object_key = OBJECT_KEY[action]
    allowed = {"principals"} | ({object_key} if object_key else set())
    if unknown := sorted(set(item) - allowed):
        raise AclError(f"{where} has unknown keys {unknown}; allowed: {sorted(allowed)}")
    if "principals" not in item:
        raise AclError(f"{where} needs 'principals'")
    principals = _entity(item["principals"], f"{where}.principals")
    objects = _entity(item[object_key], f"{where}.{object_key}") if object_key in item else ANY
    return Entry(principals, objects)


def _entity(raw: object, where: str) -> Entity:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise AclError(f'{where} must be {{"values": [...]}} or {{"type": "ANY" | "NONE"}}')
    if "type" in raw:
        if raw["type"] == "ANY":
            return ANY
        if raw["type"] == "NONE":
            return Entity(none=True)
        raise AclError(f"{where}.type must be ANY or NONE")
    values = raw.get("values")
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise AclError(f"{where}.values must be a list of non-empty strings")
    if len(values) > MAX_VALUES:
        raise AclError(f"{where}.values has more than {MAX_VALUES} entries")
    return Entity(frozenset(values))
