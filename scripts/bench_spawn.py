"""What it costs a Python process to start one confined command, six ways.

    python scripts/bench_spawn.py [--starts 300] [--touch-mb 0] [--rounds 2]

Each way starts ``/bin/sh -c true`` as ``nobody`` in a cgroup of its own (made as the
agent makes a task's, under a root of this script's, in every hierarchy the agent
uses), from this process, which stands for the agent's supervisor (it imports the
agent's package, so it is larger), `--starts` times, and prints the CPU
time per start of this process ("parent") and of what it started ("children"), and
how long this process's one thread was held per start ("held"):

* ``shim``: what the supervisor does (`agent/_supervisor.py`): ``posix_spawn`` (a
  vfork) of the ``/bin/sh`` shim that joins the cgroup, then ``setpriv``, then the
  command: three ``exec``s;
* ``forked-child``: ``os.fork``; the child (Python) joins the cgroup, becomes the
  user, executes the command;
* ``step-in-fork-exec``: this process steps into the cgroup, forks and executes the
  command as the user with ``_posixsubprocess.fork_exec`` (the user switch in C:
  CPython forks then, it does not vfork), and steps back;
* ``step-in-setpriv``: it steps into the cgroup, ``posix_spawn``s ``setpriv`` (a
  vfork), and steps back;
* ``c-static``, ``c-dynamic``: ``posix_spawn`` of the supervisor's C exec helper
  (`agent/spawn_shim.c`, compiled here with ``cc -O2``, ``-static`` or not), which
  joins the cgroup, becomes the user and executes the command: one ``exec``, not
  three (left out where there is no ``cc``).

``--touch-mb N``: after each start the parent writes to N MB of its own objects, as
the supervisor's loop does between starts; a fork write-protects every page of the
parent, so each page it writes afterwards faults once (and is copied while the child
has not executed yet). Ways alternate start by start within a round, so a busy
machine weighs on all alike. Needs root; removes its cgroups.
"""

from __future__ import annotations

import _posixsubprocess
import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_isolation import remove_cgroups  # this directory's

from mesolite.agent import _supervisor
from mesolite.agent._cgroups import CgroupSystem, Limits, parse_mounts

COMMAND = ["/bin/sh", "-c", "true"]
ENV = {"PATH": "/usr/bin:/bin"}
NOBODY = 65534
_FORK_EXEC: Any = _posixsubprocess.fork_exec


class Ways:
    """The ways, between one task cgroup and this process's own."""

    def __init__(self, task: list[Path], own: list[Path]) -> None:
        self.task, self.own = task, own
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.cwd = "/tmp"

    def _write(self, directory: Path, pid: int = 0) -> None:
        fd = os.open(directory / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _stepped_in(self) -> Any:
        for directory in self.task:
            self._write(directory)
        try:
            yield
        finally:
            for directory in self.own:
                self._write(directory)

    def shim(self) -> int:
        argv = [_supervisor.SHELL, "-c", _supervisor.SHIM, "bench", *map(str, self.task), "--"]
        argv += [_supervisor.SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}"]
        argv += ["--clear-groups", "--", *COMMAND]
        return self._posix_spawn(
            _supervisor.SHELL, argv, extra=((os.POSIX_SPAWN_DUP2, self.devnull, 3),)
        )

    def forked_child(self) -> int:
        procs = [str(d / "cgroup.procs") for d in self.task]
        pid = os.fork()
        if pid == 0:
            try:
                for path in procs:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    os.write(fd, b"0")
                os.setsid()
                os.dup2(self.devnull, 0)
                os.dup2(self.devnull, 1)
                os.chdir(self.cwd)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                os.setgroups([])
                os.setregid(NOBODY, NOBODY)
                os.setreuid(NOBODY, NOBODY)
                os.execve(COMMAND[0], COMMAND, ENV)
            finally:
                os._exit(127)
        return pid

    def step_in_fork_exec(self) -> int:
        with self._stepped_in():
            errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
            args: list[Any] = [COMMAND, [os.fsencode(COMMAND[0])], False, (), self.cwd]
            args += [[os.fsencode(f"{k}={v}") for k, v in ENV.items()]]
            args += [self.devnull, -1, -1, self.devnull, -1, -1, errors_read, errors_write]
            args += [True, True, -1, NOBODY, [], NOBODY, -1, None]
            if sys.version_info < (3, 14):
                args.append(True)  # allow_vfork
            try:
                pid = int(_FORK_EXEC(*args))
            finally:
                os.close(errors_write)
        try:
            assert not os.read(errors_read, 4096), "the command did not start"
        finally:
            os.close(errors_read)
        return pid

    def helper(self, binary: str) -> Callable[[], int]:
        def start() -> int:
            argv = [binary, *map(str, self.task), "--", str(NOBODY), str(NOBODY), ""]
            return self._posix_spawn(
                binary, [*argv, "--", *COMMAND], extra=((os.POSIX_SPAWN_DUP2, self.devnull, 3),)
            )

        return start

    def step_in_setpriv(self) -> int:
        argv = [_supervisor.SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}"]
        argv += ["--clear-groups", "--", *COMMAND]
        with self._stepped_in():
            return self._posix_spawn(_supervisor.SETPRIV, argv)

    def _posix_spawn(self, program: str, argv: list[str], extra: tuple[Any, ...] = ()) -> int:
        os.chdir(self.cwd)
        try:
            return os.posix_spawn(
                program,
                argv,
                ENV,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, self.devnull, 0),
                    (os.POSIX_SPAWN_DUP2, self.devnull, 1),
                    *extra,
                ],
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        finally:
            os.chdir("/")


def where_i_am(task: list[Path]) -> list[Path]:
    """This process's cgroup in the hierarchy of each of `task`'s directories."""
    _, v1 = parse_mounts(Path("/proc/self/mounts").read_text())
    mine: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            mine[controller or ""] = path.lstrip("/")
    homes = []
    for directory in task:
        mount = directory.parents[2]  # <mount>/<root>/<agent scope>/<name>
        controller = next((c for c, m in v1.items() if m == mount), "")
        homes.append(mount / mine[controller])
    return homes


def build_helpers(directory: Path) -> dict[str, str]:
    """The C exec helper, static and dynamic, compiled into `directory`."""
    source = Path(_supervisor.__file__).absolute().parent / "spawn_shim.c"
    built = {}
    for name, flags in (("c-static", ["-static"]), ("c-dynamic", [])):
        binary = directory / name
        done = subprocess.run(["cc", "-O2", *flags, "-o", str(binary), str(source)], check=False)
        if done.returncode == 0:
            built[name] = str(binary)
    return built


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=300, help="starts per way per round")
    parser.add_argument("--touch-mb", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0 or not _supervisor.SETPRIV:
        print("needs root and setpriv")
        return 2
    root = f"mesolite-bench-spawn-{uuid.uuid4().hex[:8]}"
    system = CgroupSystem.open(root, Path("/bench-spawn"))
    task = system.create("task", Limits(64.0, 1.0, False, None)).paths
    ways = Ways(task, where_i_am(task))  # stepping back: to where this process is
    starts: dict[str, Callable[[], int]] = {
        "shim": ways.shim,
        "forked-child": ways.forked_child,
        "step-in-fork-exec": ways.step_in_fork_exec,
        "step-in-setpriv": ways.step_in_setpriv,
    }
    helpers = tempfile.TemporaryDirectory(prefix="bench-spawn-")
    if shutil.which("cc"):
        for name, binary in build_helpers(Path(helpers.name)).items():
            starts[name] = ways.helper(binary)
    # Objects to write to between starts: about `--touch-mb` MB of small lists.
    objects: list[list[object]] = [[i, None] for i in range(int(args.touch_mb * (1 << 20) / 88))]
    try:
        for start in starts.values():  # warm up
            os.waitpid(start(), 0)
        print(f"load {os.getloadavg()[0]:.1f}, --touch-mb {args.touch_mb:g}")
        for round_ in range(args.rounds):
            totals = {name: [0.0, 0.0, 0.0] for name in starts}  # parent, children, held
            for _ in range(args.starts):
                for name, start in starts.items():
                    parent, children = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
                    began = time.perf_counter()
                    pid = start()
                    held = time.perf_counter() - began
                    for item in objects:
                        item[1] = item  # a write to each object: its page
                    os.waitpid(pid, 0)
                    total = totals[name]
                    total[0] += cpu(resource.RUSAGE_SELF) - parent
                    total[1] += cpu(resource.RUSAGE_CHILDREN) - children
                    total[2] += held
            figures = {
                name: {
                    "parent_ms": round(p / args.starts * 1e3, 2),
                    "children_ms": round(c / args.starts * 1e3, 2),
                    "all_ms": round((p + c) / args.starts * 1e3, 2),
                    "held_ms": round(h / args.starts * 1e3, 2),
                }
                for name, (p, c, h) in totals.items()
            }
            print(f"round {round_ + 1}: {json.dumps(figures)}", flush=True)
        print(f"load {os.getloadavg()[0]:.1f}")
    finally:
        for item in objects:
            item[1] = None
        remove_cgroups(root)
        helpers.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
