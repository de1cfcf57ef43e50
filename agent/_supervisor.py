"""The agent's supervisor: a long-lived process that starts each task's command.

    python -I .../agent/_supervisor.py DIR [--cgroup CGROUP_DIR]...

Starting a task's wrapper as a fresh interpreter (``python -I _task_wrapper.py``)
costs tens of milliseconds of CPU per task. The supervisor pays for an interpreter
once, and starts tasks in one of two ways:

* **spawn** (a task with a cgroup): it starts the command itself with
  ``posix_spawn`` (a vfork: cheap, and cheaper still from a small process), in a new
  session, through a ``/bin/sh`` shim (`SHIM`) that joins the task's cgroup and
  execs ``setpriv`` to become the task's user, then the command; or, where it is
  built, through a C exec helper (`agent/spawn_shim.c`) that does both in one exec.
  It is the command's parent, so it learns the exit status, and writes it to the exit log
  (`agent/_exit_log.py`, group commit: one write and one fsync per turn of its loop)
  before it tells the agent. No per-task waiter process: the cgroup kill (the agent's,
  at the end of every run) ends whatever the command left.
* **wrapper** (the process-tree fallback, which needs rlimits and a subreaper per
  task): it forks one wrapper per task from itself (a fork of a small process: about
  a millisecond), which runs as before.

As containerd's shims outlive containerd, it outlives the agent: it runs in its own
session, in a cgroup of its own (``--cgroup``, none in the process-tree fallback),
not the agent's. Its parent there is its **keeper** (`keep`), the subreaper of what it
spawns: if the supervisor dies, its commands become the keeper's, which writes their
ends to the exit log; the agent waits for them with pidfds and reads their ends there.

Each wrapper is the same as before, and keeps every guarantee it had: it is the
leader of a new session and process group, its command joins the task's cgroup,
takes its limits and becomes its user between fork and exec, and it writes the
command's exit status to the task's records (`_task_wrapper`). It is a complete
per-task waiter: if the supervisor dies, its wrappers go on and still record how
their commands end; the agent then waits for each with a pidfd, as for the tasks it
recovers after its own restart, and starts a new supervisor for new tasks.

A wrapper records its pid (``wrapper.json``) before its command may start. Until it
has, it dies with the supervisor (``PR_SET_PDEATHSIG``), so a command never runs
that neither the supervisor nor ``wrapper.json`` can name.

**The socket.** ``DIR/socket`` (``DIR`` is the agent's, 0700; the socket 0600), a
stream of frames: a 4-byte big-endian length, then a JSON object of at most
`MAX_FRAME` bytes. Only a peer with the supervisor's own user id (the kernel's
``SO_PEERCRED``, not anything the peer says) is served, and one at a time: a new
connection replaces the last, whose buffered requests are carried out first (an
agent that was SIGKILLed may have left a launch in it).

    supervisor -> agent, on connecting:
        {"op": "wrappers", "wrappers": [{"pid", "start_time", "records"}, ...]}  (0 or more)
        {"op": "hello", "pid": <the supervisor's>, "keeper": <its keeper's>,
         "spawn": <whether it can spawn: the C exec helper or setpriv is there>,
         "shim": <the C exec helper's path, or "sh": the /bin/sh shim and setpriv>}
    agent -> supervisor, with two file descriptors (SCM_RIGHTS): the task's stdout
    and its stderr:
        {"op": "launch", "id": N, "records": DIR, "options": [wrapper options],
         "argv": [...], "env": {...}, "cwd": SANDBOX}
        {"op": "spawn", "id": N, "run": RUN, "records": DIR, "cgroups": [DIR, ...],
         "user": [UID, GID, [GROUPS]] or null, "argv": [...], "env": {...},
         "cwd": SANDBOX}
    supervisor -> agent:
        {"op": "spawned", "id": N, "pid": P, "start_time": T}  or  {"op": "spawned",
         "id": N, "error": "..."}
        {"op": "ready", "pid": P, "command": C}   wrapper P's command (pid C) runs; for
                                                  a spawned command C == P, in its cgroup
        {"op": "exited", "pid": P, "start_time": T, "status": <wait status>}
                                                  (a spawned one's: in the exit log; with
                                                  "error" if its shim could not confine it)

Every wrapper says it is ready on one pipe the supervisor reads (the wrapper's
``--ready-fd``, a line with its command's pid and its own); the supervisor reads that
pipe before it tells of the wrappers it reaped, so "ready" comes before "exited", and
an "exited" with no "ready" before it means the command never started.

A wrapper's end is told to the agent connected when the supervisor reaps it, and to
no one else: what lasts is the wrapper's ``exit.json``. With no agent connected and
no wrapper left, the supervisor exits.

A spawned command is named in the exit log ("spawned", with its task run) before the
agent hears its pid, so an agent that died before it checkpointed the pid finds it
there. Its shim (or the C exec helper) says on one pipe (fd 3) once it is in its
cgroups (the helper: and has become the task's user), read before the
supervisor tells of what it reaped, so "ready" comes before "exited". Left open: a
supervisor killed in the few instructions between ``posix_spawn`` returning and that
line leaves a command nobody names; the agent fails the run and removes its cgroup,
which ends the command, or, if the command joined it just as it was removed, leaves
it contained there until the next agent start removes the cgroups no task owns.

Standard library and the wrapper only (run by path: the agent's package, grpc and
all, is never imported).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

if __name__ == "__main__" and not __package__:  # run by path: see `_bootstrap`

    def _bootstrap() -> None:
        """Import `mesolite.agent._task_wrapper` from the tree this file is in, without
        running the agent package's ``__init__`` (which imports grpc)."""
        here = Path(__file__).absolute().parent  # .../mesolite/agent
        sys.path.insert(0, str(here.parent.parent))
        package = types.ModuleType("mesolite.agent")
        package.__path__ = [str(here)]
        sys.modules["mesolite.agent"] = package

    _bootstrap()

from mesolite.agent import _exit_log, _task_wrapper
from mesolite.agent.errors import AgentError

SOCKET_NAME = "socket"
LOG_NAME = "supervisor.log"
MAX_FRAME = 1 << 20  # bytes of JSON in one frame, either way
LAUNCH_FDS = 2  # stdout, stderr
WRAPPERS_PER_FRAME = 1000
_HEADER = struct.Struct(">I")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_READY_FD = 3  # where a wrapper finds its ready pipe
_MAX_OUTPUT = 16 << 20  # bytes queued for an agent that does not read: then it is dropped
_FIRST_CONNECTION_TIMEOUT = 30.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_ERROR_FD = 3  # where a spawned command's shim says why it could not confine it
SHELL = "/bin/sh"
SETPRIV = shutil.which("setpriv") or ""  # util-linux: the user switch of a spawned command
# Run by /bin/sh between the supervisor's posix_spawn and the task's command (started
# in the sandbox): into each of the task's cgroups ("0": the writing process), then exec
# the rest (setpriv to the task's user, then the command). It says on fd 3 that it is
# in its cgroup (its pid alone: the supervisor tells the agent the command is ready),
# or why it could not get there (its pid and why), and then ends with 127.
SHIM = (
    'while [ "$1" != -- ]; do echo 0 > "$1/cgroup.procs" || '
    '{ echo "$$ cannot join the cgroup $1" >&3; exit 127; }; shift; done; shift; '
    'echo "$$" >&3; exec "$@" 3>&-'
)
# Or, where it is built (``make``: `agent/spawn_shim.c`, next to it, git-ignored), the
# C exec helper that does what the shim and setpriv do in one exec (one exec of a
# small static program, not three). ``MESOLITE_SPAWN_SHIM`` names another helper, or
# with ``sh`` makes the supervisor use the shim and setpriv (as where it is absent).
SHIM_ENV = "MESOLITE_SPAWN_SHIM"


def exec_helper(environ: Mapping[str, str] = os.environ) -> str:
    """The C exec helper's path if it is there and executable, else ``""``."""
    named = environ.get(SHIM_ENV)
    path = named if named is not None else str(Path(__file__).absolute().parent / "spawn_shim")
    usable = named != "sh" and os.path.isfile(path) and os.access(path, os.X_OK)
    return path if usable else ""


EXEC_HELPER = exec_helper()


class FrameError(AgentError, ValueError):
    """A frame that breaks the protocol: the connection is dropped."""


def encode(message: Mapping[str, Any]) -> bytes:
    """One frame; raises FrameError if it would be larger than `MAX_FRAME`."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise FrameError(f"a frame of {len(data)} bytes is over the {MAX_FRAME} limit")
    return _HEADER.pack(len(data)) + data


class Frames:
    """Bytes from a stream, cut into decoded frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """The frames `data` completes; raises FrameError on an oversized or bad one."""
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME:
                raise FrameError(f"a frame of {size} bytes is over the {MAX_FRAME} limit")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[_HEADER.size : end])
            del self._buffer[:end]
            try:
                message = json.loads(payload)
            except ValueError as e:
                raise FrameError(f"a frame that is not JSON: {e}") from None
            if not isinstance(message, dict) or not isinstance(message.get("op"), str):
                raise FrameError("a frame that is not an object with an op")
            yield message


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end, as the kernel says."""
    _, uid, _ = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return int(uid)


def socket_address(directory_fd: int) -> str:
    """The socket's address through an open directory: short whatever the work dir's
    path (a Unix socket's path may have at most 107 bytes)."""
    return f"/proc/self/fd/{directory_fd}/{SOCKET_NAME}"


@dataclass(frozen=True, slots=True)
class Launch:
    """A launch request, checked."""

    id: int
    records: Path
    confinement: _task_wrapper.Confinement
    argv: list[str]
    env: dict[str, str]
    cwd: str

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Launch:
        """Raises FrameError if `message` is not a well-formed launch."""
        request_id, options = message.get("id"), message.get("options")
        records, argv = message.get("records"), message.get("argv")
        env, cwd = message.get("env"), message.get("cwd")
        if not isinstance(request_id, int) or not isinstance(records, str):
            raise FrameError("a launch needs an integer id and a records directory")
        if not _strings(options) or not _strings(argv) or not isinstance(cwd, str):
            raise FrameError("a launch's options and argv are lists of strings, cwd a string")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise FrameError("a launch's env maps strings to strings")
        parsed = _task_wrapper.parse_args(
            [records, "--ready-fd", str(_READY_FD), *options, "--", *argv]
        )
        if parsed is None:
            raise FrameError(f"a launch the wrapper cannot run: {options} -- {argv}")
        _, _, confinement, command = parsed
        return cls(request_id, Path(records), confinement, command, env, cwd)


@dataclass(frozen=True, slots=True)
class Spawn:
    """A spawn request, checked: the task's command itself, confined by the shim."""

    id: int
    run: str
    records: str
    cgroups: list[str]
    user: tuple[int, int, list[int]] | None
    argv: list[str]
    env: dict[str, str]
    cwd: str

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Spawn:
        """Raises FrameError if `message` is not a well-formed spawn."""
        request_id, run, records = message.get("id"), message.get("run"), message.get("records")
        cgroups, user, argv = message.get("cgroups"), message.get("user"), message.get("argv")
        env, cwd = message.get("env"), message.get("cwd")
        if not isinstance(request_id, int) or not isinstance(run, str) or not run:
            raise FrameError("a spawn needs an integer id and a run")
        if not isinstance(records, str) or not isinstance(cwd, str) or not cwd.startswith("/"):
            raise FrameError("a spawn's records and cwd are strings, cwd an absolute path")
        if not _strings(cgroups) or not cgroups or not all(c.startswith("/") for c in cgroups):
            raise FrameError("a spawn's cgroups are absolute paths, at least one")
        if "--" in cgroups:
            raise FrameError("a spawn's cgroups are absolute paths, at least one")
        if not _strings(argv) or not argv:
            raise FrameError("a spawn's argv is a list of strings, not empty")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise FrameError("a spawn's env maps strings to strings")
        switch: tuple[int, int, list[int]] | None = None
        if user is not None:
            ids = user if isinstance(user, list) else None
            if (
                ids is None
                or len(ids) != 3
                or not all(isinstance(i, int) and i >= 0 for i in ids[:2])
                or not isinstance(ids[2], list)
                or not all(isinstance(g, int) and g >= 0 for g in ids[2])
            ):
                raise FrameError("a spawn's user is [uid, gid, [groups]]")
            if not EXEC_HELPER and not SETPRIV:
                raise FrameError("this supervisor cannot switch users: no setpriv")
            switch = (ids[0], ids[1], list(ids[2]))
        return cls(request_id, run, records, list(cgroups), switch, argv, env, cwd)

    def shim_argv(self, helper: str | None = None) -> list[str]:
        """What the supervisor executes (``argv[0]``): the C exec helper (`helper`,
        `EXEC_HELPER` if None) if there is one, or the shim, its arguments, then the
        command."""
        helper = EXEC_HELPER if helper is None else helper
        if helper:
            user: list[str] = []
            if self.user is not None:
                uid, gid, groups = self.user
                user = [str(uid), str(gid), ",".join(map(str, groups))]
            return [helper, *self.cgroups, "--", *user, "--", *self.argv]
        argv = [SHELL, "-c", SHIM, "mesolite-task", *self.cgroups, "--"]
        if self.user is not None:
            uid, gid, groups = self.user
            keep = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
            argv += [SETPRIV, f"--reuid={uid}", f"--regid={gid}", keep, "--"]
        return argv + self.argv


def _strings(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass
class _Connection:
    sock: socket.socket
    frames: Frames = field(default_factory=Frames)
    fds: list[int] = field(default_factory=list)  # received, not yet handed to a launch
    output: bytearray = field(default_factory=bytearray)


class Supervisor:
    """The supervisor's loop: serve one agent at a time, fork wrappers, reap them."""

    def __init__(self, listener: socket.socket, log: Any, directory: Path) -> None:
        self._listener = listener
        self._log = log
        self._pid = os.getpid()
        self._keeper = os.getppid()
        self._children: dict[int, tuple[int, str]] = {}  # pid -> (start time, records)
        self._spawned: set[int] = set()  # those of the children that are task commands
        self._exits = _exit_log.ExitLogWriter(directory)
        # Spawned commands' shims write why they could not confine one (pid, reason).
        self._errors_read, self._errors_write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._errors_read, False)
        self._error_lines = bytearray()
        self._errors: dict[int, str] = {}
        self._agent: _Connection | None = None
        self._served = False
        self._selector = selectors.DefaultSelector()
        self._devnull = os.open(os.devnull, os.O_RDWR)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._wakeup_read, self._wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Wrappers write to it (blocking: a full pipe makes them wait, never lose a line).
        self._ready_read, self._ready_write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._ready_read, False)
        self._ready_lines = bytearray()

    def say(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(f"{stamp} supervisor {self._pid}: {message}", file=self._log, flush=True)

    def run(self) -> None:
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self._wakeup_write)
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wakeup_read, selectors.EVENT_READ, "reap")
        self._selector.register(self._ready_read, selectors.EVENT_READ, "ready")
        self._selector.register(self._errors_read, selectors.EVENT_READ, "shims")
        started = time.monotonic()
        self.say(f"started; spawns through {EXEC_HELPER or 'the /bin/sh shim and setpriv'}")
        gc.freeze()  # what is here now stays shared with the wrappers forked from it
        while True:
            idle = self._agent is None and not self._children
            if idle and (self._served or time.monotonic() - started > _FIRST_CONNECTION_TIMEOUT):
                break
            for key, events in self._selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "reap":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wakeup_read, 4096):
                            pass
                elif key.data == "ready":
                    self._read_ready()
                elif key.data == "shims":
                    self._read_errors()
                elif (
                    self._agent is not None
                    and key.fileobj is self._agent.sock
                    and events & selectors.EVENT_READ
                ):
                    self._receive()
            self._reap()
            # What the agent is about to hear of is in the exit log first: the ends
            # fsynced (one fsync for all of them), the "spawned" lines written.
            self._exits.commit()
            self._flush()
        self.say("no agent and no task left: exiting")

    # Connections.

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        uid = peer_uid(sock)
        if uid != os.geteuid():
            self.say(f"refused a connection from uid {uid}: only uid {os.geteuid()} is served")
            sock.close()
            return
        if self._agent is not None:
            # The last agent's requests are carried out before the new one hears which
            # wrappers exist: a SIGKILLed agent may have left a launch in the socket.
            self._agent.sock.setblocking(False)
            while self._agent is not None and self._receive():
                pass
            self._drop("replaced by a new connection")
        sock.setblocking(False)
        self._agent = _Connection(sock)
        self._served = True
        self._selector.register(sock, selectors.EVENT_READ, "agent")
        self.say(f"agent connected ({len(self._children)} wrappers running)")
        wrappers = [
            {"pid": pid, "start_time": start_time, "records": records}
            for pid, (start_time, records) in self._children.items()
        ]
        for i in range(0, len(wrappers), WRAPPERS_PER_FRAME):
            self._send({"op": "wrappers", "wrappers": wrappers[i : i + WRAPPERS_PER_FRAME]})
        self._send(
            {
                "op": "hello",
                "pid": self._pid,
                "keeper": self._keeper,
                "spawn": bool(EXEC_HELPER or SETPRIV),
                "shim": EXEC_HELPER or "sh",
            }
        )

    def _drop(self, why: str) -> None:
        agent, self._agent = self._agent, None
        if agent is None:
            return
        self.say(f"agent connection closed: {why}")
        self._selector.unregister(agent.sock)
        agent.sock.close()
        for fd in agent.fds:
            os.close(fd)

    def _receive(self) -> bool:
        """Read what the agent sent and carry it out; False once nothing more came."""
        agent = self._agent
        assert agent is not None
        try:
            data, ancillary, _, _ = agent.sock.recvmsg(1 << 16, socket.CMSG_SPACE(LAUNCH_FDS * 4))
        except BlockingIOError:
            return False
        except OSError as e:
            self._drop(str(e))
            return False
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds = struct.unpack(f"{usable // 4}i", payload[:usable])
                for fd in fds:  # never inherited by what posix_spawn starts
                    os.set_inheritable(fd, False)
                agent.fds.extend(fds)
        if not data:
            self._drop("end of stream")
            return False
        try:
            for message in agent.frames.feed(data):
                if message["op"] == "launch":
                    self._launch(agent, message)
                elif message["op"] == "spawn":
                    self._spawn(agent, message)
                else:
                    raise FrameError(f"unknown op {message['op']!r}")
            if len(agent.fds) > LAUNCH_FDS:
                raise FrameError("file descriptors without a launch")
        except FrameError as e:
            self._drop(f"protocol error: {e}")
            return False
        return True

    def _send(self, message: Mapping[str, Any]) -> None:
        agent = self._agent
        if agent is None:
            return
        agent.output += encode(message)  # sent at the end of the loop's turn
        if len(agent.output) > _MAX_OUTPUT:
            self._drop("it does not read what it is sent")

    def _flush(self) -> None:
        agent = self._agent
        if agent is None or not agent.output:
            return
        try:
            sent = agent.sock.send(agent.output)
        except BlockingIOError:
            return
        except OSError as e:
            self._drop(str(e))
            return
        del agent.output[:sent]
        # Told when it can take more only while something waits to be sent.
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if agent.output else 0)
        self._selector.modify(agent.sock, events, "agent")

    # Wrappers.

    def _launch(self, agent: _Connection, message: Mapping[str, Any]) -> None:
        if len(agent.fds) < LAUNCH_FDS:
            raise FrameError(f"a launch needs {LAUNCH_FDS} file descriptors")
        fds, agent.fds = agent.fds[:LAUNCH_FDS], agent.fds[LAUNCH_FDS:]
        try:
            launch = Launch.parse(message)
            pid = os.fork()
            if pid == 0:
                self._become_wrapper(launch, fds)  # never returns
        except (FrameError, OSError) as e:
            if isinstance(e, FrameError) and not isinstance(message.get("id"), int):
                raise  # not even a request to answer
            self._send({"op": "spawned", "id": message["id"], "error": str(e)})
            return
        finally:
            for fd in fds:
                os.close(fd)
        # Not reaped yet, so the pid is still this child's: its start time names it.
        start_time = _task_wrapper.start_time_of(pid)
        self._children[pid] = (start_time, str(launch.records))
        self._send({"op": "spawned", "id": launch.id, "pid": pid, "start_time": start_time})

    def _spawn(self, agent: _Connection, message: Mapping[str, Any]) -> None:
        """Start a task's command itself (posix_spawn: a vfork, cheap from here), in a
        new session, through the shim that confines it (`SHIM`)."""
        if len(agent.fds) < LAUNCH_FDS:
            raise FrameError(f"a spawn needs {LAUNCH_FDS} file descriptors")
        fds, agent.fds = agent.fds[:LAUNCH_FDS], agent.fds[LAUNCH_FDS:]
        try:
            spawn = Spawn.parse(message)
            stdout, stderr = fds
            # posix_spawn has no chdir here: the supervisor (one thread) steps into the
            # sandbox for the spawn, and out again so as not to hold it.
            os.chdir(spawn.cwd)
            argv = spawn.shim_argv()
            pid = os.posix_spawn(
                argv[0],
                argv,
                spawn.env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, self._devnull, 0),
                    (os.POSIX_SPAWN_DUP2, stdout, 1),
                    (os.POSIX_SPAWN_DUP2, stderr, 2),
                    (os.POSIX_SPAWN_DUP2, self._errors_write, _ERROR_FD),
                ],
                setsid=True,
                # As subprocess does: what Python ignores (SIGPIPE, SIGXFSZ), a command
                # must not inherit ignored.
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except (FrameError, OSError) as e:
            if isinstance(e, FrameError) and not isinstance(message.get("id"), int):
                raise  # not even a request to answer
            self._send({"op": "spawned", "id": message["id"], "error": str(e)})
            return
        finally:
            os.chdir("/")
            for fd in fds:
                os.close(fd)
        start_time = _task_wrapper.start_time_of(pid)  # not reaped yet: still this child
        self._children[pid] = (start_time, spawn.records)
        self._spawned.add(pid)
        self._exits.add(
            {
                "op": "spawned",
                "run": spawn.run,
                "records": spawn.records,
                "pid": pid,
                "start_time": start_time,
            },
            durable=False,
        )
        self._send({"op": "spawned", "id": spawn.id, "pid": pid, "start_time": start_time})

    def _read_errors(self) -> None:
        """What spawned commands' shims said: "PID" (in its cgroup: ready, told to the
        agent) or "PID REASON" (it could not be confined, told when it is reaped)."""
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._errors_read, 1 << 16):
                self._error_lines += data
        *lines, rest = self._error_lines.split(b"\n")
        self._error_lines = bytearray(rest)
        for line in lines:
            pid, _, why = line.decode(errors="replace").partition(" ")
            if not pid.isdigit():
                self.say(f"ignored a line from a shim that is not a pid: {line!r}")
            elif why:
                self._errors[int(pid)] = why
            else:
                self._send({"op": "ready", "pid": int(pid), "command": int(pid)})

    def _become_wrapper(self, launch: Launch, fds: list[int]) -> None:
        """In the forked child: set up as the agent used to start the wrapper, and run it."""
        code = 127
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # Until its pid is on disk, a wrapper must not outlive the supervisor.
            self._libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != self._pid:
                os._exit(code)
            os.setsid()
            stdout, stderr = fds
            os.dup2(self._devnull, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            os.dup2(self._ready_write, _READY_FD)
            os.closerange(_READY_FD + 1, os.sysconf("SC_OPEN_MAX"))
            os.chdir(launch.cwd)
            code = _task_wrapper.run(
                launch.records,
                launch.argv,
                _READY_FD,
                launch.confinement,
                env=launch.env,
                recorded=lambda: self._libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0),
            )
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.write(2, f"mesolite task wrapper: {e}\n".encode())
        finally:
            os._exit(code)

    def _read_ready(self) -> None:
        """Tell of the wrappers whose commands run: lines of "COMMAND WRAPPER" pids."""
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._ready_read, 1 << 16):
                self._ready_lines += data
        *lines, rest = self._ready_lines.split(b"\n")
        self._ready_lines = bytearray(rest)
        for line in lines:
            try:
                command, wrapper = (int(field) for field in line.split())
            except ValueError:
                self.say(f"ignored a ready line that is not two pids: {line!r}")
                continue
            self._send({"op": "ready", "pid": wrapper, "command": command})

    def _reap(self) -> None:
        reaped: list[tuple[int, int | None, int]] = []  # pid, start time, wait status
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            start_time, _ = self._children.pop(pid, (None, ""))
            reaped.append((pid, start_time, status))
        if not reaped:
            return
        # A wrapper said it was ready before it ended: that comes first.
        self._read_ready()
        self._read_errors()
        messages: list[dict[str, Any]] = []
        for pid, start_time, status in reaped:
            message: dict[str, Any] = {
                "op": "exited",
                "pid": pid,
                "start_time": start_time,
                "status": status,
            }
            messages.append(message)
            if pid not in self._spawned:
                continue  # a wrapper: it wrote its command's end itself
            self._spawned.discard(pid)
            error = self._errors.pop(pid, None)
            if error is not None:
                message["error"] = error
                record = _exit_log.error_record(pid, start_time, error)
            else:
                record = _exit_log.exit_record(pid, start_time, status)
            # Group commit: every line of this turn goes in one write, with one fsync,
            # at the end of the turn (`run`), before anything queued is sent.
            self._exits.add(record, durable=True)
        for message in messages:
            self._send(message)


def serve(directory: Path, cgroups: list[Path]) -> int:
    """Bind the socket, then detach: the process that started returns (0) once the
    socket takes connections, and a child in a new session serves it."""
    os.umask(0o077)
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    address = socket_address(directory_fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # a dead supervisor's; the agent starts one only if none answers
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen(64)
    os.close(directory_fd)
    log = open(directory / LOG_NAME, "a")  # noqa: SIM115 - the supervisor's whole life
    for cgroup in cgroups:  # before the fork: the child is born in it
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    if os.fork() != 0:
        return 0  # the agent waits for this: the socket is ready
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.close(devnull)
    # This process stays as the keeper, the subreaper of what the supervisor (its
    # child) spawns: if the supervisor dies, its commands become the keeper's, and
    # their ends still reach the exit log.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    server = os.fork()
    if server == 0:
        code = 0
        try:
            Supervisor(listener, log, directory).run()
        except BaseException:
            traceback.print_exc(file=log)
            log.flush()
            code = 1
        finally:
            os._exit(code)
    listener.close()
    try:
        keep(server, directory, log)
    finally:
        os._exit(0)


def keep(server: int, directory: Path, log: Any) -> None:
    """The keeper: reap the supervisor when it ends and, from then on, the commands it
    left (reparented to this subreaper), writing each one's end to the exit log; exit
    once no child is left. While the supervisor lives it reaps its own children: what
    reaches the keeper then is only what tasks orphaned (their cgroups end those)."""
    writer: _exit_log.ExitLogWriter | None = None
    server_alive = True
    while True:
        try:
            # Not reaped yet (WNOWAIT): its start time can still be read.
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if info is None:
            continue
        pid = info.si_pid
        try:
            start_time: int | None = _task_wrapper.start_time_of(pid)
        except (OSError, ValueError, IndexError):
            start_time = None
        _, status = os.waitpid(pid, 0)
        if pid == server:
            server_alive = False
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            print(
                f"{stamp} supervisor keeper {os.getpid()}: the supervisor ended "
                f"(wait status {status}); recording the ends of what it left",
                file=log,
                flush=True,
            )
            continue
        if server_alive:
            continue
        if writer is None:
            writer = _exit_log.ExitLogWriter(directory)
        writer.add(_exit_log.exit_record(pid, start_time, status), durable=True)
        writer.commit()


def main(args: list[str]) -> int:
    usage = "usage: python -I _supervisor.py DIR [--cgroup CGROUP_DIR]..."
    if not args or args[0].startswith("-") or len(args) % 2 != 1:
        print(usage, file=sys.stderr)
        return 2
    pairs = list(zip(args[1::2], args[2::2], strict=True))
    if any(option != "--cgroup" for option, _ in pairs):
        print(usage, file=sys.stderr)
        return 2
    try:
        return serve(Path(args[0]), [Path(value) for _, value in pairs])
    except OSError as e:
        print(f"mesolite supervisor: cannot start: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
