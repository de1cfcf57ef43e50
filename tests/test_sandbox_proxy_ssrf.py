"""The sandbox proxy cannot be pointed elsewhere (server-side request forgery).

An agent registers the address of its sandbox server; the master's web UI reads
task output through the master from there. A rogue agent (here: raw protobuf)
registering `127.0.0.1:P/admin/secret#` once made the master fetch and return
`/admin/secret` from a server only the master could reach, and `OTHER-HOST:P`
made it fetch from another machine. Now an address must be exactly HOST:PORT,
the URL is built from parts, and the host is the IP the agent connects from.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest
from aiohttp import web

from mesolite import grpc_utils
from mesolite.master import messages as msg
from mesolite.master.servicers import peer_host
from mesolite.master.validation import agent_registration_problem, sandbox_address
from mesolite.resources import Resources
from mesolite.sandbox_protocol import BadRequest, parse_address, sandbox_url
from mesolite.v1 import agent_pb2, agent_pb2_grpc
from tests.cluster import LocalCluster
from tests.raw_client import resources
from tests.support.core import CoreHarness
from tests.support.fakes import RecordingPeer
from tests.waiting import within

SECRET = "internal secret: only the master can reach this"


@dataclass
class InternalServer:
    """A server on the master's side of the network, which answers every path."""

    host: str
    port: int = 0
    paths: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def internal_server(host: str = "127.0.0.1") -> AsyncIterator[InternalServer]:
    server = InternalServer(host)

    async def anything(request: web.Request) -> web.Response:
        server.paths.append(request.path_qs)
        return web.Response(text=SECRET)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def rogue_agent(master: str, address: str) -> AsyncIterator[str | grpc.StatusCode]:
    """Register with `address`: yields the agent id while registered, or the refusal code."""
    channel = grpc_utils.create_channel(master)
    stub = agent_pb2_grpc.AgentGatewayStub(channel)
    done = asyncio.Event()

    async def calls() -> AsyncIterator[agent_pb2.AgentCall]:
        yield agent_pb2.AgentCall(
            register=agent_pb2.AgentCall.Register(
                hostname="rogue", address=address, total=resources(cpus=1)
            )
        )
        await done.wait()

    call = stub.Connect(calls())
    try:
        try:
            event = await within(call.read(), 10, "the master's answer to the registration")
        except grpc.aio.AioRpcError as e:
            yield e.code()
        else:
            assert event is not grpc.aio.EOF and event.WhichOneof("event") == "registered"
            yield event.registered.agent_id
    finally:
        done.set()
        call.cancel()
        await channel.close()


async def read_through_master(cluster: LocalCluster, agent_id: str) -> tuple[int, str]:
    url = f"http://{cluster.server.http_address}/agents/{agent_id}/sandbox/fw/task/stdout"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:{port}/admin/secret#",
        "127.0.0.1:{port}/admin/secret?",
        "127.0.0.1:{port}#",
        "user@127.0.0.1:{port}",
        "http://127.0.0.1:{port}",
        "127.0.0.1:{port}\r\nX-Injected: 1",
        "127.0.0.1:{port}/../admin",
    ],
)
async def test_an_address_that_is_not_host_port_is_refused(tmp_path: Path, address: str) -> None:
    async with LocalCluster(tmp_path) as cluster, internal_server() as internal:
        async with rogue_agent(cluster.address, address.format(port=internal.port)) as outcome:
            if isinstance(outcome, str):  # registered: try the attack
                status, text = await read_through_master(cluster, outcome)
                assert SECRET not in text, (status, internal.paths)
        assert outcome == grpc.StatusCode.INVALID_ARGUMENT
        assert internal.paths == []
        assert cluster.master.agents == {}


async def test_the_proxy_reads_from_the_ip_the_agent_connects_from(tmp_path: Path) -> None:
    # The internal server listens on 127.0.0.2 only; the rogue agent connects from
    # 127.0.0.1 and registers 127.0.0.2:P: the master must not go there.
    async with LocalCluster(tmp_path) as cluster, internal_server("127.0.0.2") as internal:
        async with rogue_agent(cluster.address, f"127.0.0.2:{internal.port}") as agent_id:
            assert isinstance(agent_id, str)
            [shown] = (await cluster.state())["agents"]
            assert shown["address"] == f"127.0.0.1:{internal.port}"
            status, text = await read_through_master(cluster, agent_id)
        assert SECRET not in text
        assert status == 502  # nothing of the agent's listens on 127.0.0.1:P
        assert internal.paths == []


# The pure parts ------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("127.0.0.1:5051", ("127.0.0.1", 5051)),
        ("agent-1.example.com:1", ("agent-1.example.com", 1)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:80", ("::1", 80)),
        ("[2001:db8::1]:8080", ("2001:db8::1", 8080)),
        ("", None),
        ("127.0.0.1", None),
        (":80", None),
        ("host:0", None),
        ("host:65536", None),
        ("host:+80", None),
        ("host:８０", None),  # noqa: RUF001 (fullwidth digits: int() would take them)
        ("host: 80", None),
        ("127.0.0.1:80/admin", None),
        ("127.0.0.1:80#", None),
        ("127.0.0.1:80?x", None),
        ("user@host:80", None),
        ("http://host:80", None),
        ("a b:80", None),
        ("-host:80", None),
        ("host_1:80", None),
        ("127.1:80", None),  # a resolver reads it as 127.0.0.1
        ("0x7f.1:80", None),
        ("[::1%eth0]:80", None),
        ("::1:80", None),
        ("[127.0.0.1]:80", None),
        ("a" * 64 + ".example:80", None),
        (".".join(["a" * 60] * 5) + ":80", None),
        ("host:80\n", None),
    ],
)
def test_parse_address(address: str, parsed: tuple[str, int] | None) -> None:
    assert parse_address(address) == parsed
    problem = agent_registration_problem("", Resources(cpus=1), [], address)
    assert (problem is None) == (parsed is not None or address == ""), problem


@pytest.mark.unit
def test_sandbox_urls_are_built_from_checked_parts() -> None:
    url = sandbox_url("::1", 8080, "fw", "a?b#c", "stdout", {"length": "5"})
    assert str(url) == "http://[::1]:8080/sandbox/fw/a%3Fb%23c/stdout?length=5"
    assert url.host == "::1" and url.port == 8080
    for framework_id, task_id, name in [
        ("..", "t", "stdout"),
        ("fw", "a/b", "stdout"),
        ("fw", "t", "task.json"),
        ("fw", "", "stdout"),
    ]:
        with pytest.raises(BadRequest):
            sandbox_url("127.0.0.1", 1, framework_id, task_id, name, {})


@pytest.mark.unit
def test_the_host_is_the_peers_and_the_port_the_agents() -> None:
    assert peer_host("ipv4:10.0.0.5:41234") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:41234") == "::1"
    assert peer_host("ipv6:%5B::1%5D:41234") == "::1"
    assert peer_host("ipv6:[::ffff:10.0.0.5]:41234") == "10.0.0.5"
    assert peer_host("unix:/tmp/socket") == ""
    assert peer_host("ipv4:not-an-ip:1") == ""
    assert sandbox_address("10.9.9.9:7000", "10.0.0.5") == "10.0.0.5:7000"
    assert sandbox_address("agent-1.example:7000", "::1") == "[::1]:7000"
    assert sandbox_address("agent-1.example:7000", "") == "agent-1.example:7000"
    assert sandbox_address("", "10.0.0.5") == ""

    core = CoreHarness()
    peer: RecordingPeer[msg.AgentMessage] = RecordingPeer()
    agent = core.master.register_agent(
        "", "host", "10.9.9.9:7000", Resources(cpus=1), {}, [], peer, peer_host="10.0.0.5"
    )
    assert core.master.agents[agent].address == "10.0.0.5:7000"
    core.assert_sound()
