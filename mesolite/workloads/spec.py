"""The workload file: one job or one service, in TOML, parsed and checked in one place.

A **job** runs a command once per index, `completions` indices (0 to completions - 1),
at most `parallelism` at a time, retrying each failed index up to `retries` times
(Kubernetes' Indexed Job with `backoffLimitPerIndex`)::

    [job]
    name = "sweep"
    command = "python3 sweep.py --point $MESOLITE_JOB_INDEX"
    resources = { cpus = 0.5, mem = 256 }
    completions = 20
    parallelism = 6
    retries = 2              # per index
    role = "batch"           # default "*"
    env = { MODE = "fast" }  # optional

A **service** keeps `instances` copies of a command running, replacing any that ends,
after a back-off that grows with each end in a row (Marathon's `backoffSeconds`,
`backoffFactor`, `maxLaunchDelaySeconds`)::

    [service]
    name = "web"
    command = "exec ./server"
    resources = { cpus = 0.1, mem = 64 }
    instances = 3
    restart = { policy = "always", backoff = 1.0, factor = 2.0, max_backoff = 60.0 }

`restart.policy` is `always` (replace an instance whatever its end) or `on-failure`
(an instance that exits 0 is done and not replaced). Each task gets, besides `env` and
mesolite's own variables (MESOLITE_TASK_ID, MESOLITE_SANDBOX, ...):
MESOLITE_WORKLOAD (the name), and MESOLITE_JOB_INDEX, MESOLITE_JOB_ATTEMPT (0 for the
first try of an index, 1 for its first retry, ...) and MESOLITE_JOB_COMPLETIONS for a
job, MESOLITE_SERVICE_INSTANCE (0 to instances - 1) for a service.

Every size is bounded (the `MAX_*` below); a problem is reported as `FILE:LINE: what`.
Pure: `parse_workload(text, source)` returns a frozen spec or raises
`WorkloadFileError`, changing nothing.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from mesolite.master.role_config import is_valid_role
from mesolite.model import DEFAULT_ROLE
from mesolite.resources import Resources
from mesolite.toml_files import KeyLines, TomlFileError, is_finite_number, read_toml

__all__ = [
    "MAX_FILE_BYTES",
    "JobSpec",
    "Restart",
    "RestartPolicy",
    "ServiceSpec",
    "WorkloadFileError",
    "WorkloadKind",
    "WorkloadSpec",
    "load_workload",
    "parse_workload",
]

MAX_FILE_BYTES = 64 * 1024
MAX_NAME = 63
MAX_COMMAND = 32 * 1024
MAX_ROLE = 256
MAX_COMPLETIONS = 10_000
MAX_PARALLELISM = 1_000
MAX_RETRIES = 100
MAX_INSTANCES = 1_000
MAX_RESOURCE_NAMES = 16
MIN_AMOUNT = 0.001  # Resources keep whole thousandths
MAX_AMOUNT = 1e9
MAX_ENV = 64
MAX_ENV_NAME = 128
MAX_ENV_VALUE = 4096
MAX_BACKOFF = 3600.0
MAX_FACTOR = 10.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV_PREFIX = "MESOLITE_"  # set by mesolite itself

_JOB_KEYS = ("name", "command", "resources", "completions", "parallelism", "retries", "role", "env")
_SERVICE_KEYS = ("name", "command", "resources", "instances", "restart", "role", "env")
_RESTART_KEYS = ("policy", "backoff", "factor", "max_backoff")


class WorkloadKind(enum.StrEnum):
    JOB = "job"
    SERVICE = "service"


class RestartPolicy(enum.StrEnum):
    ALWAYS = "always"  # replace an instance however it ended
    ON_FAILURE = "on-failure"  # an instance that exits 0 is done


class WorkloadFileError(TomlFileError):
    """An invalid workload file; the message reads `SOURCE:LINE: problem`."""


def _no_env() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Restart:
    """When and how soon a service replaces an instance that ended."""

    policy: RestartPolicy = RestartPolicy.ALWAYS
    backoff: float = 1.0  # seconds before the first replacement in a row
    factor: float = 2.0  # each further replacement in a row waits this much longer
    max_backoff: float = 60.0  # the longest wait; an instance that ran this long resets it

    def delay(self, streak: int) -> float:
        """The wait before the replacement that follows `streak` earlier ends in a row."""
        if self.backoff == 0:
            return 0.0
        # Capped before it can overflow: factor <= 10, so 64 doublings pass any bound.
        return min(self.backoff * self.factor ** min(streak, 64), self.max_backoff)


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    command: str
    resources: Resources
    completions: int = 1
    parallelism: int = 1
    retries: int = 0  # per index: a failed index runs again up to this many times
    role: str = DEFAULT_ROLE
    env: Mapping[str, str] = field(default_factory=_no_env)

    @property
    def kind(self) -> WorkloadKind:
        return WorkloadKind.JOB


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    command: str
    resources: Resources
    instances: int = 1
    restart: Restart = Restart()
    role: str = DEFAULT_ROLE
    env: Mapping[str, str] = field(default_factory=_no_env)

    @property
    def kind(self) -> WorkloadKind:
        return WorkloadKind.SERVICE


WorkloadSpec = JobSpec | ServiceSpec


def load_workload(path: Path) -> WorkloadSpec:
    """Read and parse a workload file; any problem, an unreadable file included, raises."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise WorkloadFileError(str(path), None, f"cannot read it: {e.strerror}") from None
    return parse_workload(data, source=str(path))


def parse_workload(text: str | bytes, source: str = "<workload>") -> WorkloadSpec:
    """Parse a workload file's text; raises `WorkloadFileError` naming `source` and the line."""
    if len(text) > MAX_FILE_BYTES:
        raise WorkloadFileError(source, None, f"larger than {MAX_FILE_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WorkloadFileError(source, None, f"not UTF-8 text: {e}") from None
    return _Parser(text, source).parse(read_toml(text, source, WorkloadFileError))


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines = KeyLines(text)

    def fail(self, keys: tuple[str, ...], problem: str) -> NoReturn:
        raise WorkloadFileError(self.source, self.lines.find(keys), problem)

    def parse(self, data: dict[str, Any]) -> WorkloadSpec:
        kinds = [k for k in data if k in ("job", "service")]
        for key in data:
            if key not in ("job", "service"):
                self.fail((key,), f"unknown key {key!r}: a file holds one [job] or one [service]")
        if len(kinds) != 1:
            if kinds:
                self.fail((kinds[1],), "a file holds one [job] or one [service], not both")
            raise WorkloadFileError(self.source, None, "expected a [job] or a [service] table")
        kind = WorkloadKind(kinds[0])
        body = data[kind]
        if not isinstance(body, dict):
            self.fail((kind,), f"{kind} must be a table: [{kind}]")
        allowed = _JOB_KEYS if kind is WorkloadKind.JOB else _SERVICE_KEYS
        for key in body:
            if key not in allowed:
                self.fail(
                    (kind, key), f"unknown key {key!r} in [{kind}]; known: {', '.join(allowed)}"
                )
        for key in ("name", "command", "resources"):
            if key not in body:
                self.fail((kind,), f"[{kind}] needs {key!r}")
        name = self.name(kind, body["name"])
        command = self.command(kind, body["command"])
        resources = self.resources(kind, body["resources"])
        role = self.role(kind, body.get("role", DEFAULT_ROLE))
        env = self.env(kind, body.get("env", {}))
        if kind is WorkloadKind.JOB:
            return JobSpec(
                name,
                command,
                resources,
                completions=self.count(kind, body, "completions", 1, 1, MAX_COMPLETIONS),
                parallelism=self.count(kind, body, "parallelism", 1, 1, MAX_PARALLELISM),
                retries=self.count(kind, body, "retries", 0, 0, MAX_RETRIES),
                role=role,
                env=env,
            )
        return ServiceSpec(
            name,
            command,
            resources,
            instances=self.count(kind, body, "instances", 1, 1, MAX_INSTANCES),
            restart=self.restart(body.get("restart", {})),
            role=role,
            env=env,
        )

    def name(self, kind: str, value: object) -> str:
        if not isinstance(value, str) or not _NAME.fullmatch(value) or len(value) > MAX_NAME:
            self.fail(
                (kind, "name"),
                f"name must be 1-{MAX_NAME} letters, digits, '_' and '-', starting with a "
                f"letter or digit; got {_shown(value)}",
            )
        return value

    def command(self, kind: str, value: object) -> str:
        at = (kind, "command")
        if not isinstance(value, str) or not value.strip():
            self.fail(at, f"command must be a non-empty string, got {_shown(value)}")
        if len(value.encode()) > MAX_COMMAND:
            self.fail(at, f"command is longer than {MAX_COMMAND} bytes")
        if "\0" in value:
            self.fail(at, "command holds a NUL character")
        return value

    def role(self, kind: str, value: object) -> str:
        if not isinstance(value, str) or len(value) > MAX_ROLE or not is_valid_role(value):
            self.fail(
                (kind, "role"),
                f"invalid role {_shown(value)}: expected '*' or segments of letters, digits,"
                " '_', '.', '-' joined by '/'",
            )
        return value

    def resources(self, kind: str, table: object) -> Resources:
        at = (kind, "resources")
        if not isinstance(table, dict) or not table:
            self.fail(at, "resources must be a table like { cpus = 0.5, mem = 256 }")
        if len(table) > MAX_RESOURCE_NAMES:
            self.fail(at, f"more than {MAX_RESOURCE_NAMES} resources")
        amounts: dict[str, float] = {}
        for name, value in table.items():
            if not _RESOURCE_NAME.fullmatch(name) or len(name) > 64:
                self.fail((*at, name), f"invalid resource name {name!r}")
            if not is_finite_number(value) or not MIN_AMOUNT <= value <= MAX_AMOUNT:
                self.fail(
                    (*at, name),
                    f"resources {name} = {_shown(value)}: must be a number from {MIN_AMOUNT:g} to "
                    f"{MAX_AMOUNT:g}",
                )
            amounts[name] = float(value)
        return Resources(amounts)

    def env(self, kind: str, table: object) -> Mapping[str, str]:
        at = (kind, "env")
        if not isinstance(table, dict):
            self.fail(at, 'env must be a table like { NAME = "value" }')
        if len(table) > MAX_ENV:
            self.fail(at, f"more than {MAX_ENV} environment variables")
        for name, value in table.items():
            if not _ENV_NAME.fullmatch(name) or len(name) > MAX_ENV_NAME:
                self.fail((*at, name), f"invalid environment variable name {name!r}")
            if name.startswith(RESERVED_ENV_PREFIX):
                self.fail(
                    (*at, name), f"{name}: names starting {RESERVED_ENV_PREFIX} are mesolite's"
                )
            if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\0" in value:
                self.fail(
                    (*at, name),
                    f"env {name} must be a string of at most {MAX_ENV_VALUE} characters "
                    f"without NUL, got {_shown(value)}",
                )
        return MappingProxyType(dict(table))

    def count(
        self, kind: str, body: dict[str, Any], key: str, default: int, low: int, high: int
    ) -> int:
        value = body.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(
                (kind, key),
                f"{key} must be a whole number from {low} to {high}, got {_shown(value)}",
            )
        return value

    def restart(self, table: object) -> Restart:
        at = ("service", "restart")
        if not isinstance(table, dict):
            self.fail(at, 'restart must be a table like { policy = "always", backoff = 1 }')
        for key in table:
            if key not in _RESTART_KEYS:
                self.fail(
                    (*at, key), f"unknown key {key!r} in restart; known: {', '.join(_RESTART_KEYS)}"
                )
        policy = table.get("policy", RestartPolicy.ALWAYS.value)
        if policy not in {p.value for p in RestartPolicy}:
            self.fail(
                (*at, "policy"),
                f"restart policy must be 'always' or 'on-failure', got {_shown(policy)}",
            )
        defaults = Restart()
        backoff = self.seconds(table, "backoff", defaults.backoff, 0, MAX_BACKOFF)
        factor = self.seconds(table, "factor", defaults.factor, 1, MAX_FACTOR)
        ceiling = self.seconds(
            table, "max_backoff", max(defaults.max_backoff, backoff), 0, MAX_BACKOFF
        )
        if ceiling < backoff:
            self.fail((*at, "max_backoff"), f"max_backoff {ceiling:g} is below backoff {backoff:g}")
        return Restart(RestartPolicy(policy), backoff, factor, ceiling)

    def seconds(
        self, table: dict[str, Any], key: str, default: float, low: float, high: float
    ) -> float:
        value = table.get(key, default)
        if not is_finite_number(value) or not low <= value <= high:
            self.fail(
                ("service", "restart", key),
                f"restart {key} must be a number from {low:g} to {high:g}, got {_shown(value)}",
            )
        return float(value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
