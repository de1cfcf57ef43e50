"""The process that runs one task's command and writes down how it ended.

    python -I .../agent/_task_wrapper.py SANDBOX [--ready-fd FD] -- ARGV...

A restarted agent is not the parent of the tasks its predecessor started, so it
cannot wait for them and would never learn their exit status. The wrapper can:
it is the command's parent, outlives the agent, and leaves the status on disk.

* The agent starts the wrapper as the leader of a new session and process
  group; the command is the wrapper's child in that same group, so a kill of
  the group reaches both.
* SIGTERM (and INT, HUP, QUIT, USR1, USR2) sent to the wrapper alone is
  forwarded to the command, so the SIGTERM, grace, SIGKILL kill path behaves
  the same whoever signals.
* With ``--ready-fd FD``, once its handlers are installed and the command has
  been started, it writes the command's pid to FD and closes it. Until then a
  SIGTERM would kill the wrapper before it could record anything, so the agent
  waits for this before it reports TASK_RUNNING or signals the task. End of
  file without a pid means the command could not be started.
* When the command ends, the wrapper writes ``SANDBOX/exit.json`` atomically
  (temporary file, fsync, rename, fsync of the directory), one of
  ``{"exit_code": N}``, ``{"signal": N}`` or ``{"error": "..."}`` (the command
  could not be started), plus the command's pid and the time it ended.
* Then, if it leads its process group, it SIGKILLs the group: whatever the
  command left running ends with it (and so does the wrapper), as when Mesos
  destroys a container. The status is on disk by then.

Standard library (and `mesolite.files`, itself standard library only) and no
asyncio: it starts in tens of milliseconds and depends on nothing the agent
might break. The agent runs it by path with
``python -I`` so that importing it does not import the agent's package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
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
_USAGE = "usage: python -I _task_wrapper.py SANDBOX [--ready-fd FD] -- COMMAND [ARG...]"


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


def run(sandbox: Path, argv: list[str], ready_fd: int | None = None) -> int:
    """Run `argv` to its end, record its status in `sandbox`; returns the wrapper's exit code."""
    forward = _Forwarder()
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        write_json_atomically(
            sandbox / WRAPPER_FILE, {"pid": os.getpid(), "start_time": _own_start_time()}
        )
    except OSError as e:
        print(f"mesolite task wrapper: could not record its pid: {e}", file=sys.stderr)
    record: dict[str, Any]
    try:
        # Inherits stdin, stdout, stderr and the working directory from the agent's
        # set-up; caught signals are reset to their defaults by exec.
        child = subprocess.Popen(argv)
    except OSError as e:
        record = {"error": str(e), "finished": time.time()}
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
        write_json_atomically(sandbox / EXIT_FILE, record)
    except OSError as e:
        print(f"mesolite task wrapper: could not record the exit status: {e}", file=sys.stderr)
    if os.getpgrp() == os.getpid():
        # Only a group this wrapper leads, so a wrapper run by hand never kills its caller.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return returncode


def _tell_ready(fd: int, pid: int) -> None:
    try:
        os.write(fd, f"{pid}\n".encode())
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


def _own_start_time() -> int:
    """Field 22 of /proc/self/stat: with the pid, names this process unambiguously."""
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def main(args: list[str]) -> int:
    ready_fd: int | None = None
    if len(args) >= 3 and args[1] == "--ready-fd" and args[2].isdigit():
        ready_fd = int(args[2])
        args = args[:1] + args[3:]
    if len(args) < 3 or args[1] != "--":
        print(_USAGE, file=sys.stderr)
        return 2
    return run(Path(args[0]), args[2:], ready_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
