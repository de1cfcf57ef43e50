"""Start a task's command in its cgroups from birth, as its user: what the supervisor
(`agent/_supervisor.py`) does for each spawned task, with no program between it and
the command.

The supervisor, a single thread, **steps into the task's cgroups** (``0`` written to
``cgroup.procs`` in each of the task's directories: one in v2, one per hierarchy in
v1), **forks** the child that executes the command (`_posixsubprocess.fork_exec`, what
`subprocess` uses: between fork and exec, in C, the child takes its descriptors, its
sandbox as working directory, the signals Python ignores back at their defaults, a new
session, then the task's groups, gid and uid), **steps back** into its own cgroup in
each hierarchy (`Confiner`'s, given at start: ``--cgroup``) as soon as the fork
returns, and then waits until the child has executed the command or said on a pipe
why it could not. The child is in the task's cgroups from its fork, so the command
never runs outside them, and nothing runs between the supervisor and the command.
With a user to switch to, CPython 3.11 forks here (vfork only without one, and then
the fork returns once the child has executed).

What the supervisor's instant in a task's cgroups (its joins, the fork, its leaves:
a fraction of a millisecond, usually over before the child executes the command)
could do, and how each is handled:

* **a kill of the cgroup**: the agent never kills or removes a run's cgroup while its
  spawn is unanswered; besides, it spares the supervisor's and the keeper's pids
  (``hello``) in every kill (`kill_cgroup`'s ``spare``), and while one of them is in
  the cgroup it neither freezes it nor writes ``cgroup.kill`` (which would end them);
  a removal then fails (busy), and the next agent start removes the cgroup;
* **the pids limit**: the supervisor counts in it while there. A limit it finds
  (``pids.max`` a number) is raised by one for the window and set back once it has
  left the pids cgroup (first, the cgroup it joins last), so a command may start at a
  limit of 1 and fork as far as its limit. (For the one write between the two, a
  command that had reached its limit could fork once more: it would have to have
  forked that many times between its exec and that write);
* **the memory limit**: what the supervisor allocates in the window (a few pages) is
  charged to the task; the command would have to allocate its whole limit (at least
  32 MB) before the supervisor is out for the kernel's OOM killer to run while the
  supervisor is there; the CPU quota (joined next to last, left next to first) and
  ``cpuacct`` likewise see a fraction of a millisecond of the supervisor's CPU time;
* **a cgroup that cannot be joined** (removed, or no cgroup of the supervisor's own in
  its hierarchy to come back to), **or an exec that fails**: `SpawnError`, after
  stepping back out of those joined; the command is not started (a child that could
  not execute it is reaped);
* **a cgroup of its own it cannot return to** (removed from outside): `Stranded`, once
  the command (if it started) is forked; the supervisor then records it and exits, so
  it never stays in a task's cgroup; its keeper reaps what it left.

Standard library only (the supervisor runs without the agent's package).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mesolite.agent.errors import AgentError

_PROCS = "cgroup.procs"
_PIDS_MAX = "pids.max"
_CPU_QUOTA = ("cpu.cfs_quota_us", "cpu.max")  # v1, v2
_PIDS_RANK = 2  # joined last, left first
_SELF = b"0"  # to cgroup.procs: the writing process
SETPRIV = shutil.which("setpriv") or ""  # util-linux: the user switch


class SpawnError(AgentError):
    """The command was not started; the message says why. The supervisor is back in
    its own cgroups."""


class Stranded(AgentError):
    """The supervisor could not return to its own cgroup in some hierarchy: it must
    exit. `pid` is the command's if it was started (it runs, confined)."""

    def __init__(self, why: str, pid: int | None) -> None:
        super().__init__(why)
        self.pid = pid


@dataclass(frozen=True, slots=True)
class Command:
    """What to execute, as whom, where, with which descriptors as 0, 1 and 2."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    user: tuple[int, int, Sequence[int]] | None  # uid, gid, groups; None: stay as is
    stdin: int
    stdout: int
    stderr: int


@dataclass(frozen=True, slots=True)
class _Home:
    """The supervisor's own cgroup in one hierarchy."""

    path: Path
    procs: int  # its cgroup.procs, open for writing
    inode: int
    rank: int  # order of joining: pids last (and left first), the CPU quota next to it


@dataclass(frozen=True, slots=True)
class _Step:
    directory: Path
    home: _Home


class Confiner:
    """Starts commands in cgroups of the hierarchies of `own` (the supervisor's own
    cgroup, one directory per hierarchy, the supervisor in it), stepping back into
    `own` after each. Raises OSError if one of them cannot be opened."""

    def __init__(self, own: Sequence[Path]) -> None:
        self._homes: dict[int, _Home] = {}
        for path in own:
            st = os.stat(path)
            rank = _PIDS_RANK if (path / _PIDS_MAX).exists() else 0
            if not rank and any((path / name).exists() for name in _CPU_QUOTA):
                rank = 1
            procs = os.open(path / _PROCS, os.O_WRONLY | os.O_CLOEXEC)
            self._homes[st.st_dev] = _Home(Path(path), procs, st.st_ino, rank)

    @property
    def can_spawn(self) -> bool:
        """Whether it has a cgroup of its own to return to."""
        return bool(self._homes)

    def start(self, cgroups: Sequence[str], command: Command) -> int:
        """The pid of `command`, started in `cgroups` (the task's directories, one per
        hierarchy). Raises `SpawnError` (not started) or `Stranded` (the supervisor
        must exit)."""
        steps = self._plan(cgroups)
        joined: list[_Step] = []
        limit: tuple[Path, int] | None = None
        pid: int | None = None
        try:
            last = steps[-1]
            limit = _raise_pids_limit(last.directory) if last.home.rank == _PIDS_RANK else None
            for step in steps:
                _join(step.directory)
                joined.append(step)
            started = _spawn(command)
            pid = started
        finally:
            stuck = self._leave(joined, limit)
            if stuck:
                raise Stranded(_stranded(stuck), pid)
        return started

    def _plan(self, cgroups: Sequence[str]) -> list[_Step]:
        """The task's directories, each with the supervisor's own cgroup in its hierarchy,
        in the order to join them."""
        steps: list[_Step] = []
        for name in cgroups:
            directory = Path(name)
            try:
                st = os.stat(directory)
            except OSError as e:
                raise SpawnError(f"cannot join the cgroup {directory}: {e.strerror}") from None
            home = self._homes.get(st.st_dev)
            if home is None:
                raise SpawnError(
                    f"cannot join the cgroup {directory}: the supervisor has no cgroup of "
                    "its own in its hierarchy to return to"
                )
            if home.inode == st.st_ino or any(s.home is home for s in steps):
                raise SpawnError(
                    f"cannot join the cgroup {directory}: the supervisor's own, or a second "
                    "one in the same hierarchy"
                )
            steps.append(_Step(directory, home))
        if not steps:
            raise SpawnError("a spawned command needs a cgroup")
        return sorted(steps, key=lambda s: s.home.rank)

    def _leave(self, joined: list[_Step], limit: tuple[Path, int] | None) -> list[str]:
        """Step back home from each of `joined`, last joined first; the pids limit set
        back once out of the pids cgroup. What could not be left, and why."""
        stuck: list[str] = []
        for step in reversed(joined):
            try:
                os.write(step.home.procs, _SELF)
            except OSError as e:
                stuck.append(f"{step.home.path}: {e.strerror}")
            if limit is not None and step.directory == limit[0]:
                _set_pids_limit(*limit)
                limit = None
        if limit is not None:  # raised, but its cgroup never joined
            _set_pids_limit(*limit)
        return stuck


def _join(directory: Path) -> None:
    try:
        fd = os.open(directory / _PROCS, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, _SELF)
        finally:
            os.close(fd)
    except OSError as e:
        raise SpawnError(f"cannot join the cgroup {directory}: {e.strerror}") from None


def _raise_pids_limit(directory: Path) -> tuple[Path, int] | None:
    """Raise the pids cgroup's limit by one (for the supervisor, while it is there):
    (its directory, the limit to set back), or None where there is no limit."""
    try:
        text = (directory / _PIDS_MAX).read_text().strip()
        if not text.isdigit():
            return None  # "max"
        (directory / _PIDS_MAX).write_text(str(int(text) + 1))
    except OSError as e:
        raise SpawnError(f"cannot join the cgroup {directory}: {e.strerror}") from None
    return directory, int(text)


def _set_pids_limit(directory: Path, limit: int) -> None:
    with contextlib.suppress(OSError):  # gone: nothing is left to limit
        (directory / _PIDS_MAX).write_text(str(limit))


def _stranded(stuck: list[str]) -> str:
    return "the supervisor cannot return to its own cgroup: " + "; ".join(stuck)


def _spawn(command: Command) -> int:
    """posix_spawn (a vfork: the supervisor's memory is not copied) `command`, through
    ``setpriv`` if it takes a user; returns once the first program executes. Raises
    `SpawnError` if it could not."""
    argv = list(command.argv)
    if command.user is not None:
        if not SETPRIV:
            raise SpawnError("cannot switch to the task's user: no setpriv here")
        uid, gid, groups = command.user
        keep = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
        argv = [SETPRIV, f"--reuid={uid}", f"--regid={gid}", keep, "--", *argv]
    elif "/" not in argv[0]:
        argv[0] = shutil.which(argv[0], path=command.env.get("PATH", os.defpath)) or argv[0]
    try:
        # posix_spawn has no chdir here: the supervisor (one thread) steps into the
        # sandbox for the spawn, and out again so as not to hold it.
        os.chdir(command.cwd)
    except OSError as e:
        raise SpawnError(f"cannot enter the sandbox {command.cwd}: {e.strerror}") from None
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            command.env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, command.stdin, 0),
                (os.POSIX_SPAWN_DUP2, command.stdout, 1),
                (os.POSIX_SPAWN_DUP2, command.stderr, 2),
            ],
            setsid=True,
            # As subprocess does: what Python ignores (SIGPIPE, SIGXFSZ), a command
            # must not inherit ignored.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    except OSError as e:
        raise SpawnError(f"cannot execute {argv[0]}: {e.strerror}") from None
    except ValueError as e:
        raise SpawnError(f"cannot execute {argv[0]}: {e}") from None
    finally:
        os.chdir("/")
