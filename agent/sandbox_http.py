"""Task sandboxes over HTTP, read-only: what the master's web UI shows as a task's output.

    GET /sandbox/{framework_id}/{task_id}/{stdout|stderr}?offset=&length=

returns bytes of `<work_dir>/sandboxes/<framework_id>/<task_id>/<file>` (the layout
of `agent.tasks`) as text/plain. Without `offset` it returns the last `length`
bytes (default 64 KiB); `length` is capped at 1 MiB. Two headers say where the
bytes are: `X-Sandbox-Offset` (of the first byte returned) and `X-Sandbox-Size`
(of the whole file), so a reader can page or follow a growing file.

Nothing else is served. Ids must be plain path segments (no `/`, not `.` or
`..`); the directories below the sandboxes directory are opened without
following links, and the file must be a regular file with a single link, opened
without following a link and checked again once open (`read_chunk`): a task can
replace its own `stdout` with a symbolic or hard link, or swap it mid-read; it
must not get to show the agent's other files. Unknown sandboxes and files, and
files refused, are 404. Files are read in a worker thread.

The protocol's shared pieces are in `mesolite/sandbox_protocol.py`. The agent
registers the address of this server with the master (`AgentConfig(...,
address=server.address)`); the master proxies the UI's requests to it.

With `tls` the server speaks HTTPS with the agent's certificate, requires a client
certificate from the cluster's CA, and answers only the principals in `readers`
(default: `master`, the CN of the master's certificate); anyone else gets 403, so the
master's own access checks cannot be bypassed by asking the agent directly. Without TLS
it listens only on loopback unless `insecure` (`mesolite.tls.check_listen`).

    async with SandboxServer(work_dir, host="127.0.0.1", port=0) as sandboxes:
        agent = Agent(AgentConfig(master, resources, work_dir, address=sandboxes.address))
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from mesolite import http_serving
from mesolite.http_hosts import AllowedHosts, host_check
from mesolite.sandbox_protocol import (
    FILES,
    OFFSET_HEADER,
    SIZE_HEADER,
    BadRequest,
    check_segment,
    format_address,
    parse_range,
)
from mesolite.tls import TlsConfig, check_listen, peer_principal

log = structlog.get_logger(__name__)

_SANDBOXES_KEY = web.AppKey("sandboxes", Path)
MASTER_PRINCIPAL = "master"


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    offset: int  # of data[0] in the file
    size: int  # of the whole file


def read_chunk(
    sandboxes: Path, framework_id: str, task_id: str, name: str, offset: int | None, length: int
) -> Chunk | None:
    """Blocking: bytes of one sandbox file, or None if there is no such file to serve.

    Every step is taken from an open directory, never by path: the framework's and
    the task's directories are opened without following links, then the file is
    checked (`lstat`: a regular file with one link), opened without following a
    link, and checked again on the open descriptor, which must be the same file;
    the bytes are read from that descriptor only. So a task cannot make this read
    anything but its own output: not by a symbolic link, not by a hard link to
    another file (`ln /etc/hostname stderr`), not by swapping the file between the
    checks and the read.
    """
    try:
        parts = (check_segment("framework id", framework_id), check_segment("task id", task_id))
    except BadRequest:
        return None
    if name not in FILES:
        return None
    opened: list[int] = []
    try:
        opened.append(os.open(sandboxes, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for part in parts:
            opened.append(os.open(part, _DIRECTORY, dir_fd=opened[-1]))
        return _read_file(opened[-1], name, offset, length)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
            return None
        raise
    finally:
        for fd in opened:
            os.close(fd)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _servable(info: os.stat_result) -> bool:
    """A regular file with no other name (a hard link could be any file of the agent's)."""
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def _read_file(directory: int, name: str, offset: int | None, length: int) -> Chunk | None:
    expected = os.stat(name, dir_fd=directory, follow_symlinks=False)
    if not _servable(expected):
        return None
    fd = os.open(name, _FILE, dir_fd=directory)
    try:
        info = os.fstat(fd)
        same = (info.st_dev, info.st_ino) == (expected.st_dev, expected.st_ino)
        if not same or not _servable(info):
            return None  # swapped between the check and the open
        size = info.st_size
        start = max(size - length, 0) if offset is None else min(offset, size)
        return Chunk(os.pread(fd, length, start), start, size)
    finally:
        os.close(fd)


async def _read(request: web.Request) -> web.Response:
    info = request.match_info
    try:
        framework_id = check_segment("framework id", info["framework_id"])
        task_id = check_segment("task id", info["task_id"])
        offset, length = parse_range(request.query.get("offset"), request.query.get("length"))
    except BadRequest as e:
        raise web.HTTPBadRequest(text=str(e)) from None
    chunk = await asyncio.to_thread(
        read_chunk, request.app[_SANDBOXES_KEY], framework_id, task_id, info["file"], offset, length
    )
    if chunk is None:
        raise web.HTTPNotFound(text=f"no {info['file']} in a sandbox of task {task_id!r}")
    return web.Response(
        body=chunk.data,
        content_type="text/plain",
        charset="utf-8",
        headers={
            OFFSET_HEADER: str(chunk.offset),
            SIZE_HEADER: str(chunk.size),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _only(readers: Collection[str]) -> Middleware:
    @web.middleware
    async def check_reader(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        principal = peer_principal(request.transport)
        if principal not in readers:
            log.info("sandbox read refused", principal=principal, path=request.path[:200])
            raise web.HTTPForbidden(text="only the master reads sandboxes here")
        return await handler(request)

    return check_reader


def create_sandbox_app(
    work_dir: str | os.PathLike[str],
    allowed_hosts: AllowedHosts | None = None,
    readers: Collection[str] | None = None,
) -> web.Application:
    """The sandbox server's app; it answers only Host headers `allowed_hosts` allows
    (default: the local names only; `mesolite/http_hosts.py`) and, with `readers`, only
    those principals (verified client certificates)."""
    middlewares = [host_check(allowed_hosts or AllowedHosts())]
    if readers is not None:
        middlewares.append(_only(frozenset(readers)))
    app = web.Application(middlewares=middlewares)
    app[_SANDBOXES_KEY] = Path(work_dir).absolute() / "sandboxes"
    app.router.add_get(r"/sandbox/{framework_id}/{task_id}/{file:stdout|stderr}", _read)
    return app


def host_towards(master: str) -> str:
    """The local IP address this machine uses to reach `master` (HOST:PORT).

    A UDP socket's connect() only picks a route; nothing is sent. Binding the
    sandbox server there makes it reachable by the master without listening on
    every interface; for a master on 127.0.0.1 it is 127.0.0.1.
    """
    host, _, port = master.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        family = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or 9)))
            local: str = s.getsockname()[0]
            return local
    except (OSError, ValueError):
        return "127.0.0.1"


class SandboxServer:
    """The sandbox HTTP server of one agent. `address` (HOST:PORT) is what to register.

    `advertise_host` is the host put in `address`; by default the host listened
    on, or this machine's hostname when that is a wildcard address. It answers
    requests for `allowed_hosts`, the host it listens on, the address a request
    arrived at and the local names (`mesolite.http_hosts.AllowedHosts`).
    """

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        advertise_host: str | None = None,
        allowed_hosts: Iterable[str] = (),
        tls: TlsConfig | None = None,
        readers: Collection[str] = (MASTER_PRINCIPAL,),
        insecure: bool = False,
        limits: http_serving.ConnectionLimits | None = None,
    ) -> None:
        self._work_dir = work_dir
        self._allowed = AllowedHosts([*allowed_hosts, *filter(None, [advertise_host])], host)
        self._host = host
        self._port = port
        self._advertise = advertise_host
        self._tls = tls
        self._readers = frozenset(readers)
        self._insecure = insecure
        self._limits = limits or http_serving.ConnectionLimits()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def address(self) -> str:
        host = self._advertise or self._host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        return format_address(host, self.port)

    async def start(self) -> None:
        tls = self._tls
        check_listen("task sandboxes", self._host, tls=tls is not None, insecure=self._insecure)
        ssl_context = tls.server_context(require_client_cert=True) if tls else None
        app = create_sandbox_app(self._work_dir, self._allowed, self._readers if tls else None)
        limits = self._limits.fitted(http_serving.descriptor_limit())
        self._runner = http_serving.runner(app, limits, shutdown_timeout=1.0)
        await self._runner.setup()
        site = http_serving.LimitedSite(
            self._runner,
            self._host,
            self._port,
            limits=limits,
            ssl_context=ssl_context,
            label="sandboxes",
        )
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        self.port = site.port
        log.info("sandbox server started", address=self.address, tls=tls is not None)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> SandboxServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
