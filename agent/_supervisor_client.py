"""The agent's end of the supervisor's socket (`agent/_supervisor.py`): start the
supervisor or find the one a previous agent left, ask it to fork wrappers, hear
them end.

`SupervisorClient.launch` returns the new wrapper (`Spawned`): its pid and start
time, `ready`, which resolves with its command's pid once the command runs (None if
it could not start; `SupervisorGone` if the supervisor went away before it told),
and `exited`, which resolves with the wrapper's wait status when the supervisor reaps
it, or with None if the supervisor went away first (the wrapper lives on: wait for it
with a pidfd, as for any process the agent did not start).
`SupervisorClient.spawn` has the supervisor start a task's command itself (no
wrapper: see `agent/_supervisor.py`); its `Spawned` is the command, `ready` at once,
and `exited` resolves with its wait status once that is in the exit log
(`agent/_exit_log.py`), with why it could not be confined (a string), or with None
if the supervisor went away first (its keeper then writes the end to the log).
A supervisor that went away is replaced by a new one at the next launch. Nothing
here is durable: how a task ended is in its ``exit.json``.

Runs on the event loop; the socket is non-blocking and read by a reader callback.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from mesolite.agent import _supervisor
from mesolite.agent._procs import is_alive, process_start_time, wait_for_exit
from mesolite.agent.errors import AgentError

log = structlog.get_logger("mesolite.agent.supervisor")

_PROGRAM = Path(_supervisor.__file__).absolute()
_HELLO_TIMEOUT = 30.0
_STOP_TIMEOUT = 10.0
_READ_SIZE = 1 << 18
DIRECTORY_MODE = 0o700


class SupervisorGone(AgentError):
    """The supervisor went away (or could not be reached) before it answered."""


class LaunchRefused(AgentError):
    """The supervisor could not fork the wrapper; the message says why."""


@dataclass(frozen=True, slots=True)
class Spawned:
    """A wrapper the supervisor forked: its pid and, with it, its start time; what it
    will say (see the module docstring)."""

    pid: int
    start_time: int
    ready: asyncio.Future[int | None]
    exited: asyncio.Future[int | str | None]


@dataclass
class _Connection:
    sock: socket.socket
    frames: _supervisor.Frames = field(default_factory=_supervisor.Frames)
    output: list[tuple[bytes, Sequence[int]]] = field(default_factory=list)
    hello: asyncio.Future[tuple[int, int | None, bool]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    launches: dict[int, asyncio.Future[Spawned]] = field(default_factory=dict)
    readies: dict[int, asyncio.Future[int | None]] = field(default_factory=dict)
    exits: dict[int, asyncio.Future[int | str | None]] = field(default_factory=dict)
    shim: str = "sh"  # what the supervisor spawns through (its hello): a C helper's path


class SupervisorClient:
    """The agent's connection to its supervisor, in `directory` (the agent's, 0700).

    `cgroup` gives the directories of the cgroup a new supervisor joins (none: it
    stays where the agent is). Blocking; called off the loop.
    """

    def __init__(self, directory: Path, cgroup: Callable[[], list[Path]] = list) -> None:
        self.directory = directory
        self._cgroup = cgroup
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        self.pid: int | None = None
        self._start_time: int | None = None
        self.can_spawn = False  # whether the supervisor reached can `spawn` (setpriv)
        self._keeper: tuple[int, int] | None = None  # pid, start time
        # records directory -> (pid, start time) of the wrappers it said it runs
        self._wrappers: dict[str, tuple[int, int]] = {}

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def wrapper_of(self, records: Path) -> tuple[int, int] | None:
        """(pid, start time) of the wrapper of the task run in `records`, as the
        supervisor listed them when this agent connected."""
        return self._wrappers.get(str(records))

    async def connect(self, *, start: bool = True) -> bool:
        """Connect to the supervisor, starting one (if `start`) where none answers.
        False if there is none and `start` is False. Raises AgentError if one cannot
        be started."""
        async with self._lock:
            if self._connection is not None:
                return True
            try:
                await self._open()
                return True
            except (FileNotFoundError, ConnectionRefusedError, SupervisorGone) as e:
                if not start:
                    return False
                log.info("starting a supervisor", directory=str(self.directory), why=str(e))
            await self._start()
            try:
                await self._open()
            except (OSError, SupervisorGone) as e:
                raise AgentError(f"the supervisor started but does not answer: {e}") from e
            return True

    async def launch(
        self,
        *,
        records: Path,
        options: list[str],
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        fds: tuple[int, int],
    ) -> Spawned:
        """Fork a wrapper for one task run. `fds`: its stdout and its stderr (they stay
        the caller's to close). Raises
        `SupervisorGone` (the wrapper may or may not exist: see `agent/_task_process.py`),
        `LaunchRefused`, or AgentError if no supervisor can be started."""
        return await self._request(
            {
                "op": "launch",
                "records": str(records),
                "options": options,
                "argv": argv,
                "env": dict(env),
                "cwd": str(cwd),
            },
            fds,
        )

    async def spawn(
        self,
        *,
        records: Path,
        run: str,
        cgroups: list[Path],
        user: tuple[int, int, list[int]] | None,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        fds: tuple[int, int],
    ) -> Spawned:
        """Have the supervisor start a task's command itself, in its cgroups (at least
        one), as `user` (uid, gid, groups; None: the supervisor's). Raises as `launch`."""
        return await self._request(
            {
                "op": "spawn",
                "run": run,
                "records": str(records),
                "cgroups": [str(c) for c in cgroups],
                "user": [user[0], user[1], list(user[2])] if user is not None else None,
                "argv": argv,
                "env": dict(env),
                "cwd": str(cwd),
            },
            fds,
        )

    async def _request(self, request: dict[str, Any], fds: tuple[int, int]) -> Spawned:
        """Send one launch or spawn request with its descriptors; the supervisor's
        answer (matched by the id given here) resolves it."""
        await self.connect()
        connection = self._connection
        if connection is None:
            raise SupervisorGone("the supervisor went away as it was reached")
        self._next_id += 1
        request_id = self._next_id
        frame = _supervisor.encode({**request, "id": request_id})
        spawned: asyncio.Future[Spawned] = asyncio.get_running_loop().create_future()
        connection.launches[request_id] = spawned
        self._send(connection, frame, fds)
        return await spawned

    async def wait_gone(self, *, keeper: bool = False) -> None:
        """Wait (bounded) until the supervisor this client last reached has exited (and,
        with `keeper`, its keeper, which exits once nothing is left to reap)."""
        pid, start_time = self.pid, self._start_time
        if pid is None or start_time is None:
            return
        try:
            async with asyncio.timeout(_STOP_TIMEOUT):
                await wait_for_exit(pid, start_time)
                if keeper and self._keeper is not None:
                    await wait_for_exit(*self._keeper)
        except TimeoutError:
            log.warning("the supervisor did not exit", pid=pid)

    async def stop(self) -> None:
        """Close the connection and wait (bounded) for the supervisor to exit, which it
        does once no wrapper is left."""
        async with self._lock:
            self._lost("the agent closed the connection", warn=False)
            await self.wait_gone(keeper=True)

    # Internals.

    async def _start(self) -> None:
        directory = self.directory
        await asyncio.to_thread(_make_directory, directory)
        cgroup = await asyncio.to_thread(self._cgroup)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            str(_PROGRAM),
            str(directory),
            *(arg for path in cgroup for arg in ("--cgroup", str(path))),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await process.communicate()
        if process.returncode != 0:
            raise AgentError(
                f"could not start the supervisor (exit status {process.returncode}): "
                f"{stderr.decode(errors='replace').strip()}"
            )

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                await loop.sock_connect(sock, _supervisor.socket_address(directory_fd))
            finally:
                os.close(directory_fd)
            uid = _supervisor.peer_uid(sock)
            if uid != os.geteuid():
                raise SupervisorGone(f"the socket's server runs as uid {uid}, not as the agent")
        except BaseException:
            sock.close()
            raise
        connection = _Connection(sock)
        self._wrappers = {}
        self._connection = connection
        loop.add_reader(sock, self._on_readable, connection)
        try:
            async with asyncio.timeout(_HELLO_TIMEOUT):
                pid, keeper, self.can_spawn = await connection.hello
        except TimeoutError:
            self._lost("no hello from the supervisor")
            raise SupervisorGone("the supervisor did not answer") from None
        self.pid, self._start_time = pid, process_start_time(pid)
        # The keeper (the supervisor's parent) outlives it by a moment: waited for too.
        keeper_start = process_start_time(keeper) if keeper is not None else None
        self._keeper = (keeper, keeper_start) if keeper is not None and keeper_start else None
        log.info(
            "connected to the supervisor",
            pid=pid,
            wrappers=len(self._wrappers),
            shim=connection.shim,
        )

    def _send(self, connection: _Connection, frame: bytes, fds: Sequence[int]) -> None:
        connection.output.append((frame, fds))
        if len(connection.output) == 1:
            self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        while connection.output:
            data, fds = connection.output[0]
            ancillary = (
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            )
            try:
                sent = connection.sock.sendmsg([data], ancillary)
            except BlockingIOError:
                sent = 0
            except OSError as e:
                self._lost(f"cannot write to the supervisor: {e}")
                return
            if sent < len(data):
                # The descriptors went with the first byte; the rest goes without them.
                connection.output[0] = (data[sent:], () if sent else fds)
                loop.add_writer(connection.sock, self._flush, connection)
                return
            connection.output.pop(0)
        loop.remove_writer(connection.sock)

    def _on_readable(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(_READ_SIZE)
        except BlockingIOError:
            return
        except OSError as e:
            self._lost(f"cannot read from the supervisor: {e}")
            return
        if not data:
            self._lost("the supervisor closed the connection")
            return
        try:
            for message in connection.frames.feed(data):
                self._dispatch(connection, message)
        except (_supervisor.FrameError, KeyError, TypeError, ValueError) as e:
            self._lost(f"the supervisor broke the protocol: {e}")

    def _dispatch(self, connection: _Connection, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "spawned":
            future = connection.launches.pop(int(message["id"]))
            if "error" in message:
                if not future.done():  # done: its launch was cancelled
                    future.set_exception(LaunchRefused(str(message["error"])))
                return
            # Before anything else is read: the wrapper's news may be in the same read.
            loop = asyncio.get_running_loop()
            spawned = Spawned(
                _int(message["pid"]),
                _int(message["start_time"]),
                loop.create_future(),
                loop.create_future(),
            )
            connection.readies[spawned.pid] = spawned.ready
            connection.exits[spawned.pid] = spawned.exited
            if not future.done():
                future.set_result(spawned)
        elif op == "ready":
            ready = connection.readies.pop(_int(message["pid"]), None)
            if ready is not None and not ready.done():
                ready.set_result(_int(message["command"]))
        elif op == "exited":
            pid = _int(message["pid"])
            ready = connection.readies.pop(pid, None)
            if ready is not None and not ready.done():
                ready.set_result(None)  # it ended without its command starting
            exited = connection.exits.pop(pid, None)
            if exited is not None and not exited.done():
                error = message.get("error")
                exited.set_result(str(error) if error is not None else _int(message["status"]))
        elif op == "wrappers":
            for wrapper in message["wrappers"]:
                pid, start_time = _int(wrapper["pid"]), _int(wrapper["start_time"])
                self._wrappers[str(wrapper["records"])] = (pid, start_time)
        elif op == "hello":
            if not connection.hello.done():
                keeper, shim = message.get("keeper"), message.get("shim")
                connection.shim = shim if isinstance(shim, str) else "sh"
                connection.hello.set_result(
                    (
                        _int(message["pid"]),
                        keeper if isinstance(keeper, int) and keeper > 1 else None,
                        message.get("spawn") is True,
                    )
                )
        else:
            raise ValueError(f"unknown op {op!r}")

    def _lost(self, why: str, *, warn: bool = True) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if warn:
            log.warning("lost the supervisor: running tasks are watched by pid", why=why)
            # A supervisor this agent cannot talk to is ended, so that its death settles
            # what becomes of a wrapper it was forking (see `agent/_supervisor.py`).
            pid, start_time = self.pid, self._start_time
            if pid is not None and start_time is not None and is_alive(pid, start_time):
                log.warning("killing the supervisor it cannot talk to", pid=pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        loop.remove_reader(connection.sock)
        loop.remove_writer(connection.sock)
        connection.sock.close()
        gone = SupervisorGone(why)
        for launch in connection.launches.values():
            if not launch.done():
                launch.set_exception(gone)
        for ready in connection.readies.values():
            if not ready.done():
                ready.set_exception(gone)
                ready.exception()  # retrieved: its launch may have been cancelled
        for exited in connection.exits.values():
            if not exited.done():
                exited.set_result(None)
        if not connection.hello.done():
            connection.hello.set_exception(gone)
            connection.hello.exception()  # retrieved: `_open` may not be waiting any more


def _make_directory(directory: Path) -> None:
    directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    os.chmod(directory, DIRECTORY_MODE)


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


__all__ = ["LaunchRefused", "Spawned", "SupervisorClient", "SupervisorGone"]
