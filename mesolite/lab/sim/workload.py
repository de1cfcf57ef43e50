"""A simulated cluster and workload, from a TOML file, parsed and checked in one place.

    [cluster]
    agents = [{ count = 100, resources = "cpus:8;mem:16384" }]

    [simulation]             # all optional
    allocation_interval = 1.0   # seconds between allocation cycles (the master's)
    refuse_seconds = 5.0        # a job declining an offer that fits none of its tasks
    sample_interval = 10.0      # how often utilization and shares are sampled
    end = 3600.0                # stop here (default: when every job has finished)
    roles_file = "roles.toml"   # the master's roles file, relative to this file
    preemption = true           # the master's preemption (master/preemptions.py)
    preemption_grace = 5.0
    demand = false              # jobs declare their pending tasks (Call.Demand)
    packing = false             # the master's --packing (with demand: best-fit placement)
    reservations = true         # with packing: agents reserved for large shapes (not
                                # --no-reservations; master/reservations.py)

    [[jobs]]
    name = "j1"
    arrival = 0.0            # seconds from the start
    role = "batch"           # default: a role of the job's own, "job/<name>"
    tasks = [{ resources = "cpus:1;mem:2048", count = 10, duration = 30.0 }]
    # spread = 4.0 (optional): the group's tasks last `duration` to `duration + spread`,
    # spread evenly in launch order (`TaskGroup.duration_of`), so they do not all end at once

A job is one framework: it subscribes at `arrival`, launches its tasks as offers
fit them (each group in order), and is torn down when its last task has ended.
A `duration` of `inf` never ends (services, notebooks). Every size is bounded
(the `MAX_*` below); a problem is reported as `FILE:LINE: what`. Pure:
`parse_workload(text, source)` returns a frozen `SimWorkload` or raises
`SimWorkloadError`; `dump_workload` writes one back.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from mesolite.master.role_config import is_valid_role
from mesolite.resources import Resources
from mesolite.toml_files import KeyLines, TomlFileError, is_finite_number, read_toml

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_AGENTS = 10_000
MAX_JOBS = 100_000
MAX_GROUPS = 64  # task groups per job
MAX_TASKS = 2_000_000  # in all
MAX_SECONDS = 1e9
MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

_TOP_KEYS = ("cluster", "simulation", "jobs")
_SIM_KEYS = (
    "allocation_interval",
    "refuse_seconds",
    "sample_interval",
    "end",
    "roles_file",
    "preemption",
    "preemption_grace",
    "demand",
    "packing",
    "reservations",
)
_JOB_KEYS = ("name", "arrival", "role", "tasks")
_GROUP_KEYS = ("resources", "count", "duration", "spread")
_GOLDEN = (math.sqrt(5) - 1) / 2  # spreads a group's durations evenly, in any prefix


class SimWorkloadError(TomlFileError):
    """A simulation workload file that cannot be used; nothing was run."""


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """`count` tasks of one shape and length (`inf`: never ends), or of lengths
    `duration` to `duration + spread`."""

    resources: Resources
    count: int
    duration: float
    spread: float = 0.0

    def duration_of(self, index: int) -> float:
        """How long the group's `index`-th task launched lasts (0 is the first)."""
        return self.duration + self.spread * (index * _GOLDEN % 1.0)


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    arrival: float
    role: str
    groups: tuple[TaskGroup, ...]

    @property
    def tasks(self) -> int:
        return sum(g.count for g in self.groups)


@dataclass(frozen=True, slots=True)
class AgentGroup:
    count: int
    resources: Resources


@dataclass(frozen=True, slots=True)
class SimulationSettings:
    allocation_interval: float = 1.0
    refuse_seconds: float = 5.0
    sample_interval: float = 10.0
    end: float | None = None
    roles_file: Path | None = None
    preemption: bool = True  # the master's default (master/preemptions.py)
    preemption_grace: float = 5.0
    demand: bool = False  # jobs declare what they wait for (master/demand.py)
    packing: bool = False  # the master's --packing (master/allocator.py)
    reservations: bool = True  # with packing (master/reservations.py)


@dataclass(frozen=True, slots=True)
class SimWorkload:
    agents: tuple[AgentGroup, ...]
    jobs: tuple[Job, ...]
    settings: SimulationSettings = SimulationSettings()

    @property
    def total(self) -> Resources:
        total = Resources()
        for group in self.agents:
            for _ in range(group.count):
                total = total + group.resources
        return total


def default_role(job_name: str) -> str:
    return f"job/{job_name}"


def load_workload(path: Path) -> SimWorkload:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise SimWorkloadError(str(path), None, f"larger than {MAX_FILE_BYTES} bytes")
    return parse_workload(path.read_text(), str(path), base=path.parent)


def parse_workload(text: str, source: str = "<workload>", base: Path | None = None) -> SimWorkload:
    if len(text) > MAX_FILE_BYTES:
        raise SimWorkloadError(source, None, f"larger than {MAX_FILE_BYTES} bytes")
    return _Parser(text, source, base).parse(read_toml(text, source, SimWorkloadError))


def dump_workload(workload: SimWorkload) -> str:
    """The workload as a file `parse_workload` reads back to the same value."""
    lines = ["[cluster]", "agents = ["]
    lines += [
        f'  {{ count = {g.count}, resources = "{_res(g.resources)}" }},' for g in workload.agents
    ]
    lines += ["]", "", "[simulation]"]
    s = workload.settings
    lines += [
        f"allocation_interval = {s.allocation_interval!r}",
        f"refuse_seconds = {s.refuse_seconds!r}",
        f"sample_interval = {s.sample_interval!r}",
    ]
    if s.end is not None:
        lines.append(f"end = {s.end!r}")
    if s.roles_file is not None:
        lines.append(f'roles_file = "{s.roles_file}"')
    lines.append(f"preemption = {'true' if s.preemption else 'false'}")
    lines.append(f"preemption_grace = {s.preemption_grace!r}")
    lines.append(f"demand = {'true' if s.demand else 'false'}")
    lines.append(f"packing = {'true' if s.packing else 'false'}")
    lines.append(f"reservations = {'true' if s.reservations else 'false'}")
    for job in workload.jobs:
        groups = ", ".join(
            f'{{ resources = "{_res(g.resources)}", count = {g.count}, '
            f"duration = {_number(g.duration)}"
            + (f", spread = {g.spread!r}" if g.spread else "")
            + " }"
            for g in job.groups
        )
        lines += [
            "",
            "[[jobs]]",
            f'name = "{job.name}"',
            f"arrival = {job.arrival!r}",
            f'role = "{job.role}"',
            f"tasks = [{groups}]",
        ]
    return "\n".join(lines) + "\n"


def _res(resources: Resources) -> str:
    return ";".join(f"{name}:{resources.get_amount(name):g}" for name in sorted(resources))


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else repr(value)


class _Parser:
    def __init__(self, text: str, source: str, base: Path | None) -> None:
        self.source = source
        self.lines = KeyLines(text)
        self.base = base

    def fail(self, keys: tuple[str, ...], problem: str) -> NoReturn:
        raise SimWorkloadError(self.source, self.lines.find(keys), problem)

    def parse(self, data: dict[str, Any]) -> SimWorkload:
        for key in data:
            if key not in _TOP_KEYS:
                self.fail((key,), f"unknown key {key!r}; known: {', '.join(_TOP_KEYS)}")
        cluster = data.get("cluster")
        if not isinstance(cluster, dict) or "agents" not in cluster:
            raise SimWorkloadError(
                self.source,
                None,
                'expected [cluster] with agents = [{ count = N, resources = "..." }]',
            )
        agents = self.agents(cluster)
        settings = self.settings(data.get("simulation", {}))
        raw_jobs = data.get("jobs", [])
        if not isinstance(raw_jobs, list) or not raw_jobs:
            raise SimWorkloadError(self.source, None, "expected at least one [[jobs]] table")
        if len(raw_jobs) > MAX_JOBS:
            self.fail(("jobs",), f"more than {MAX_JOBS} jobs")
        jobs: list[Job] = []
        names: set[str] = set()
        tasks = 0
        for body in raw_jobs:
            job = self.job(body)
            if job.name in names:
                self.fail(("jobs", "name"), f"job name {job.name!r} repeats")
            names.add(job.name)
            tasks += job.tasks
            if tasks > MAX_TASKS:
                self.fail(("jobs",), f"more than {MAX_TASKS} tasks in all")
            jobs.append(job)
        jobs.sort(key=lambda j: j.arrival)  # stable: ties keep the file's order
        return SimWorkload(agents, tuple(jobs), settings)

    def agents(self, cluster: dict[str, Any]) -> tuple[AgentGroup, ...]:
        for key in cluster:
            if key != "agents":
                self.fail(("cluster", key), f"unknown key {key!r} in [cluster]; known: agents")
        raw = cluster["agents"]
        if not isinstance(raw, list) or not raw:
            self.fail(("cluster", "agents"), "agents must be a list of { count, resources }")
        groups = []
        count = 0
        for item in raw:
            if not isinstance(item, dict) or set(item) - {"count", "resources"}:
                self.fail(
                    ("cluster", "agents"), 'each agents entry is { count = N, resources = "..." }'
                )
            n = self.whole(("cluster", "agents"), "count", item.get("count", 1), 1, MAX_AGENTS)
            count += n
            if count > MAX_AGENTS:
                self.fail(("cluster", "agents"), f"more than {MAX_AGENTS} agents")
            groups.append(
                AgentGroup(n, self.resources(("cluster", "agents"), item.get("resources")))
            )
        return tuple(groups)

    def settings(self, table: object) -> SimulationSettings:
        at = ("simulation",)
        if not isinstance(table, dict):
            self.fail(at, "[simulation] must be a table")
        for key in table:
            if key not in _SIM_KEYS:
                self.fail(
                    (*at, key),
                    f"unknown key {key!r} in [simulation]; known: {', '.join(_SIM_KEYS)}",
                )
        d = SimulationSettings()
        end = table.get("end")
        roles = table.get("roles_file")
        if roles is not None and (not isinstance(roles, str) or not roles):
            self.fail((*at, "roles_file"), "roles_file must be a path")
        return SimulationSettings(
            allocation_interval=self.seconds(
                at,
                "allocation_interval",
                table.get("allocation_interval", d.allocation_interval),
                0.001,
            ),
            refuse_seconds=self.seconds(
                at, "refuse_seconds", table.get("refuse_seconds", d.refuse_seconds), 0.0
            ),
            sample_interval=self.seconds(
                at, "sample_interval", table.get("sample_interval", d.sample_interval), 0.001
            ),
            end=None if end is None else self.seconds(at, "end", end, 0.0),
            roles_file=None if roles is None else (self.base or Path()) / roles,
            preemption=self.flag(at, "preemption", table.get("preemption", d.preemption)),
            preemption_grace=self.seconds(
                at, "preemption_grace", table.get("preemption_grace", d.preemption_grace), 0.0
            ),
            demand=self.flag(at, "demand", table.get("demand", d.demand)),
            packing=self.flag(at, "packing", table.get("packing", d.packing)),
            reservations=self.flag(at, "reservations", table.get("reservations", d.reservations)),
        )

    def flag(self, at: tuple[str, ...], key: str, value: object) -> bool:
        if not isinstance(value, bool):
            self.fail((*at, key), f"{key} must be true or false, got {value!r:.80}")
        return value

    def job(self, body: object) -> Job:
        at = ("jobs",)
        if not isinstance(body, dict):
            self.fail(at, "each [[jobs]] entry must be a table")
        for key in body:
            if key not in _JOB_KEYS:
                self.fail(
                    (*at, key), f"unknown key {key!r} in [[jobs]]; known: {', '.join(_JOB_KEYS)}"
                )
        name = body.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
            self.fail(
                (*at, "name"),
                f"job name must be 1-{MAX_NAME} letters, digits, '_', '.', '-'; got {name!r:.80}",
            )
        role = body.get("role", default_role(name))
        if not isinstance(role, str) or len(role) > 256 or not is_valid_role(role):
            self.fail((*at, "role"), f"job {name}: invalid role {role!r:.80}")
        arrival = self.seconds(at, "arrival", body.get("arrival", 0.0), 0.0)
        raw = body.get("tasks")
        if not isinstance(raw, list) or not raw or len(raw) > MAX_GROUPS:
            self.fail(
                (*at, "tasks"), f"job {name}: tasks must be a list of 1 to {MAX_GROUPS} groups"
            )
        groups = []
        for g in raw:
            if not isinstance(g, dict) or set(g) - set(_GROUP_KEYS) or "resources" not in g:
                self.fail(
                    (*at, "tasks"),
                    f"job {name}: each group is {{ resources, count, duration[, spread] }}",
                )
            groups.append(
                TaskGroup(
                    self.resources((*at, "tasks"), g["resources"]),
                    self.whole((*at, "tasks"), "count", g.get("count", 1), 1, MAX_TASKS),
                    self.seconds(
                        (*at, "tasks"), "duration", g.get("duration", math.inf), 0.0, infinite=True
                    ),
                    self.seconds((*at, "tasks"), "spread", g.get("spread", 0.0), 0.0),
                )
            )
        return Job(name, arrival, role, tuple(groups))

    def resources(self, at: tuple[str, ...], text: object) -> Resources:
        if not isinstance(text, str) or len(text) > 1024:
            self.fail(at, f'resources must be a string like "cpus:1;mem:2048", got {text!r:.80}')
        try:
            resources = Resources.parse(text)
        except ValueError as e:
            self.fail(at, f"resources {text!r}: {e}")
        if resources.is_empty():
            self.fail(at, f"resources {text!r} are empty")
        return resources

    def whole(self, at: tuple[str, ...], key: str, value: object, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(at, f"{key} must be a whole number from {low} to {high}, got {value!r:.80}")
        return value

    def seconds(
        self, at: tuple[str, ...], key: str, value: object, low: float, infinite: bool = False
    ) -> float:
        if infinite and isinstance(value, float) and value == math.inf:
            return value
        if not is_finite_number(value) or not low <= value <= MAX_SECONDS:
            more = " (or inf)" if infinite else ""
            self.fail(
                (*at, key),
                f"{key} must be a number from {low:g} to {MAX_SECONDS:g}{more}, got {value!r:.80}",
            )
        return float(value)
