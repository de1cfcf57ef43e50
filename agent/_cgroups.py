"""Control groups for tasks: which hierarchies the agent can use, one cgroup per task
run with its limits, its figures, and removing it. No asyncio: every call is a few
small file reads or writes, run off the loop by the caller.

Where the cgroups live: ``<hierarchy>/<root>/<scope>/<name>``, where `root` is
the operator's (``--cgroups-root``, default ``mesolite``, like Mesos'
``--cgroups_root``), `scope` names one agent (its work dir, hashed: several
agents on one machine, as in tests, never touch each other's cgroups) and
`name` is the task run's id. A cgroup is named by a `Cgroup`: which
controller's files are in which directory (v2: one directory for all; v1: one
per hierarchy, e.g. ``memory/mesolite/agent-.../<run>`` and
``cpu/mesolite/...``). Its directories are checkpointed with the task, so a
restarted agent finds them whatever it was started with.

Version 2 is used where a cgroup2 mount offers the ``memory``, ``cpu`` and
``pids`` controllers; version 1 where ``memory``, ``cpu`` and ``pids`` are
mounted as v1 hierarchies (``cpuacct`` and ``freezer`` are used when present:
CPU time, and a freeze while killing). Either way the agent must be able to
create its scope directory, which it tries at start (`CgroupSystem.open`).

Limits, as Mesos' cgroups isolators set them:

* memory: the task's ``mem`` (at least `MIN_MEMORY_MB`) as ``memory.max`` /
  ``memory.limit_in_bytes``; above it the kernel reclaims, then OOM-kills a
  process in the cgroup and counts it (``oom_kill``);
* CPU: ``cpu.shares`` = 1024 per CPU (v2: the same as ``cpu.weight``), so
  under contention tasks get CPU time in proportion to their ``cpus``; with a
  hard limit, a CFS quota of ``cpus`` CPU periods per period as well
  (``cpu.max`` / ``cpu.cfs_quota_us``), so a task never gets more even on an
  idle machine;
* processes and threads: ``pids.max``; a fork beyond it fails with EAGAIN and
  is counted (``pids.events``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mesolite.agent._task_wrapper import cgroup_pids, kill_cgroup
from mesolite.agent.errors import AgentError

REQUIRED = ("memory", "cpu", "pids")
OPTIONAL = ("cpuacct", "freezer")  # v1 only: v2 has CPU time in cpu.stat and a freezer built in
MIN_MEMORY_MB = 32.0  # Mesos' MIN_MEMORY: below it hardly a shell starts
MIN_CPUS = 0.01  # Mesos' MIN_CPUS
CPU_SHARES_PER_CPU = 1024
MIN_CPU_SHARES = 2
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000
_MB = 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CgroupError(AgentError):
    """The agent cannot use cgroups here, or could not set one up; the message says why."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one task run is held to."""

    mem_mb: float
    cpus: float
    hard_cpu: bool
    pids: int | None  # None: no limit

    @classmethod
    def for_resources(
        cls, resources: Mapping[str, float], *, hard_cpu: bool, pids: int | None
    ) -> Limits:
        return cls(
            mem_mb=max(float(resources.get("mem", 0.0)), MIN_MEMORY_MB),
            cpus=max(float(resources.get("cpus", 0.0)), MIN_CPUS),
            hard_cpu=hard_cpu,
            pids=pids,
        )

    @property
    def mem_bytes(self) -> int:
        return int(self.mem_mb * _MB)

    @property
    def cpu_shares(self) -> int:
        return max(MIN_CPU_SHARES, int(self.cpus * CPU_SHARES_PER_CPU))

    @property
    def cpu_weight(self) -> int:
        """v2's weight (1 to 10000) for the shares, as the kernel and systemd convert."""
        return 1 + ((self.cpu_shares - 2) * 9999) // 262142

    @property
    def cfs_quota_us(self) -> int:
        return max(MIN_CFS_QUOTA_US, int(self.cpus * CFS_PERIOD_US))


@dataclass(frozen=True, slots=True)
class CgroupStats:
    """A cgroup's figures at one moment; None where this kernel does not say."""

    mem_bytes: int | None  # charged now (what the limit counts)
    mem_peak_bytes: int | None  # the most ever charged
    mem_limit_bytes: int | None
    oom_kills: int  # processes the kernel's OOM killer ended in it
    cpu_seconds: float | None  # CPU time used, all processes, ever
    throttled_seconds: float | None  # time held back by the CPU quota
    processes: int | None  # pids.current: processes and threads
    pids_limit_hits: int  # forks refused by pids.max


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One task run's cgroup: the directory holding each controller's files."""

    version: int
    dirs: Mapping[str, Path]  # controller -> directory (v2: all the same)

    @property
    def paths(self) -> list[Path]:
        """Its distinct directories, in a stable order."""
        return sorted(set(self.dirs.values()))

    def record(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": {c: str(d) for c, d in self.dirs.items()}}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Cgroup:
        """Read back `record()`; raises KeyError, TypeError or ValueError."""
        version, dirs = record["version"], record["dirs"]
        if version not in (1, 2) or not isinstance(dirs, dict):
            raise ValueError(f"not a cgroup record: {record!r}")
        return cls(version, {str(c): Path(str(d)) for c, d in dirs.items()})

    def exists(self) -> bool:
        return any(p.is_dir() for p in self.paths)

    def pids(self) -> set[int]:
        return cgroup_pids(self.paths)

    def kill(self) -> bool:
        """SIGKILL everything in it until it is empty; False if it would not empty."""
        return kill_cgroup(self.paths)

    def remove(self) -> None:
        """Remove its directories; it must be empty (`kill` first). Gone already is fine."""
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()

    def stats(self) -> CgroupStats:
        if self.version == 2:
            return self._stats_v2()
        return self._stats_v1()

    def limits_hit(self) -> CgroupStats:
        """What `stats` says of the limits the run ran into (OOM kills, and then the
        peak; forks refused), and nothing else: its end needs no more (three reads at
        most, not eight)."""
        memory, pids = self.dirs.get("memory"), self.dirs.get("pids")
        if self.version == 2:
            oom = _keyed(memory / "memory.events").get("oom_kill", 0) if memory else 0
            peak = _int(memory / "memory.peak") if memory and oom else None
        else:
            oom = _keyed(memory / "memory.oom_control").get("oom_kill", 0) if memory else 0
            peak = _int(memory / "memory.max_usage_in_bytes") if memory and oom else None
        return CgroupStats(
            mem_bytes=None,
            mem_peak_bytes=peak,
            mem_limit_bytes=None,
            oom_kills=oom,
            cpu_seconds=None,
            throttled_seconds=None,
            processes=None,
            pids_limit_hits=_keyed(pids / "pids.events").get("max", 0) if pids else 0,
        )

    def _stats_v1(self) -> CgroupStats:
        memory, cpu = self.dirs.get("memory"), self.dirs.get("cpu")
        cpuacct, pids = self.dirs.get("cpuacct"), self.dirs.get("pids")
        oom = _keyed(memory / "memory.oom_control") if memory else {}
        usage = _int(cpuacct / "cpuacct.usage") if cpuacct else None
        throttled = _keyed(cpu / "cpu.stat").get("throttled_time") if cpu else None
        return CgroupStats(
            mem_bytes=_int(memory / "memory.usage_in_bytes") if memory else None,
            mem_peak_bytes=_int(memory / "memory.max_usage_in_bytes") if memory else None,
            mem_limit_bytes=_int(memory / "memory.limit_in_bytes") if memory else None,
            oom_kills=oom.get("oom_kill", 0),
            cpu_seconds=usage / 1e9 if usage is not None else None,
            throttled_seconds=throttled / 1e9 if throttled is not None else None,
            processes=_int(pids / "pids.current") if pids else None,
            pids_limit_hits=_keyed(pids / "pids.events").get("max", 0) if pids else 0,
        )

    def _stats_v2(self) -> CgroupStats:
        d = self.dirs["memory"]
        cpu = _keyed(d / "cpu.stat")
        usage, throttled = cpu.get("usage_usec"), cpu.get("throttled_usec")
        return CgroupStats(
            mem_bytes=_int(d / "memory.current"),
            mem_peak_bytes=_int(d / "memory.peak"),  # Linux 5.19+
            mem_limit_bytes=_int(d / "memory.max"),
            oom_kills=_keyed(d / "memory.events").get("oom_kill", 0),
            cpu_seconds=usage / 1e6 if usage is not None else None,
            throttled_seconds=throttled / 1e6 if throttled is not None else None,
            processes=_int(d / "pids.current"),
            pids_limit_hits=_keyed(d / "pids.events").get("max", 0),
        )


class CgroupSystem:
    """The hierarchies one agent uses, and its scope in each; `open` finds them."""

    def __init__(self, version: int, mounts: Mapping[str, Path], scope: Path) -> None:
        self.version = version
        self.mounts = dict(mounts)  # controller -> the mount holding it
        self.scope = scope  # relative to each mount: <root>/<agent scope>

    @classmethod
    def open(
        cls,
        root: str,
        work_dir: Path,
        *,
        mounts_file: Path = Path("/proc/self/mounts"),
    ) -> CgroupSystem:
        """The cgroups an agent with `work_dir` may use, its scope created; raises
        `CgroupError` saying why not."""
        if not all(_NAME.match(part) and part not in (".", "..") for part in root.split("/")):
            raise CgroupError(
                f"invalid cgroups root {root!r}: names of letters, digits and '.-_' "
                "(not '.' or '..'), separated by '/'"
            )
        scope = Path(root) / scope_name(work_dir)
        try:
            mounts_text = mounts_file.read_text()
        except OSError as e:
            raise CgroupError(f"cannot read {mounts_file}: {e}") from e
        v2, v1 = parse_mounts(mounts_text)
        reasons = []
        if v2 is not None:
            offered = set(_read(v2 / "cgroup.controllers").split())
            if offered.issuperset(REQUIRED):
                system = cls(2, {c: v2 for c in REQUIRED}, scope)
                try:
                    system._create_scope()
                    return system
                except OSError as e:
                    reasons.append(f"cgroup v2 at {v2}: cannot create {scope}: {e}")
            else:
                missing = ", ".join(sorted(set(REQUIRED) - offered))
                reasons.append(f"cgroup v2 at {v2} lacks {missing}")
        absent = [c for c in REQUIRED if c not in v1]
        if not absent:
            controllers = {c: v1[c] for c in (*REQUIRED, *OPTIONAL) if c in v1}
            system = cls(1, controllers, scope)
            try:
                system._create_scope()
                return system
            except OSError as e:
                reasons.append(f"cgroup v1: cannot create {scope}: {e}")
        else:
            reasons.append(f"no cgroup v1 hierarchy for {', '.join(absent)}")
        raise CgroupError("; ".join(reasons))

    def _create_scope(self) -> None:
        for mount in set(self.mounts.values()):
            if self.version == 2:
                # Each level down to the scope hands the controllers to its children.
                # (The mount's root may have processes; our own levels have none.)
                level = mount
                _enable_controllers(level)
                for part in self.scope.parts:
                    level = level / part
                    level.mkdir(exist_ok=True)
                    _enable_controllers(level)
            else:
                (mount / self.scope).mkdir(parents=True, exist_ok=True)

    def cgroup(self, name: str) -> Cgroup:
        return Cgroup(self.version, {c: m / self.scope / name for c, m in self.mounts.items()})

    def create(self, name: str, limits: Limits) -> Cgroup:
        """A new, empty cgroup with `limits`; raises OSError (after removing what it made)."""
        cgroup = self.cgroup(name)
        try:
            for path in cgroup.paths:
                path.mkdir()
            if self.version == 2:
                _set_limits_v2(cgroup.dirs["memory"], limits)
            else:
                _set_limits_v1(cgroup.dirs, limits)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def children(self) -> set[str]:
        """Names of the cgroups in this agent's scope, in any hierarchy."""
        names: set[str] = set()
        for mount in set(self.mounts.values()):
            with contextlib.suppress(FileNotFoundError):
                names.update(e.name for e in os.scandir(mount / self.scope) if e.is_dir())
        return names

    def remove_scope(self) -> None:
        """Remove this agent's scope directory where it is empty (at stop); busy is fine."""
        for mount in set(self.mounts.values()):
            with contextlib.suppress(OSError):
                (mount / self.scope).rmdir()

    def describe(self) -> str:
        where = sorted({str(m / self.scope) for m in self.mounts.values()})
        return f"cgroup v{self.version}: " + ", ".join(where)


def scope_name(work_dir: Path) -> str:
    """The agent's directory under the cgroups root: one per work dir."""
    digest = hashlib.sha256(str(Path(work_dir).absolute()).encode()).hexdigest()
    return f"agent-{digest[:16]}"


def parse_mounts(text: str) -> tuple[Path | None, dict[str, Path]]:
    """The cgroup2 mount (if any) and, per v1 controller, the mount holding it."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point = Path(fields[1].replace("\\040", " "))
        if fields[2] == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in (*REQUIRED, *OPTIONAL):
                    v1.setdefault(option, mount_point)
    return v2, v1


def _enable_controllers(cgroup: Path) -> None:
    enabled = set(_read(cgroup / "cgroup.subtree_control").split())
    wanted = [c for c in REQUIRED if c not in enabled]
    if wanted:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))


def _set_limits_v1(dirs: Mapping[str, Path], limits: Limits) -> None:
    (dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.mem_bytes))
    (dirs["cpu"] / "cpu.shares").write_text(str(limits.cpu_shares))
    if limits.hard_cpu:
        (dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(limits.cfs_quota_us))
    if limits.pids is not None:
        (dirs["pids"] / "pids.max").write_text(str(limits.pids))


def _set_limits_v2(cgroup: Path, limits: Limits) -> None:
    (cgroup / "memory.max").write_text(str(limits.mem_bytes))
    (cgroup / "cpu.weight").write_text(str(limits.cpu_weight))
    if limits.hard_cpu:
        (cgroup / "cpu.max").write_text(f"{limits.cfs_quota_us} {CFS_PERIOD_US}")
    if limits.pids is not None:
        (cgroup / "pids.max").write_text(str(limits.pids))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(path: Path) -> int | None:
    text = _read(path).strip()
    return int(text) if text.isdigit() else None


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed file ("name value" per line) as a dict of its integer values."""
    values: dict[str, int] = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            values[parts[0]] = int(parts[1])
    return values
