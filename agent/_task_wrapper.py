"""The process that runs one task's command, keeps it contained, and writes down how it ended.

    python -I .../agent/_task_wrapper.py RECORDS [--ready-fd FD] [--cgroup DIR]...
        [--user UID:GID[:GID,...]] [--rlimit NAME=N]... [--subreaper] -- ARGV...

A restarted agent is not the parent of the tasks its predecessor started, so it
cannot wait for them and would never learn their exit status. The wrapper can:
it is the command's parent, outlives the agent, and leaves the status on disk,
in RECORDS (the task's records directory, which only the agent can read).

* The agent's supervisor (`agent/_supervisor.py`) forks the wrapper and calls `run`
  in it, as the leader of a new session and process group (it can also be run by
  path, as above); the command is the wrapper's child in that same group, so a kill of
  the group reaches both.
* Between fork and exec, the command (not the wrapper) joins each ``--cgroup``
  DIR (the task's cgroup: one directory in cgroup v2, one per hierarchy in v1),
  takes the ``--rlimit``s, and becomes ``--user`` (groups, then gid, then uid),
  so it runs limited and unprivileged from its first instruction and so does
  everything it starts. A step that fails stops the command from starting.
* SIGTERM (and INT, HUP, QUIT, USR1, USR2) sent to the wrapper alone is
  forwarded to the command, so the SIGTERM, grace, SIGKILL kill path behaves
  the same whoever signals.
* With ``--ready-fd FD``, once its handlers are installed and the command has
  been started, it writes a line to FD, the command's pid and its own, and closes
  it. Until then a
  SIGTERM would kill the wrapper before it could record anything, so the agent
  waits for this before it reports TASK_RUNNING or signals the task. End of
  file without a pid means the command could not be started.
* When the command ends, the wrapper writes ``RECORDS/exit.json`` atomically
  (temporary file, fsync, rename, fsync of the directory), one of
  ``{"exit_code": N}``, ``{"signal": N}`` or ``{"error": "..."}`` (the command
  could not be started), plus the command's pid and the time it ended.
* Then it destroys what the command left, as Mesos destroys a container: every
  process in the task's cgroup (`kill_cgroup`: this catches children that left
  the process group with ``setsid`` and double forks), or, with
  ``--subreaper`` and no cgroup, every descendant (the wrapper is their child
  subreaper, so orphans are reparented to it rather than to init); and if it
  leads its process group, it SIGKILLs the group, itself included. The status
  is on disk by then.

Standard library (and `mesolite.files`, itself standard library only) and no
asyncio: it depends on nothing the agent might break, and the supervisor, which
imports it without the agent's package (grpc and all), stays small to fork; for the
same reason the few primitives the agent shares with it (`kill_cgroup`,
`descendants`) live here.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesolite.files import write_json_atomically

EXIT_FILE = "exit.json"
# Written first thing, before the command starts: a restarted agent finds the
# wrapper here even if the agent died before it could checkpoint the pid.
WRAPPER_FILE = "wrapper.json"
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
RLIMITS = {"data": resource.RLIMIT_DATA, "as": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE}
_USAGE = (
    "usage: python -I _task_wrapper.py RECORDS [--ready-fd FD] [--cgroup DIR]... "
    "[--user UID:GID[:GID,...]] [--rlimit NAME=N]... [--subreaper] -- COMMAND [ARG...]"
)
_PR_SET_CHILD_SUBREAPER = 36
_KILL_TIMEOUT = 10.0


@dataclass
class Confinement:
    """What the command is put into between fork and exec (all optional)."""

    cgroups: list[Path] = field(default_factory=list)
    user: tuple[int, int, list[int]] | None = None  # uid, gid, supplementary groups
    rlimits: dict[str, int] = field(default_factory=dict)
    subreaper: bool = False

    @property
    def in_child(self) -> bool:
        """Whether the command has anything to enter between fork and exec."""
        return bool(self.cgroups or self.user is not None or self.rlimits)

    def enter(self) -> None:
        """Run in the command's process before exec: join, limit, drop privileges."""
        try:
            pid = str(os.getpid())
            for cgroup in self.cgroups:
                with open(cgroup / "cgroup.procs", "w") as f:
                    f.write(pid)
            for name, limit in self.rlimits.items():
                resource.setrlimit(RLIMITS[name], (limit, limit))
            if self.user is not None:
                uid, gid, groups = self.user
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
        except OSError as e:
            # Popen only says "Exception occurred in preexec_fn": say which step failed.
            os.write(2, f"mesolite task wrapper: cannot confine the command: {e}\n".encode())
            raise


class _Forwarder:
    """Signal handler that passes signals on to the command once it exists."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.reaped = False
        self.early: list[int] = []  # arrived before the command was started

    def __call__(self, signum: int, frame: object) -> None:
        if self.reaped:
            return  # the pid may name another process by now
        if self.pid is None:
            self.early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)


def run(
    records: Path,
    argv: list[str],
    ready_fd: int | None = None,
    confinement: Confinement | None = None,
    *,
    env: dict[str, str] | None = None,
    recorded: Callable[[], object] | None = None,
) -> int:
    """Run `argv` to its end, record its status in `records`; returns the wrapper's exit code.

    `env`: the command's environment (default: the wrapper's). `recorded` is called
    once ``wrapper.json`` is written, before the command starts.
    """
    confine = confinement or Confinement()
    forward = _Forwarder()
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    if confine.subreaper:
        _become_subreaper()
    try:
        _record_pid(records / WRAPPER_FILE)
    except OSError as e:
        print(f"mesolite task wrapper: could not record its pid: {e}", file=sys.stderr)
    if recorded is not None:
        recorded()
    record: dict[str, Any]
    try:
        # Inherits stdin, stdout, stderr and the working directory from the agent's
        # set-up; caught signals are reset to their defaults by exec.
        # preexec_fn is safe here: the wrapper has one thread.
        child = subprocess.Popen(
            argv, env=env, preexec_fn=confine.enter if confine.in_child else None
        )
    except (OSError, subprocess.SubprocessError) as e:
        error = str(e)
        if isinstance(e, subprocess.SubprocessError):
            error = "could not confine the command (cgroup, limits or user): see stderr"
        record = {"error": error, "finished": time.time()}
        returncode = 127
    else:
        forward.pid = child.pid
        for signum in forward.early:
            forward(signum, None)
        if ready_fd is not None:
            _tell_ready(ready_fd, child.pid)
            ready_fd = None
        status = _wait(child.pid, forward)
        child.returncode = 0  # reaped by `_wait`; keeps Popen from trying again
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            record = {"signal": signum}
            returncode = 128 + signum
        else:
            returncode = os.WEXITSTATUS(status)
            record = {"exit_code": returncode}
        record.update(pid=child.pid, finished=time.time())
    if ready_fd is not None:
        os.close(ready_fd)  # end of file: the command did not start
    try:
        write_json_atomically(records / EXIT_FILE, record)
    except OSError as e:
        print(f"mesolite task wrapper: could not record the exit status: {e}", file=sys.stderr)
    if confine.cgroups:
        if not kill_cgroup(confine.cgroups):
            print("mesolite task wrapper: processes outlived the cgroup kill", file=sys.stderr)
    elif confine.subreaper:
        kill_descendants(os.getpid(), reap=True)
    if os.getpgrp() == os.getpid():
        # Only a group this wrapper leads, so a wrapper run by hand never kills its caller.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return returncode


def kill_cgroup(cgroups: Sequence[Path], *, timeout: float = _KILL_TIMEOUT) -> bool:
    """SIGKILL every process in a cgroup until none is left; False if some outlived `timeout`.

    `cgroups` are the cgroup's directories: one in v2, one per hierarchy in v1.
    Where the kernel has ``cgroup.kill`` (v2, Linux 5.14+) one write kills them
    all at once. Otherwise, where there is a freezer (v1's ``freezer.state``, v2's
    ``cgroup.freeze``), each round freezes the cgroup, so no process can fork
    while the round signals them, and thaws it for the signals to land; without
    one, rounds repeat until a read of ``cgroup.procs`` finds none (each round
    kills every process that existed when it read the list). Blocking: at most
    `timeout` seconds.
    """
    freeze: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        pids = cgroup_pids(cgroups)
        if not pids:
            return True
        if freeze is None:
            # Processes are left (an empty cgroup, the common case, costs one read):
            # the kernel's way first, where it has one, then rounds of signals.
            for cgroup in cgroups:
                with contextlib.suppress(OSError):
                    (cgroup / "cgroup.kill").write_text("1")
            freeze = _freezer(cgroups)
            continue
        if time.monotonic() > deadline:
            return False
        with freeze():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def cgroup_pids(cgroups: Iterable[Path]) -> set[int]:
    """The processes in a cgroup (any of its directories); none if it is gone."""
    pids: set[int] = set()
    for cgroup in cgroups:
        try:
            pids.update(int(line) for line in (cgroup / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def _freezer(cgroups: Sequence[Path]) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """A context that holds the cgroup frozen, if it has a freezer."""
    for cgroup in cgroups:
        for name, freeze, thaw in (
            ("freezer.state", b"FROZEN", b"THAWED"),
            ("cgroup.freeze", b"1", b"0"),
        ):
            control = cgroup / name
            if control.exists():
                return lambda: _frozen(control, freeze, thaw)
    return contextlib.nullcontext


@contextlib.contextmanager
def _frozen(control: Path, freeze: bytes, thaw: bytes) -> Any:
    try:
        control.write_bytes(freeze)
    except OSError:
        yield  # the cgroup is gone, or the freezer refused: signal unfrozen
        return
    try:
        if freeze == b"FROZEN":  # v1 reports FREEZING until every task has stopped
            deadline = time.monotonic() + 0.1
            while control.read_bytes().strip() != b"FROZEN" and time.monotonic() < deadline:
                time.sleep(0.001)
        yield
    finally:
        with contextlib.suppress(OSError):
            control.write_bytes(thaw)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, children before grandchildren. O(processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        kids = [k for p in frontier for k in children.get(p, ())]
        found.extend(kids)
        frontier = kids
    return found


def kill_descendants(pid: int, *, reap: bool = False, timeout: float = _KILL_TIMEOUT) -> bool:
    """SIGKILL every descendant of `pid` until none is left; False if some outlived `timeout`.

    `reap`: `pid` is this process, their subreaper, which reaps the orphans it inherits.
    """
    deadline = time.monotonic() + timeout
    while True:
        if reap:
            _reap_children()
        found = descendants(pid)
        if not found:
            return True
        if time.monotonic() > deadline:
            return False
        for p in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.005)


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _become_subreaper() -> None:
    import ctypes  # only here: it costs every other wrapper start a few milliseconds

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    except (OSError, AttributeError) as e:
        print(f"mesolite task wrapper: cannot become a subreaper: {e}", file=sys.stderr)


def _tell_ready(fd: int, pid: int) -> None:
    try:
        # One write of a short line: whole even on a pipe many wrappers share.
        os.write(fd, f"{pid} {os.getpid()}\n".encode())
    except OSError:
        pass  # the agent is gone; the task runs on regardless
    finally:
        os.close(fd)


def _wait(pid: int, forward: _Forwarder) -> int:
    """Wait for `pid` and reap it without a window in which a forwarded signal could
    reach a new process that reused the pid."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, still a zombie: pid reserved
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        _, status = os.waitpid(pid, 0)
        forward.reaped = True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return status


def start_time_of(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: with the pid, names a process unambiguously."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _record_pid(path: Path) -> None:
    """Write ``wrapper.json``, not fsynced: it names this live process, and is of no use
    after a crash of the machine, which ends the process."""
    write_json_whole(path, {"pid": os.getpid(), "start_time": start_time_of(os.getpid())})


def write_json_whole(path: Path, record: dict[str, Any]) -> None:
    """Replace `path` whole (temporary file, rename), without fsync: a process that dies
    leaves the old or the new file, a machine that crashes may leave either, or none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def parse_args(args: list[str]) -> tuple[Path, int | None, Confinement, list[str]] | None:
    """(records, ready fd, confinement, argv), or None if `args` are not the usage above."""
    if not args or args[0].startswith("-"):
        return None
    records, rest = Path(args[0]), args[1:]
    ready_fd: int | None = None
    confine = Confinement()
    try:
        while rest and rest[0] != "--":
            option, rest = rest[0], rest[1:]
            if option == "--subreaper":
                confine.subreaper = True
                continue
            value, rest = rest[0], rest[1:]
            if option == "--ready-fd":
                ready_fd = int(value)
            elif option == "--cgroup":
                confine.cgroups.append(Path(value))
            elif option == "--user":
                uid, gid, *groups = value.split(":")
                extra = [int(g) for g in groups[0].split(",") if g] if groups else []
                confine.user = (int(uid), int(gid), extra)
            elif option == "--rlimit":
                name, limit = value.split("=")
                if name not in RLIMITS:
                    return None
                confine.rlimits[name] = int(limit)
            else:
                return None
    except (IndexError, ValueError):
        return None
    if len(rest) < 2:
        return None
    return records, ready_fd, confine, rest[1:]


def main(args: list[str]) -> int:
    parsed = parse_args(args)
    if parsed is None:
        print(_USAGE, file=sys.stderr)
        return 2
    records, ready_fd, confine, argv = parsed
    return run(records, argv, ready_fd, confine)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
