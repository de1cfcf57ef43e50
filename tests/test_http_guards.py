"""What every HTTP request of the master and the agents passes before its handler:
the Host header check (DNS rebinding) and the route's permission (the route table).

DNS rebinding: a page on attacker.example re-points that name at 127.0.0.1 (or at a
machine on the victim's network) and reads the answers as its own. The requests
it makes say `Host: attacker.example`; the master and the agents answered them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mesolite.agent.sandbox_http import SandboxServer
from mesolite.cli import build_parser
from mesolite.http_hosts import AllowedHosts, normal_host
from mesolite.master.acl import Action
from mesolite.master.http import create_app
from mesolite.master.http_access import principal
from mesolite.master.master import MasterConfig
from mesolite.master.server import MasterServer
from tests.cluster import LocalCluster, fast
from tests.support.core import CoreHarness

ROUTES = ["/", "/ui/app.js", "/state", "/metrics", "/events", "/agents/a/sandbox/f/t/stdout"]
REBINDING = ["attacker.example", "attacker.example:5051", "127.0.0.1.attacker.example", "127.1"]


async def status_for(url: str, host: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url, headers={"Host": host}) as response:
        return response.status


async def raw_status(address: str, request: bytes) -> bytes:
    """The status line the server answers `request` with (sent as is)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_master_answers_only_its_own_host_names(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        address = cluster.server.http_address
        port = address.rsplit(":", 1)[1]
        for route in ROUTES:
            url = f"http://{address}{route}"
            for host in REBINDING:
                assert await status_for(url, host) == 421, (route, host)
        state = f"http://{address}/state"
        for host in [address, f"localhost:{port}", "LOCALHOST", "127.0.0.1", f"[::1]:{port}"]:
            assert await status_for(state, host) == 200, host
        # A request without a Host header (HTTP/1.0 allows it) is refused too.
        line = await raw_status(address, b"GET /state HTTP/1.0\r\n\r\n")
        assert line.split()[1] == b"400", line


async def test_configured_names_are_answered(tmp_path: Path) -> None:
    config = MasterConfig(http_allowed_hosts=("ui.example.com",))
    async with MasterServer(config, "127.0.0.1", 0, 0) as server:
        url = f"http://{server.http_address}/state"
        assert await status_for(url, "ui.example.com") == 200
        assert await status_for(url, "UI.example.com.:443") == 200
        assert await status_for(url, "other.example.com") == 421
    async with MasterServer(MasterConfig(http_allowed_hosts=("*",)), "127.0.0.1", 0, 0) as server:
        assert await status_for(f"http://{server.http_address}/state", "anything.example") == 200


async def test_the_agents_sandbox_server_answers_only_its_own_host_names(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandboxes" / "fw" / "t"
    sandbox.mkdir(parents=True)
    (sandbox / "stdout").write_text("output")
    async with SandboxServer(tmp_path, "127.0.0.1", 0, allowed_hosts=["agent1.example"]) as server:
        url = f"http://{server.address}/sandbox/fw/t/stdout"
        for host in REBINDING:
            assert await status_for(url, host) == 421, host
        for host in [server.address, "localhost", "agent1.example:80"]:
            assert await status_for(url, host) == 200, host


def test_the_cli_takes_the_allowed_host_names() -> None:
    args = build_parser().parse_args(["master", "--http-allowed-hosts", "ui.example, 10.0.0.5"])
    assert args.http_allowed_hosts == ("ui.example", "10.0.0.5")
    args = build_parser().parse_args(["agent", "--master", "m:1", "--http-allowed-hosts", "*"])
    assert args.http_allowed_hosts == ("*",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["master", "--http-allowed-hosts", "a b"])
    args = build_parser().parse_args(["master", "--event-streams-per-client", "2"])
    assert (args.event_streams, args.event_streams_per_client) == (64, 2)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("Example.COM", "example.com"),
        ("example.com.:8080", "example.com"),
        ("127.0.0.1:5051", "127.0.0.1"),
        ("[::1]:5051", "::1"),
        ("[0:0::1]", "::1"),
        ("::1", "::1"),
        ("", None),
        ("[::1", None),
        ("[::1]x", None),
        ("a b", None),
        ("user@host", None),
        ("host:port", None),
        ("host/path", None),
    ],
)
def test_normal_host(header: str, host: str | None) -> None:
    assert normal_host(header) == host


@pytest.mark.unit
def test_allowed_hosts() -> None:
    default = AllowedHosts()
    assert default.allows("localhost:1") and default.allows("127.0.0.1") and default.allows("[::1]")
    assert not default.allows("attacker.example")
    # A server on a wildcard address answers to the address a request arrived at.
    wildcard = AllowedHosts(listen_host="0.0.0.0")
    assert not wildcard.allows("0.0.0.0")
    assert wildcard.allows("10.1.2.3:5051", local_address="10.1.2.3")
    assert not wildcard.allows("10.1.2.4:5051", local_address="10.1.2.3")
    assert AllowedHosts(listen_host="10.1.2.3").allows("10.1.2.3:80")
    assert AllowedHosts(["*"]).allows("anything")


# The route table -------------------------------------------------------------------


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], list[str]]]:
    """The master's app with a guard that lets `alice` view the state and nothing else."""
    core = CoreHarness()
    asked: list[str] = []

    async def guard(request: web.Request, action: Action) -> str | None:
        asked.append(f"{request.path} {action.value}")
        if request.headers.get("Authorization") != "Bearer alice":
            raise web.HTTPUnauthorized()
        if action is not Action.VIEW_STATE:
            raise web.HTTPForbidden()
        return "alice"

    app = create_app(core.master, guard=guard)

    async def whoami(request: web.Request) -> web.Response:
        return web.Response(text=str(principal(request)))

    app.router.add_get("/unlisted", whoami)  # added around the table: never served
    async with TestClient(TestServer(app)) as client:
        yield client, asked


async def test_every_route_is_checked_with_its_action(
    guarded: tuple[TestClient[web.Request, web.Application], list[str]],
) -> None:
    client, asked = guarded
    alice = {"Authorization": "Bearer alice"}
    for route in ROUTES:
        assert (await client.get(route)).status == 401, route
    expected = {
        "/": 200,
        "/ui/app.js": 200,
        "/state": 200,
        "/metrics": 200,
        "/agents/a/sandbox/f/t/stdout": 403,
    }
    for route, status in expected.items():
        assert (await client.get(route, headers=alice)).status == status, route
    assert asked[len(ROUTES) :] == [
        "/ view_state",
        "/ui/app.js view_state",
        "/state view_state",
        "/metrics view_state",
        "/agents/a/sandbox/f/t/stdout access_sandboxes",
    ]
    assert (await client.get("/unlisted", headers=alice)).status == 403
    assert (await client.get("/nothing-here", headers=alice)).status == 404


async def test_the_masters_acls_guard_its_http_routes(tmp_path: Path) -> None:
    # Until authentication gives requests a principal, they are anonymous: an ACL
    # file that lets only named principals see the state shuts them out.
    acls = tmp_path / "acls.json"
    acls.write_text(
        json.dumps(
            {
                "view_state": [{"principals": {"values": ["ops"]}}],
                "access_sandboxes": [{"principals": {"type": "ANY"}}],
            }
        )
    )
    config = fast(acls_file=acls)
    async with LocalCluster(tmp_path, config) as cluster, aiohttp.ClientSession() as http:
        base = f"http://{cluster.server.http_address}"
        for route in ["/state", "/metrics", "/events", "/"]:
            async with http.get(base + route) as response:
                assert response.status == 401, route
        async with http.get(base + "/agents/a/sandbox/f/t/stdout") as response:
            assert response.status == 404  # allowed; there is no such agent
