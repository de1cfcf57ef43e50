"""/events streams are limited, so no client can lock the web UI out for the others.

The attack: 64 /events requests from one client that never read a byte took every
stream the master served; every other page got 503 from then on. Now one client
(its principal, else its IP address) holds at most `per_client` streams (429 past
that), all clients together at most `total` (503), a client that stops reading is
dropped, and a stream ends after `max_age` (the browser reconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mesolite.master.acl import Action
from mesolite.master.http import create_app
from mesolite.master.ui_routes import StateBroadcaster, StreamLimits, broadcaster
from tests.cluster import LocalCluster, fast
from tests.event_streams import events_app
from tests.support.core import CoreHarness
from tests.support.snapshots import empty_snapshot
from tests.waiting import wait_for_condition, within


@contextlib.asynccontextmanager
async def client_at(ip: str) -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client whose connections come from `ip` (any of 127.0.0.0/8 on Linux)."""
    connector = aiohttp.TCPConnector(local_addr=(ip, 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def open_streams(
    http: aiohttp.ClientSession, url: str, count: int, stack: contextlib.AsyncExitStack
) -> list[int]:
    """Open `count` /events streams one after the other, reading none; their statuses."""
    statuses = []
    for _ in range(count):
        response = await stack.enter_async_context(http.get(url))
        statuses.append(response.status)
    return statuses


async def first_event(response: aiohttp.ClientResponse) -> bytes:
    async def read() -> bytes:
        while line := await response.content.readline():
            if line.startswith(b"event: state"):
                return line
        raise AssertionError("the stream ended")

    return await within(read(), 10, "the first state event")


async def test_a_flood_of_idle_streams_from_one_client_does_not_lock_others_out(
    tmp_path: Path,
) -> None:
    async with (
        LocalCluster(tmp_path) as cluster,
        contextlib.AsyncExitStack() as stack,
        client_at("127.0.0.1") as flood,
        client_at("127.0.0.2") as other,
    ):
        base = f"http://{cluster.server.http_address}"
        statuses = await open_streams(flood, f"{base}/events", 64, stack)
        assert 200 in statuses
        async with other.get(f"{base}/events") as response:
            assert response.status == 200
            await first_event(response)
        for path in ("/state", "/"):
            async with other.get(f"{base}{path}") as response:
                assert response.status == 200


async def test_the_stream_past_each_limit_is_refused_and_the_master_keeps_answering(
    tmp_path: Path,
) -> None:
    config = fast(event_streams=3, event_streams_per_client=2)
    async with (
        LocalCluster(tmp_path, config) as cluster,
        contextlib.AsyncExitStack() as stack,
        client_at("127.0.0.1") as first,
        client_at("127.0.0.2") as second,
        client_at("127.0.0.3") as third,
    ):
        events = f"http://{cluster.server.http_address}/events"
        hub = broadcaster(cluster.server._http.app)  # type: ignore[union-attr]
        assert await open_streams(first, events, 2, stack) == [200, 200]
        async with first.get(events) as refused:
            assert refused.status == 429  # its own limit
            assert refused.headers["Retry-After"] == "10"
            assert "per client" in await refused.text()
        assert await open_streams(second, events, 1, stack) == [200]
        async with third.get(events) as refused:
            assert refused.status == 503  # the master's limit
            assert refused.headers["Retry-After"] == "10"
        state = f"http://{cluster.server.http_address}/state"
        async with third.get(state) as response:
            assert response.status == 200
        assert hub.clients == 3
        await stack.aclose()  # the streams end: their places are free again
        await wait_for_condition(lambda: hub.clients == 0, 10, "the streams to be released")
        assert await open_streams(first, events, 2, stack) == [200, 200]
        await stack.aclose()


async def test_streams_are_counted_per_principal_when_the_guard_names_one() -> None:
    async def guard(request: web.Request, action: Action) -> str | None:
        return request.headers.get("X-Principal")  # what authentication will find

    core = CoreHarness()
    app = create_app(core.master, guard=guard)
    async with TestClient(TestServer(app)) as client, contextlib.AsyncExitStack() as stack:

        async def status(who: str) -> int:
            response = await client.get("/events", headers={"X-Principal": who})
            stack.push_async_callback(response.release)
            return response.status

        per_client = core.master.config.event_streams_per_client
        assert [await status("alice") for _ in range(per_client)] == [200] * per_client
        assert await status("alice") == 429
        assert await status("bob") == 200  # same address, another principal


async def test_a_client_that_stops_reading_is_dropped() -> None:
    # Every tick a new 1 MB state: a client that reads nothing fills the buffers.
    ticks = iter(range(1_000_000))
    hub = StateBroadcaster(
        lambda: empty_snapshot(master_id=f"{next(ticks)}-" + "x" * 1_000_000),
        interval=0.05,
        limits=StreamLimits(write_timeout=0.5),
    )
    async with events_app(hub) as client:
        server = client.server
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(stalled, (server.host, server.port))
            request = f"GET /events HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n\r\n"
            await loop.sock_sendall(stalled, request.encode())
            await wait_for_condition(lambda: hub.clients == 1, 10, "the stream to start")
            await wait_for_condition(lambda: hub.clients == 0, 30, "the stalled client dropped")
        finally:
            stalled.close()


async def test_a_stream_ends_after_its_maximum_age() -> None:
    hub = StateBroadcaster(empty_snapshot, limits=StreamLimits(max_age=0.3))
    async with events_app(hub) as client:
        async with client.get("/events") as response:
            body = await within(response.content.read(), 10, "the stream to end")
        assert b"retry: 2000" in body and b"event: state" in body
        assert hub.clients == 0
