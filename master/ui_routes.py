"""The master's web UI: the page, live updates by server-sent events, and task output.

    GET /          the page (master/ui/index.html); its script and style under /ui/
    GET /events    text/event-stream of `state` events: the GET /state document
                   (`ClusterSnapshot`, recently ended tasks included), sent when
                   the client connects and then whenever the cluster changes
    GET /agents/{agent_id}/sandbox/{framework_id}/{task_id}/{stdout|stderr}?offset=&length=
                   a task's output, read from the agent's sandbox server: at the IP
                   address the agent connects from and the port it registered,
                   in a URL built from checked parts (`mesolite/sandbox_protocol.py`)

Events are bounded. One `StateBroadcaster` per app renders the snapshot every
`interval` seconds (0.5), and only while someone listens (and once more for
each page that connects); a new version is published only when the snapshot
differs from the last one, clocks excluded. Each stream sends the newest version
it has not sent, so a slow client skips versions instead of queueing them. The
snapshot is built on the loop, once per tick, and encoded in a worker thread (it
is immutable). An idle stream gets a comment every `heartbeat` seconds (15). A
stream ends when its client goes (checked every second) or when the app shuts
down: `on_shutdown` wakes every stream, so stopping the master never waits on an
open page.

Streams are limited (`StreamLimits`), so no client can lock the page out for the
others: at most `total` at once (then 503) and `per_client` per client (then
429), a client being its principal when the guard found one
(`master.http_access.principal`), else its IP address. A write that the client
does not take within `write_timeout` ends its stream (a client that stopped
reading), and every stream ends after `max_age`; a browser's EventSource
reconnects on its own after the `retry` the stream announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from mesolite.logs import clip
from mesolite.master.acl import Action
from mesolite.master.http_access import Route, principal
from mesolite.master.snapshot_document import encode_json
from mesolite.sandbox_protocol import (
    OFFSET_HEADER,
    SIZE_HEADER,
    BadRequest,
    parse_address,
    parse_range,
    sandbox_url,
)
from mesolite.snapshot import AgentSnapshot, ClusterSnapshot

log = structlog.get_logger(__name__)

UI_DIR = Path(__file__).resolve().parent / "ui"

Snapshot = Callable[[], ClusterSnapshot]  # the cluster now (master.read_model.build_snapshot)
AgentLookup = Callable[[str], AgentSnapshot | None]  # one agent now, None if unknown

# The page loads only its own files and talks only to this server.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def encode_event(snapshot: ClusterSnapshot) -> tuple[bytes, bytes]:
    """The SSE message for `snapshot`, and a fingerprint that ignores the clocks in it
    (blocking: in a worker thread, encoded in pieces as GET /state is)."""
    state = snapshot.to_json()
    steady = {
        **state,
        "time": None,
        "agents": [{**a, "seconds_since_heartbeat": None} for a in state["agents"]],
    }
    fingerprint = hashlib.blake2b(encode_json(steady), digest_size=16).digest()
    return b"event: state\ndata: " + encode_json(state) + b"\n\n", fingerprint


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How many /events streams, for how long (see the module docstring)."""

    total: int = 64
    per_client: int = 4
    write_timeout: float = 10.0  # seconds a client may take to accept one event
    max_age: float = 600.0  # seconds, then the stream ends and the browser reconnects
    retry_after: int = 10  # seconds, told to a client that was refused


def client_of(request: web.Request) -> str:
    """Who a stream is counted against: the request's principal, else its IP address."""
    who = principal(request)
    return f"principal {who}" if who is not None else f"address {request.remote}"


class StateBroadcaster:
    """Renders the cluster's state for every `/events` stream (see the module docstring)."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        interval: float = 0.5,
        heartbeat: float = 15.0,
        limits: StreamLimits = StreamLimits(),
    ) -> None:
        self._snapshot = snapshot
        self._interval = interval
        self._heartbeat = heartbeat
        self._limits = limits
        self.clients = 0
        self._per_client: Counter[str] = Counter()
        self._listening = asyncio.Event()  # set while there are clients
        self._closing = False
        self._message = b""
        self._fingerprint = b""
        self._version = 0
        self._changed = asyncio.Event()  # replaced (after being set) at every new version

    async def _render(self) -> tuple[bytes, bytes]:
        snapshot = self._snapshot()
        # Encoding a large cluster takes a while: off the loop (the snapshot is immutable).
        return await asyncio.to_thread(encode_event, snapshot)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _publish(self) -> int:
        """Render the state now, publish it if it changed; the version now current."""
        message, fingerprint = await self._render()
        if fingerprint != self._fingerprint:
            self._message, self._fingerprint = message, fingerprint
            self._version += 1
            self._wake()
        return self._version

    async def run(self) -> None:
        """Publish a new version whenever the state changes, while anyone listens."""
        while True:
            await self._listening.wait()
            try:
                await self._publish()
            except Exception:
                log.exception("could not render the state for /events")
            await asyncio.sleep(self._interval)

    def close(self) -> None:
        """End every stream (the app is shutting down)."""
        self._closing = True
        self._wake()

    def _admit(self, client: str) -> None:
        """Count a new stream of `client`, or refuse it: 503 if the master has as many as
        it serves, 429 if this client has as many as one client may."""
        limits = self._limits
        retry = {"Retry-After": str(limits.retry_after)}
        if self._closing:
            raise web.HTTPServiceUnavailable(text="the master is stopping")
        if self.clients >= limits.total:
            raise web.HTTPServiceUnavailable(
                text=f"the master serves at most {limits.total} /events streams; try again later",
                headers=retry,
            )
        if self._per_client[client] >= limits.per_client:
            raise web.HTTPTooManyRequests(
                text=f"at most {limits.per_client} /events streams per client; "
                "close another page first",
                headers=retry,
            )
        self.clients += 1
        self._per_client[client] += 1
        self._listening.set()

    def _release(self, client: str) -> None:
        self.clients -= 1
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]
        if self.clients == 0:
            self._listening.clear()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        client = client_of(request)
        self._admit(client)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            version = await self._publish()  # a fresh state for a new page, and for all
            await self._write(request, response, b"retry: 2000\n\n" + self._message)
            await self._follow(request, response, version)
        except ConnectionError:
            pass  # the client went away, or did not read
        finally:
            self._release(client)
        return response

    async def _write(self, request: web.Request, response: web.StreamResponse, data: bytes) -> None:
        """Write `data`, or drop a client that does not take it within the write timeout."""
        try:
            async with asyncio.timeout(self._limits.write_timeout):
                await response.write(data)
        except TimeoutError:
            log.info("dropped an /events client that stopped reading", client=client_of(request))
            if request.transport is not None:
                request.transport.abort()  # its unsent buffer too: nothing waits on it
            raise ConnectionResetError("the client stopped reading") from None

    async def _follow(self, request: web.Request, response: web.StreamResponse, sent: int) -> None:
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        ends = last_write + self._limits.max_age
        while not self._closing and loop.time() < ends:
            if self._version != sent:
                sent = self._version
                await self._write(request, response, self._message)
                last_write = loop.time()
                continue
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(1.0, max(ends - loop.time(), 0.0))):
                    await changed.wait()
            if request.transport is None or request.transport.is_closing():
                return
            if loop.time() - last_write >= self._heartbeat:
                await self._write(request, response, b": keepalive\n\n")
                last_write = loop.time()


# Sandbox proxy ---------------------------------------------------------------

_PROXY_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=3)


class SandboxProxy:
    """Reads task sandboxes from the agents' sandbox servers for the page."""

    def __init__(self, agent: AgentLookup, ssl_context: ssl.SSLContext | None = None) -> None:
        self._agent = agent
        self._ssl = ssl_context  # HTTPS to the agents when the cluster has TLS
        self.session: aiohttp.ClientSession | None = None

    async def read(self, request: web.Request) -> web.Response:
        info = request.match_info
        agent = self._agent(info["agent_id"])
        if agent is None:
            raise web.HTTPNotFound(text=f"no agent {clip(info['agent_id'])!r}")
        if not agent.address:
            raise web.HTTPNotFound(text=f"agent {agent.id} does not serve its sandboxes")
        # The URL is built from parts: a host and port parsed from the address (checked
        # when the agent registered), and path segments checked here.
        where = parse_address(agent.address)
        if where is None:
            raise web.HTTPBadGateway(text=f"agent {agent.id} has no valid sandbox address")
        try:
            offset, length = parse_range(request.query.get("offset"), request.query.get("length"))
            query = {"length": str(length)}
            if offset is not None:
                query["offset"] = str(offset)
            url = sandbox_url(*where, info["framework_id"], info["task_id"], info["file"], query)
        except BadRequest as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if self.session is None or self.session.closed:
            raise web.HTTPServiceUnavailable(text="the master is stopping")
        if self._ssl is not None:
            url = url.with_scheme("https")  # verified against the CA, as the master
        try:
            async with self.session.get(
                url, allow_redirects=False, ssl=self._ssl or True
            ) as upstream:
                if upstream.status != 200:
                    status = upstream.status if upstream.status in (400, 404) else 502
                    text = (await _read_at_most(upstream, 500)).decode(errors="replace")
                    return web.Response(status=status, text=text or upstream.reason or "")
                body = await _read_at_most(upstream, length)
                headers = {
                    name: upstream.headers[name]
                    for name in (OFFSET_HEADER, SIZE_HEADER)
                    if name in upstream.headers
                }
        except (aiohttp.ClientError, TimeoutError) as e:
            raise web.HTTPBadGateway(
                text=f"could not read the sandbox from agent {agent.id} "
                f"at {agent.address}: {str(e) or type(e).__name__}"
            ) from None
        return web.Response(
            body=body,
            content_type="text/plain",
            charset="utf-8",
            headers={**headers, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
        )


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of the body: an agent cannot make the master buffer more."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


# The app ----------------------------------------------------------------------

_ASSETS = frozenset({"app.js", "style.css"})
_BROADCASTER_KEY = web.AppKey("ui_broadcaster", StateBroadcaster)
_PROXY_KEY = web.AppKey("ui_sandbox_proxy", SandboxProxy)


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(
        UI_DIR / "index.html",
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": _CSP},
    )


async def _asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    if name not in _ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(UI_DIR / name, headers={"Cache-Control": "no-cache"})


async def _events(request: web.Request) -> web.StreamResponse:
    return await request.app[_BROADCASTER_KEY].stream(request)


async def _sandbox(request: web.Request) -> web.Response:
    return await request.app[_PROXY_KEY].read(request)


async def _background(app: web.Application) -> AsyncIterator[None]:
    broadcaster, proxy = app[_BROADCASTER_KEY], app[_PROXY_KEY]
    proxy.session = aiohttp.ClientSession(timeout=_PROXY_TIMEOUT)
    task = asyncio.create_task(broadcaster.run(), name="mesolite-ui-events")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await proxy.session.close()


async def _on_shutdown(app: web.Application) -> None:
    # Before the server waits for its handlers: end the streams, fail proxied reads fast.
    app[_BROADCASTER_KEY].close()
    session = app[_PROXY_KEY].session
    if session is not None:
        await session.close()


def setup_ui(
    app: web.Application,
    *,
    snapshot: Snapshot,
    agent: AgentLookup,
    limits: StreamLimits = StreamLimits(),
    sandbox_ssl: ssl.SSLContext | None = None,
) -> list[Route]:
    """Set `app` up for the UI, reading the cluster through `snapshot` (for /events,
    within `limits`) and `agent` (where a task's sandbox is served, over HTTPS with
    `sandbox_ssl` when given); returns the UI's routes, for the master's route table
    (`master.http_access`)."""
    app[_BROADCASTER_KEY] = StateBroadcaster(snapshot, limits=limits)
    app[_PROXY_KEY] = SandboxProxy(agent, sandbox_ssl)
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(_on_shutdown)
    return [
        Route("/", _page, Action.VIEW_STATE),
        Route("/ui/{name}", _asset, Action.VIEW_STATE),
        Route("/events", _events, Action.VIEW_STATE),
        Route(
            r"/agents/{agent_id}/sandbox/{framework_id}/{task_id}/{file:stdout|stderr}",
            _sandbox,
            Action.ACCESS_SANDBOXES,
        ),
    ]


def broadcaster(app: web.Application) -> StateBroadcaster:
    """The app's broadcaster (tests look at its client count)."""
    return app[_BROADCASTER_KEY]


__all__ = [
    "StateBroadcaster",
    "StreamLimits",
    "broadcaster",
    "client_of",
    "encode_event",
    "setup_ui",
]
