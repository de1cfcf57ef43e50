"""Start a task's command in its cgroups, as its user, with no program between the
supervisor (`agent/_supervisor.py`) and the command.

The supervisor **forks**; between fork and exec the child, still the supervisor's
code, **joins each of the task's cgroups** (``0`` written to ``cgroup.procs``: one
directory in v2, one per hierarchy in v1), leads a new session, takes the task's
stdout and stderr (and ``/dev/null`` as stdin), enters the sandbox, puts the signals
Python ignores (SIGPIPE, SIGXFSZ) back at their defaults, **becomes the task's user**
(groups, then gid, then uid) and executes the command. A step that fails stops the
command from starting: the child writes why on its report pipe (close-on-exec, so the
pipe's end of file without a word means the command is executing) and exits 127. So
the command never runs outside its cgroups or as root, and the supervisor itself never
steps into a task's cgroup: a kill of the cgroup, its limits and its removal concern
the task's processes only.

This is what a ``/bin/sh`` shim and ``setpriv`` did before, as two ``exec``s per task;
the child here is a fork of the supervisor's small process running a few lines of
Python. (Also measured, and not taken: the supervisor stepping into the task's cgroups
itself and forking the command with `_posixsubprocess.fork_exec`, which switches users
in C. The child is cheaper, but ten cgroup moves a task in the supervisor's one thread,
competing with the agent's cgroup writes, made it the bottleneck: see the README's
"Task starts".)

Standard library only (the supervisor runs without the agent's package).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from mesolite.agent.errors import AgentError

_PROCS = "cgroup.procs"
_SELF = b"0"  # to cgroup.procs: the writing process
_REPORT_MAX = 4000  # bytes: one write, under PIPE_BUF, so a report arrives whole
NOT_STARTED = 127  # the child's exit status when the command could not start


class SpawnError(AgentError):
    """The child could not even be forked; the message says why."""


@dataclass(frozen=True, slots=True)
class Command:
    """What to execute, in which cgroups, as whom, where, with which descriptors as 0,
    1 and 2."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    cgroups: Sequence[str]  # the task's cgroup directories, one per hierarchy
    user: tuple[int, int, Sequence[int]] | None  # uid, gid, groups; None: stay as is
    stdin: int
    stdout: int
    stderr: int


def start(command: Command) -> tuple[int, int]:
    """Fork the child that confines and executes `command`; at once, its pid and the
    read end of its report pipe (non-blocking; `read_report`). Raises `SpawnError`."""
    procs = [os.path.join(directory, _PROCS) for directory in command.cgroups]
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as e:
        os.close(report_read)
        os.close(report_write)
        raise SpawnError(f"cannot fork the command: {e.strerror}") from None
    if pid == 0:
        _child(command, procs, report_write)
    os.close(report_write)
    os.set_blocking(report_read, False)
    return pid, report_read


def read_report(fd: int) -> tuple[bytes, bool]:
    """What a child's report pipe holds now, and whether that is its end (of file). A
    report that ends empty means the command executes; else it says why it could not
    start."""
    data = bytearray()
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return bytes(data), False
        if not chunk:
            return bytes(data), True
        data += chunk


def _child(command: Command, procs: list[str], report: int) -> NoReturn:
    """In the forked child: confine, switch user, execute; never returns."""
    step = "cannot start the command"
    try:
        for path in procs:
            step = f"cannot join the cgroup {os.path.dirname(path)}"
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, _SELF)
        step = "cannot set up the command's session and descriptors"
        os.setsid()
        os.dup2(command.stdin, 0)
        os.dup2(command.stdout, 1)
        os.dup2(command.stderr, 2)
        step = f"cannot enter the sandbox {command.cwd}"
        os.chdir(command.cwd)
        # What Python ignores, a command must not inherit ignored (as subprocess does).
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if command.user is not None:
            uid, gid, groups = command.user
            step = f"cannot become user {uid}"
            os.setgroups(list(groups))
            os.setregid(gid, gid)
            os.setreuid(uid, uid)
        step = f"cannot execute {command.argv[0]}"
        _execute(command.argv, command.env)
    except BaseException as e:  # whatever it is, it is reported
        reason = e.strerror if isinstance(e, OSError) and e.strerror else repr(e)
        with contextlib.suppress(BaseException):
            os.write(report, f"{step}: {reason}".encode(errors="replace")[:_REPORT_MAX])
    finally:
        os._exit(NOT_STARTED)


def _execute(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Execute `argv` with `env`, looking along the task's PATH if the program has no
    slash (as ``execvp`` does); raises the first error that is not "not there"."""
    program, args = argv[0], list(argv)
    if "/" in program:
        os.execve(program, args, env)
    first: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory or ".", program), args, env)
        except OSError as e:
            if first is None and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                first = e
    raise first or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
