"""How the agent contains its tasks: a task gets what it was given and no more, runs
unprivileged, and a kill ends everything it started.

Chosen once, when the agent starts (`Isolator`), from `IsolationConfig`:

* ``cgroups-v2`` / ``cgroups-v1``: each task run in its own cgroup
  (`agent/_cgroups.py`) with a memory limit from its ``mem``, CPU shares from its
  ``cpus`` (and a CFS quota with ``cpu_hard_limit``), and a pids limit. The task's
  command joins the cgroup before it executes (`agent/_task_wrapper.py`), so
  everything it starts is in it too, whatever session or process group it moves
  to; a kill, and every task's end, kills the whole cgroup; then the agent removes
  it. Used when the machine lets the agent create cgroups (`mode="auto"`, the
  default, or `"cgroups"`, which refuses to start without them).
* ``process-tree``: the fallback, where no cgroup can be written (or forced with
  `mode="process-tree"`): a per-process memory limit (RLIMIT_DATA, from ``mem``),
  no CPU or pids limit, and the wrapper as the child subreaper of everything the
  command starts, so that a kill finds orphans (double forks, ``setsid``) among
  the wrapper's descendants. Weaker: the memory limit is per process and makes an
  allocation fail rather than the task end, and a process that escapes the tree
  (its wrapper SIGKILLed by someone else) escapes the kill. The agent logs a
  warning saying so when it starts, and its mode is in /state.

Either way, when the agent runs as root (and `task_user` is set: it is unless
``--no-switch-user``) the command runs unprivileged, as Mesos' ``--switch_user``
has it: as its framework's user (``FrameworkInfo.user``, which the master's ACLs
allowed) if it names one, else as `task_user` (default ``nobody``). A framework's
user must exist here, else its task fails (`TaskUserError`); a name other than
``root`` for uid 0 is refused (the master's ACLs let root run tasks only by name).
The task runs in a sandbox its user owns, 0700, under directories the agent owns
and others may only traverse (0711), with a clean environment
(`agent/_task_env.py`). The agent's own records of a task are not in the sandbox:
its checkpoints in ``<work_dir>/tasks.jsonl`` (0600) and a wrapper's ``exit.json``
and ``wrapper.json`` in ``<work_dir>/meta/``, which only root can enter. An agent
not run as root runs every task as itself.

What each run was given is checkpointed with it (`Container.record`), so a
restarted agent kills and removes the right cgroup even if it was started with
other settings.
"""

from __future__ import annotations

import enum
import os
import pwd
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from mesolite.agent._cgroups import (
    MIN_MEMORY_MB,
    Cgroup,
    CgroupError,
    CgroupStats,
    CgroupSystem,
    Limits,
)
from mesolite.agent._procs import signal_group
from mesolite.agent._task_wrapper import kill_descendants
from mesolite.agent.errors import AgentError
from mesolite.model import TaskUsage

log = structlog.get_logger(__name__)

DEFAULT_PIDS_LIMIT = 4096
DEFAULT_TASK_USER = "nobody"
SUPERVISOR_CGROUP = "supervisor"  # beside the task runs' cgroups, whose names are hex
_MB = 1024 * 1024


class IsolationMode(enum.StrEnum):
    CGROUPS_V2 = "cgroups-v2"
    CGROUPS_V1 = "cgroups-v1"
    PROCESS_TREE = "process-tree"  # the fallback: rlimits and a process-tree kill


@dataclass(frozen=True, slots=True)
class IsolationConfig:
    """How an agent contains its tasks (the `mesolite agent` options of the same names).

    `mode`: ``auto`` (cgroups if this machine lets the agent create them, else the
    process-tree fallback), ``cgroups`` (or refuse to start), or ``process-tree``.
    `cgroups_root`: the directory under each hierarchy for all agents' cgroups.
    `cpu_hard_limit`: a CFS quota of ``cpus`` besides the shares.
    `pids_limit`: processes and threads per task; None for no limit.
    `task_user`: who runs tasks when the agent is root and their framework names no
    user; None: root itself, for every task (frameworks' users are then ignored).
    `pass_env`: names of the agent's environment variables tasks also get.
    """

    mode: str = "auto"
    cgroups_root: str = "mesolite"
    cpu_hard_limit: bool = False
    pids_limit: int | None = DEFAULT_PIDS_LIMIT
    task_user: str | None = DEFAULT_TASK_USER
    pass_env: tuple[str, ...] = ()


MODES = ("auto", "cgroups", "process-tree")


@dataclass(frozen=True, slots=True)
class TaskUser:
    """The unprivileged user tasks run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, name: str) -> TaskUser:
        """Raises KeyError if there is no such user."""
        entry = pwd.getpwnam(name)
        groups = tuple(os.getgrouplist(name, entry.pw_gid))
        return cls(name, entry.pw_uid, entry.pw_gid, groups)

    def wrapper_arg(self) -> str:
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


class TaskUserError(AgentError):
    """A framework's user cannot run tasks on this agent; its task fails saying why."""


@dataclass(frozen=True, slots=True)
class Limitation:
    """A limit the task ran into, as the end of the task reports it."""

    reason: str  # Mesos' TaskStatus.Reason name
    message: str


REASON_MEMORY = "REASON_CONTAINER_LIMITATION_MEMORY"
REASON_PIDS = "REASON_CONTAINER_LIMITATION"  # Mesos has no pids-specific reason


@dataclass(frozen=True, slots=True)
class Container:
    """How one task run is contained; its `record` goes into the task's checkpoint."""

    mode: IsolationMode
    limits: Limits
    cgroup: Cgroup | None = None
    user: TaskUser | None = None

    def wrapper_args(self) -> list[str]:
        args: list[str] = []
        if self.cgroup is not None:
            for path in self.cgroup.paths:
                args += ["--cgroup", str(path)]
        else:
            args += ["--subreaper", "--rlimit", f"data={self.limits.mem_bytes}"]
        if self.user is not None:
            args += ["--user", self.user.wrapper_arg()]
        return args

    def kill(self, wrapper_pid: int | None) -> None:
        """SIGKILL everything the task runs, then its wrapper's process group. Blocking."""
        if self.cgroup is not None:
            if not self.cgroup.kill():
                log.error("a task's cgroup would not empty", cgroup=str(self.cgroup.paths[0]))
        elif wrapper_pid is not None:
            # Children first: killed, the wrapper would leave its orphans to init.
            kill_descendants(wrapper_pid)
        if wrapper_pid is not None:
            signal_group(wrapper_pid, signal.SIGKILL)

    def clean_up(self) -> CgroupStats | None:
        """After the wrapper ended: kill what is left, read which limits the cgroup ran
        into (`Cgroup.limits_hit`: what `limitation` needs), remove it. Blocking. None
        without a cgroup (or if it was gone already)."""
        if self.cgroup is None or not self.cgroup.exists():
            return None
        if not self.cgroup.kill():
            log.error("a task's cgroup would not empty", cgroup=str(self.cgroup.paths[0]))
        stats = self.cgroup.limits_hit()
        try:
            self.cgroup.remove()
        except OSError as e:
            log.error(
                "could not remove a task's cgroup", cgroup=str(self.cgroup.paths), error=str(e)
            )
        return stats

    def stats(self) -> CgroupStats | None:
        return self.cgroup.stats() if self.cgroup is not None else None

    def limitation(self, stats: CgroupStats | None) -> Limitation | None:
        """Which limit, if any, the task ran into, from its cgroup's final figures."""
        if stats is None:
            return None
        if stats.oom_kills:
            peak = f", peak {_mb(stats.mem_peak_bytes)}" if stats.mem_peak_bytes else ""
            return Limitation(
                REASON_MEMORY,
                f"memory limit of {self.limits.mem_mb:g} MB reached: the kernel killed "
                f"{_processes(stats.oom_kills)} of the task{peak}",
            )
        if stats.pids_limit_hits and self.limits.pids is not None:
            return Limitation(
                REASON_PIDS,
                f"pids limit of {self.limits.pids} reached: "
                f"{stats.pids_limit_hits} fork(s) refused",
            )
        return None

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "mode": self.mode.value,
            "limits": {
                "mem_mb": self.limits.mem_mb,
                "cpus": self.limits.cpus,
                "hard_cpu": self.limits.hard_cpu,
                "pids": self.limits.pids,
            },
        }
        if self.cgroup is not None:
            record["cgroup"] = self.cgroup.record()
        if self.user is not None:
            record["user"] = {
                "name": self.user.name,
                "uid": self.user.uid,
                "gid": self.user.gid,
                "groups": list(self.user.groups),
            }
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Container:
        """Read back `record()`; raises KeyError, TypeError or ValueError."""
        limits, user = record["limits"], record.get("user")
        pids = limits.get("pids")
        return cls(
            mode=IsolationMode(record["mode"]),
            limits=Limits(
                float(limits["mem_mb"]),
                float(limits["cpus"]),
                bool(limits["hard_cpu"]),
                int(pids) if pids is not None else None,
            ),
            cgroup=Cgroup.from_record(record["cgroup"]) if "cgroup" in record else None,
            user=(
                TaskUser(
                    str(user["name"]),
                    int(user["uid"]),
                    int(user["gid"]),
                    tuple(int(g) for g in user["groups"]),
                )
                if user is not None
                else None
            ),
        )


class Isolator:
    """The agent's way of containing tasks, decided at start; see the module docstring.

    Raises `AgentError` if the settings cannot be honoured (``mode="cgroups"``
    without usable cgroups, an unknown mode or task user).
    """

    def __init__(self, config: IsolationConfig, work_dir: Path, *, announce: bool = True) -> None:
        self.config = config
        self.user: TaskUser | None = None
        self.fallback_reason = ""
        self._cgroups: CgroupSystem | None = None
        if config.mode not in MODES:
            raise AgentError(f"unknown isolation mode {config.mode!r}: one of {', '.join(MODES)}")
        if config.mode == "process-tree":
            self.fallback_reason = "process-tree isolation asked for"
        else:
            try:
                self._cgroups = CgroupSystem.open(config.cgroups_root, work_dir)
            except CgroupError as e:
                if config.mode == "cgroups":
                    raise AgentError(f"cgroups asked for, but cannot be used: {e}") from e
                self.fallback_reason = str(e)
        if config.task_user is not None and os.geteuid() == 0:
            try:
                self.user = TaskUser.lookup(config.task_user)
            except KeyError as e:
                raise AgentError(f"no such task user {config.task_user!r}") from e
        if announce:
            self._announce()
            if self.user is not None and (closed := unreachable_ancestor(work_dir, self.user)):
                log.warning(
                    "the task user cannot reach the sandboxes by path: tasks run in theirs "
                    "(their working directory), but MESOLITE_SANDBOX and HOME do not resolve "
                    "for them; let others search the work dir's parents (chmod o+x)",
                    task_user=self.user.name,
                    closed=str(closed),
                )

    @classmethod
    def unconfined(cls) -> Isolator:
        """The fallback without user switching: for tests and embedding (`TaskRunner`'s default)."""
        config = IsolationConfig(mode="process-tree", task_user=None)
        return cls(config, Path("."), announce=False)

    @property
    def mode(self) -> IsolationMode:
        if self._cgroups is None:
            return IsolationMode.PROCESS_TREE
        return IsolationMode.CGROUPS_V2 if self._cgroups.version == 2 else IsolationMode.CGROUPS_V1

    @property
    def has_cgroups(self) -> bool:
        """Whether each task run gets a cgroup (`create`)."""
        return self._cgroups is not None

    @property
    def task_user_name(self) -> str:
        """Who tasks run as: the task user, or the agent's own user."""
        return self.user.name if self.user is not None else _user_name(os.geteuid())

    def user_for(self, framework_user: str) -> TaskUser | None:
        """Who runs a task of a framework naming `framework_user` ("" for none): that user,
        the task user, or None (the agent's own user) when this agent does not switch users.
        Blocking (the user database). Raises `TaskUserError` for a user this agent does
        not have, or a name other than root's for uid 0."""
        if self.user is None or not framework_user:
            return self.user
        try:
            user = TaskUser.lookup(framework_user)
        except (KeyError, ValueError):  # ValueError: a NUL (the master lets none through)
            raise TaskUserError(
                f"user {framework_user!r} does not exist on this agent: a framework's user "
                "must exist on every agent its tasks run on"
            ) from None
        if user.uid == 0 and framework_user != "root":
            raise TaskUserError(
                f"user {framework_user!r} is root (uid 0) by another name: refused, "
                "since only an ACL naming root lets a framework run tasks as root"
            )
        return user

    def describe(self) -> str:
        """One line for the logs: the mode, and where or why."""
        if self._cgroups is not None:
            return f"{self.mode.value} ({self._cgroups.describe()})"
        return f"{self.mode.value} ({self.fallback_reason})"

    def _announce(self) -> None:
        user = self.task_user_name
        if self._cgroups is not None:
            log.info(
                "tasks are contained in cgroups",
                mode=self.mode.value,
                where=self._cgroups.describe(),
                cpu_hard_limit=self.config.cpu_hard_limit,
                pids_limit=self.config.pids_limit,
                task_user=user,
            )
        else:
            log.warning(
                "NO CGROUPS: tasks are contained by rlimits and a process-tree kill only; "
                "their memory is limited per process, their CPU and process count not at all",
                mode=self.mode.value,
                why=self.fallback_reason,
                task_user=user,
            )
        if self.user is None and os.geteuid() == 0:
            log.warning("tasks run as root: no task user is set")

    def create(
        self, run_id: str, resources: Mapping[str, float], user: TaskUser | None
    ) -> Container:
        """A new container for one task run, whose command runs as `user` (`user_for`).
        Blocking; raises OSError if the cgroup could not be set up (the task must then
        not run)."""
        limits = Limits.for_resources(
            resources, hard_cpu=self.config.cpu_hard_limit, pids=self.config.pids_limit
        )
        cgroup = self._cgroups.create(run_id, limits) if self._cgroups is not None else None
        return Container(self.mode, limits, cgroup, user)

    def orphans(self, keep: set[str]) -> list[Cgroup]:
        """Cgroups in this agent's scope that belong to no run named in `keep` (nor to
        the supervisor). Blocking."""
        if self._cgroups is None:
            return []
        names = self._cgroups.children() - keep - {SUPERVISOR_CGROUP}
        return [self._cgroups.cgroup(name) for name in sorted(names)]

    def supervisor_cgroup(self) -> list[Path]:
        """The directories of the cgroup the agent's supervisor (and the wrappers it
        forks) run in, created if need be, without limits: not the agent's, so that
        what stops the agent's cgroup leaves the tasks alone. None in the fallback.
        Blocking."""
        if self._cgroups is None:
            return []
        cgroup = self._cgroups.cgroup(SUPERVISOR_CGROUP)
        for path in cgroup.paths:
            path.mkdir(exist_ok=True)
        return cgroup.paths

    def remove_supervisor_cgroup(self) -> None:
        """Remove the supervisor's cgroup if nothing runs in it (it has exited). Blocking."""
        if self._cgroups is None:
            return
        cgroup = self._cgroups.cgroup(SUPERVISOR_CGROUP)
        try:
            cgroup.remove()
        except OSError as e:
            log.warning(
                "the supervisor's cgroup is still in use", cgroup=str(cgroup.paths[0]), error=str(e)
            )

    def remove_orphans(self, keep: set[str]) -> int:
        """Kill and remove `orphans(keep)`; returns how many there were. Blocking."""
        found = self.orphans(keep)
        for cgroup in found:
            log.warning(
                "killing a cgroup no task owns",
                cgroup=str(cgroup.paths[0]),
                processes=len(cgroup.pids()),
            )
            Container(self.mode, Limits(MIN_MEMORY_MB, 0.0, False, None), cgroup).clean_up()
        return len(found)

    def close(self) -> None:
        """The agent stops: remove its scope where it is empty. Blocking."""
        if self._cgroups is not None:
            self._cgroups.remove_scope()


def unreachable_ancestor(path: Path, user: TaskUser) -> Path | None:
    """The first existing directory on the way to `path` that `user` may not search
    (enter), or None if it may enter them all."""
    for directory in reversed(Path(path).absolute().parents):
        try:
            st = directory.stat()
        except OSError:
            return None  # not there yet: the agent makes it (0755)
        if st.st_uid == user.uid:
            allowed = st.st_mode & 0o100
        elif st.st_gid in user.groups:
            allowed = st.st_mode & 0o010
        else:
            allowed = st.st_mode & 0o001
        if not allowed:
            return directory
    return None


class UsageMeter:
    """Each running task's use, from its cgroup, as the agent reports it (`TaskUsage`).

    CPU use is a rate: the CPU time a run used since the previous `measure`, per
    second of wall time between the two (0 at a run's first sample).
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # run id -> (CPU seconds, when)

    def measure(self, runs: Iterable[tuple[str, str, str, Container]]) -> list[TaskUsage]:
        """(run id, framework id, task id, container) of each running task -> their use.
        Blocking: a few small reads per task."""
        now = time.monotonic()
        usage, last = [], {}
        for run_id, framework_id, task_id, container in runs:
            stats = container.stats()
            if stats is None or stats.cpu_seconds is None:
                continue
            cpu = stats.cpu_seconds
            before = self._last.get(run_id)
            rate = 0.0
            if before is not None and now > before[1]:
                rate = max(0.0, cpu - before[0]) / (now - before[1])
            last[run_id] = (cpu, now)
            usage.append(
                TaskUsage(
                    framework_id=framework_id,
                    task_id=task_id,
                    cpus_used=round(rate, 4),
                    cpu_seconds=round(cpu, 3),
                    mem_used_mb=round((stats.mem_bytes or 0) / _MB, 2),
                    mem_peak_mb=round((stats.mem_peak_bytes or 0) / _MB, 2),
                    processes=stats.processes or 0,
                )
            )
        self._last = last  # runs that ended are forgotten
        return usage


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _mb(amount: int | None) -> str:
    return f"{(amount or 0) / _MB:.1f} MB"


def _processes(count: int) -> str:
    return "a process" if count == 1 else f"{count} processes"


__all__ = [
    "Container",
    "IsolationConfig",
    "IsolationMode",
    "Isolator",
    "Limitation",
    "TaskUser",
    "TaskUserError",
    "UsageMeter",
]
