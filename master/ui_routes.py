"""The master's web UI: the page, live updates by server-sent events, and task output.

    GET /          the page (master/ui/index.html); its script and style under /ui/
    GET /events    text/event-stream of `state` events: the GET /state document
                   (`ClusterSnapshot`, recently ended tasks included), sent when
                   the client connects and then whenever the cluster changes
    GET /agents/{agent_id}/sandbox/{framework_id}/{task_id}/{stdout|stderr}?offset=&length=
                   a task's output, read from the agent's sandbox server at the
                   address the agent registered (`mesolite/sandbox_protocol.py`)

Events are bounded. One `StateBroadcaster` per app renders the snapshot every
`interval` seconds (0.5), and only while someone listens (and once more for
each page that connects, at most `max_clients` at a time); a new version is
published only when the snapshot differs from the last one, clocks excluded.
Each stream sends the newest version it has not sent, so a slow client skips
versions instead of queueing them. The snapshot is built on the loop, once per
tick, and encoded in a worker thread (it is immutable). An idle stream gets a
comment every `heartbeat` seconds (15). A stream ends when its client goes
(checked every second) or when the app shuts down: `on_shutdown` wakes every
stream, so stopping the master never waits on an open page.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import quote

import aiohttp
import structlog
from aiohttp import web
from yarl import URL

from mesolite.sandbox_protocol import (
    OFFSET_HEADER,
    SIZE_HEADER,
    BadRequest,
    check_segment,
    parse_range,
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
    """The SSE message for `snapshot`, and a fingerprint that ignores the clocks in it."""
    state = snapshot.to_json()
    data = json.dumps(state, separators=(",", ":"))
    steady = {
        **state,
        "time": None,
        "agents": [{**a, "seconds_since_heartbeat": None} for a in state["agents"]],
    }
    fingerprint = hashlib.blake2b(
        json.dumps(steady, separators=(",", ":")).encode(), digest_size=16
    ).digest()
    return f"event: state\ndata: {data}\n\n".encode(), fingerprint


class StateBroadcaster:
    """Renders the cluster's state for every `/events` stream (see the module docstring)."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        interval: float = 0.5,
        heartbeat: float = 15.0,
        max_clients: int = 64,
    ) -> None:
        self._snapshot = snapshot
        self._interval = interval
        self._heartbeat = heartbeat
        self._max_clients = max_clients
        self.clients = 0
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

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            raise web.HTTPServiceUnavailable(text="the master is stopping")
        if self.clients >= self._max_clients:
            raise web.HTTPServiceUnavailable(text="too many /events streams")
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        self.clients += 1
        self._listening.set()
        try:
            await response.prepare(request)
            version = await self._publish()  # a fresh state for a new page, and for all
            await response.write(b"retry: 2000\n\n" + self._message)
            await self._follow(request, response, version)
        except ConnectionError:
            pass  # the client went away
        finally:
            self.clients -= 1
            if self.clients == 0:
                self._listening.clear()
        return response

    async def _follow(self, request: web.Request, response: web.StreamResponse, sent: int) -> None:
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        while not self._closing:
            if self._version != sent:
                sent = self._version
                await response.write(self._message)
                last_write = loop.time()
                continue
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await changed.wait()
            if request.transport is None or request.transport.is_closing():
                return
            if loop.time() - last_write >= self._heartbeat:
                await response.write(b": keepalive\n\n")
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
            raise web.HTTPNotFound(text=f"no agent {info['agent_id']!r}")
        try:
            framework_id = check_segment("framework id", info["framework_id"])
            task_id = check_segment("task id", info["task_id"])
            offset, length = parse_range(request.query.get("offset"), request.query.get("length"))
        except BadRequest as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if not agent.address:
            raise web.HTTPNotFound(text=f"agent {agent.hostname} does not serve its sandboxes")
        if self.session is None or self.session.closed:
            raise web.HTTPServiceUnavailable(text="the master is stopping")
        query = {"length": str(length)}
        if offset is not None:
            query["offset"] = str(offset)
        path = f"/sandbox/{quote(framework_id, safe='')}/{quote(task_id, safe='')}/{info['file']}"
        scheme = "https" if self._ssl else "http"
        url = URL(f"{scheme}://{agent.address}{path}", encoded=True).with_query(query)
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
                text=f"could not read the sandbox from agent {agent.hostname} "
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
    sandbox_ssl: ssl.SSLContext | None = None,
) -> None:
    """Add the UI's routes to the master's HTTP app, reading the cluster through `snapshot`
    (for /events) and `agent` (where a task's sandbox is served, over HTTPS with
    `sandbox_ssl` when given)."""
    app[_BROADCASTER_KEY] = StateBroadcaster(snapshot)
    app[_PROXY_KEY] = SandboxProxy(agent, sandbox_ssl)
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/", _page)
    app.router.add_get("/ui/{name}", _asset)
    app.router.add_get("/events", _events)
    app.router.add_get(
        r"/agents/{agent_id}/sandbox/{framework_id}/{task_id}/{file:stdout|stderr}", _sandbox
    )


def broadcaster(app: web.Application) -> StateBroadcaster:
    """The app's broadcaster (tests look at its client count)."""
    return app[_BROADCASTER_KEY]


__all__ = ["StateBroadcaster", "broadcaster", "encode_event", "setup_ui"]
