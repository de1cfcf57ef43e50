"""Identity on every connection: a real cluster over mutual TLS, and every way in refused
without a principal.

The master, agents and frameworks are real (gRPC and HTTPS on 127.0.0.1, real
certificates from `mesolite.certs`). Refusals are checked on both gRPC services and on
every HTTP route the master's app has (read from its router, so a new route is covered
without editing this file), and each is checked to have changed nothing.

grpcio's server either requires a verified client certificate or asks for none, so on
the main gRPC port a client without one, or with one from another CA, is refused by the
TLS handshake (the client sees UNAVAILABLE and never gets a stream); the token port asks
for no certificate and refuses a missing or wrong token with UNAUTHENTICATED.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest
from aiohttp import web

from mesolite import certs, grpc_utils
from mesolite.agent import Agent, AgentConfig
from mesolite.agent.errors import AgentRegistrationError
from mesolite.agent.sandbox_http import SandboxServer
from mesolite.framework_sdk import FrameworkRejected, Resources, TaskSpec, TaskState
from mesolite.master.http import create_app
from mesolite.master.server import MasterServer
from mesolite.tls import TlsConfig, TlsError
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import FAST, LocalCluster, MasterProcess
from tests.recording import RecordingFramework, running
from tests.support.cgroups import TEST_ISOLATION
from tests.test_cli_views import mesolite
from tests.waiting import wait_for_condition, within


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, tokens=["ci"])
    return directory


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another cluster's CA: its certificates have the same names and mean nothing here."""
    directory = tmp_path_factory.mktemp("other") / "certs"
    certs.init_cluster(directory, tokens=["ci"])
    return directory


@pytest.fixture
async def cluster(tmp_path: Path, cluster_certs: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path, certs=cluster_certs, token_port=True) as c:
        yield c


def token(directory: Path, name: str = "ci") -> str:
    return (directory / name / "token").read_text().strip()


# Raw gRPC calls ------------------------------------------------------------------------

SUBSCRIBE = scheduler_pb2.Call(
    subscribe=scheduler_pb2.Call.Subscribe(
        framework_info=scheduler_pb2.FrameworkInfo(name="intruder", role="*")
    )
)
REGISTER = agent_pb2.AgentCall(
    register=agent_pb2.AgentCall.Register(
        hostname="intruder", address="127.0.0.1:1", total=common_pb2.Resources(scalars={"cpus": 1})
    )
)


async def first_event(
    address: str, service: str, tls: TlsConfig | None, bearer: str | None = None
) -> str:
    """Open the service's stream with its first call; the first event's kind, or the
    status code's name if the call failed."""
    channel = grpc_utils.create_channel(address, tls, bearer)
    try:
        if service == "scheduler":
            call = scheduler_pb2_grpc.SchedulerStub(channel).Connect(iter([SUBSCRIBE]), timeout=10)
        else:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect(iter([REGISTER]), timeout=10)
        async for event in call:
            return str(event.WhichOneof("event"))
        return "ended"
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)
    finally:
        await channel.close()


# The cluster over mutual TLS ------------------------------------------------------------


async def test_a_task_runs_over_mutual_tls_and_the_core_knows_each_principal(
    cluster: LocalCluster, cluster_certs: Path
) -> None:
    agent = await cluster.add_agent("cpus:2;mem:1024")
    process = await cluster.spawn_agent("cpus:1;mem:512", "agent-cli")  # `mesolite agent`
    fw = RecordingFramework("tls", tls=cluster.bundle("framework"))
    async with running(fw, cluster.address):
        offer = await fw.next_offer(agent_id=agent.agent_id)
        task = TaskSpec("hello", "echo hello over tls", Resources(cpus=0.5, mem=32))
        await fw.launch(offer, [task])
        await fw.wait_state("hello", TaskState.FINISHED)
        assert fw.framework_id is not None
        record = cluster.master.frameworks[fw.framework_id]
        assert record.principal == "framework"
        assert {a.hostname: a.principal for a in cluster.master.agents.values()} == {
            "agent1": "agent",
            "agent-cli": "agent",
        }
        # The web UI's sandbox proxy reads the task's output from the agent over HTTPS.
        admin = cluster.bundle("admin").client_context()
        url = (
            f"{cluster.server.http_url}/agents/{agent.agent_id}/sandbox/"
            f"{fw.framework_id}/hello/stdout"
        )
        async with aiohttp.ClientSession() as http, http.get(url, ssl=admin) as response:
            assert response.status == 200
            assert await response.text() == "hello over tls\n"
        state = await cluster.state()  # GET /state as `admin`
        assert {f["name"] for f in state["frameworks"]} == {"tls"}
    assert process.process.returncode is None


async def test_a_good_token_on_the_token_port_is_its_principal(
    cluster: LocalCluster, cluster_certs: Path
) -> None:
    ca_only = TlsConfig(cluster_certs / "ca.crt")
    fw = RecordingFramework("ci", tls=ca_only, token=token(cluster_certs))
    async with running(fw, cluster.server.token_address):
        await wait_for_condition(lambda: fw.connected, what="the token framework to subscribe")
        assert fw.framework_id is not None
        assert cluster.master.frameworks[fw.framework_id].principal == "ci"


# gRPC refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["scheduler", "agent"])
async def test_grpc_refuses_every_client_without_a_principal(
    cluster: LocalCluster, cluster_certs: Path, other_certs: Path, service: str
) -> None:
    main, tokens = cluster.address, cluster.server.token_address
    ca = TlsConfig(cluster_certs / "ca.crt")
    stranger = TlsConfig(
        cluster_certs / "ca.crt",
        other_certs / "agent" / "tls.crt",
        other_certs / "agent" / "tls.key",
    )
    refused = {
        "plaintext": await first_event(main, service, None),
        "no certificate": await first_event(main, service, ca),
        "another CA's certificate": await first_event(main, service, stranger),
        "plaintext, token port": await first_event(tokens, service, None),
        "no token": await first_event(tokens, service, ca),
        "a wrong token": await first_event(tokens, service, ca, "not-a-token"),
        "another cluster's token": await first_event(tokens, service, ca, token(other_certs)),
        "a certificate, token port": await first_event(tokens, service, cluster.bundle("agent")),
    }
    assert refused == {
        "plaintext": "UNAVAILABLE",
        "no certificate": "UNAVAILABLE",
        "another CA's certificate": "UNAVAILABLE",
        "plaintext, token port": "UNAVAILABLE",
        "no token": "UNAUTHENTICATED",
        "a wrong token": "UNAUTHENTICATED",
        "another cluster's token": "UNAUTHENTICATED",
        "a certificate, token port": "UNAUTHENTICATED",
    }
    assert cluster.master.frameworks == {} and cluster.master.agents == {}
    expected, bundle = (
        ("subscribed", "framework") if service == "scheduler" else ("registered", "agent")
    )
    assert await first_event(main, service, cluster.bundle(bundle)) == expected
    assert await first_event(tokens, service, ca, token(cluster_certs)) == expected


async def test_the_sdk_and_the_agent_give_up_when_refused(
    cluster: LocalCluster, cluster_certs: Path, tmp_path: Path
) -> None:
    ca = TlsConfig(cluster_certs / "ca.crt")
    fw = RecordingFramework("wrong", tls=ca, token="not-a-token")
    with pytest.raises(FrameworkRejected, match="UNAUTHENTICATED"):
        await within(fw.run(cluster.server.token_address), 20, "the framework to give up")
    agent = Agent(
        AgentConfig(
            cluster.server.token_address,
            Resources(cpus=1, mem=64),
            tmp_path / "wrong-agent",
            tls=ca,
            token="not-a-token",
            isolation=TEST_ISOLATION,
        )
    )
    with pytest.raises(AgentRegistrationError, match=r"UNAUTHENTICATED|refused"):
        await within(agent.run(), 20, "the agent to give up")
    assert cluster.master.frameworks == {} and cluster.master.agents == {}


async def test_the_acls_see_the_certificates_principal_and_deny_on_the_wire(
    tmp_path: Path, cluster_certs: Path
) -> None:
    """An ACL decision about a principal from a certificate or a token reaches the client
    as PERMISSION_DENIED (the SDK gives up) or 403, and changes nothing."""
    acls = tmp_path / "acls.json"
    acls.write_text(
        json.dumps(
            {
                "register_frameworks": [{"principals": {"values": ["framework"]}}],
                "register_agents": [{"principals": {"values": ["agent"]}}],
                "view_state": [{"principals": {"values": ["admin"]}}],
            }
        )
    )
    config = replace(FAST, acls_file=acls)
    async with LocalCluster(tmp_path / "cluster", config, certs=cluster_certs) as cluster:
        admin = cluster.bundle("admin")
        assert await first_event(cluster.address, "scheduler", admin) == "PERMISSION_DENIED"
        assert await first_event(cluster.address, "agent", admin) == "PERMISSION_DENIED"
        fw = RecordingFramework("not-allowed", tls=admin)
        with pytest.raises(FrameworkRejected, match="PERMISSION_DENIED"):
            await within(fw.run(cluster.address), 20, "the framework to give up")
        assert cluster.master.frameworks == {} and cluster.master.agents == {}
        allowed = cluster.bundle("framework")
        assert await first_event(cluster.address, "scheduler", allowed) == "subscribed"
        state = f"{cluster.server.http_url}/state"
        assert await http_status(state, cluster.bundle("admin").client_context()) == 200
        assert await http_status(state, allowed.client_context()) == 403
        ca = TlsConfig(cluster_certs / "ca.crt").client_context()
        assert await http_status(state, ca, token(cluster_certs)) == 403  # "ci"
        assert await http_status(state, ca) == 401


async def test_a_master_from_another_ca_is_not_trusted(
    tmp_path: Path, cluster_certs: Path, other_certs: Path
) -> None:
    """The client side of mutual TLS: a framework does not talk to an impostor master."""
    async with LocalCluster(tmp_path, certs=other_certs) as impostor:
        ours = TlsConfig.from_dir(cluster_certs / "framework")
        assert await first_event(impostor.address, "scheduler", ours) == "UNAVAILABLE"
        assert impostor.master.frameworks == {}


# HTTP refusals --------------------------------------------------------------------------


def master_routes(cluster: LocalCluster) -> list[str]:
    """A path for every route of the master's HTTP app (parameters filled in)."""
    paths = set()
    for resource in create_app(cluster.master).router.resources():
        canonical = resource.canonical
        paths.add(re.sub(r"\{[^}]*\}", "stdout", canonical))
    paths.add("/no-such-route")
    return sorted(paths)


async def http_status(
    url: str, context: ssl.SSLContext | bool, bearer: str | None = None
) -> int | str:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            async with http.get(url, ssl=context, headers=headers) as response:
                return response.status
        except aiohttp.ClientError:  # the handshake failed, or the server hung up
            return "refused by TLS"


async def test_every_http_route_refuses_a_request_without_a_principal(
    cluster: LocalCluster, cluster_certs: Path, other_certs: Path
) -> None:
    routes = master_routes(cluster)
    assert {"/state", "/metrics", "/", "/events"} <= set(routes)
    assert any(r.startswith("/agents/") for r in routes)  # the sandbox proxy
    base = cluster.server.http_url
    ca = TlsConfig(cluster_certs / "ca.crt").client_context()
    stranger = TlsConfig(
        cluster_certs / "ca.crt",
        other_certs / "admin" / "tls.crt",
        other_certs / "admin" / "tls.key",
    ).client_context()
    for route in routes:
        url = base + route
        outcomes = {
            "no certificate": await http_status(url, ca),
            "a wrong token": await http_status(url, ca, "not-a-token"),
            "another cluster's token": await http_status(url, ca, token(other_certs)),
            "another CA's certificate": await http_status(url, stranger),
            "plaintext": await http_status(url.replace("https://", "http://"), True),
        }
        assert outcomes == {
            "no certificate": 401,
            "a wrong token": 401,
            "another cluster's token": 401,
            "another CA's certificate": "refused by TLS",
            "plaintext": "refused by TLS",
        }, route


async def test_http_takes_a_certificate_or_a_good_token(
    cluster: LocalCluster, cluster_certs: Path
) -> None:
    base = cluster.server.http_url
    ca = TlsConfig(cluster_certs / "ca.crt").client_context()
    admin = cluster.bundle("admin").client_context()
    good = token(cluster_certs)
    for route in ("/state", "/metrics", "/"):
        assert await http_status(base + route, admin) == 200, route
        assert await http_status(base + route, ca, good) == 200, route
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{base}/events", ssl=ca, headers={"Authorization": f"Bearer {good}"}) as events,
    ):
        assert events.status == 200
        assert (await within(events.content.readline(), 10, "the first event")).startswith(b"retry")


async def test_the_agents_sandbox_server_answers_only_the_master(
    tmp_path: Path, cluster_certs: Path
) -> None:
    sandbox = tmp_path / "agent" / "sandboxes" / "F1" / "t1"
    sandbox.mkdir(parents=True)
    (sandbox / "stdout").write_text("secret output\n")
    tls = TlsConfig.from_dir(cluster_certs / "agent")
    async with SandboxServer(tmp_path / "agent", tls=tls) as server:
        url = f"https://{server.address}/sandbox/F1/t1/stdout"
        master = TlsConfig.from_dir(cluster_certs / "master").client_context()
        admin = TlsConfig.from_dir(cluster_certs / "admin").client_context()
        ca = TlsConfig(cluster_certs / "ca.crt").client_context()
        assert await http_status(url, master) == 200
        assert await http_status(url, admin) == 403  # the master's ACLs are not bypassed
        assert await http_status(url, ca) == "refused by TLS"
        assert await http_status(url.replace("https", "http"), True) != 200


# Secure by default -----------------------------------------------------------------------


async def test_a_master_without_tls_listens_only_on_loopback(tmp_path: Path) -> None:
    server = MasterServer(FAST, host="0.0.0.0", port=0, http_port=0)
    with pytest.raises(TlsError, match="--insecure"):
        await server.start()
    assert server.master is None  # refused before anything started
    async with MasterServer(replace(FAST, insecure=True), "0.0.0.0", 0, 0) as insecure:
        assert insecure.port > 0


async def test_a_sandbox_server_without_tls_listens_only_on_loopback(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="--insecure"):
        await SandboxServer(tmp_path, host="0.0.0.0").start()
    async with SandboxServer(tmp_path, host="0.0.0.0", insecure=True) as server:
        assert server.port > 0


async def test_tokens_need_tls(tmp_path: Path, cluster_certs: Path) -> None:
    config = replace(FAST, credentials_file=cluster_certs / "credentials")
    with pytest.raises(TlsError, match="only over TLS"):
        await MasterServer(config, "127.0.0.1", 0, 0).start()


async def test_the_master_command_refuses_the_network_without_tls_unless_insecure(
    tmp_path: Path,
) -> None:
    flags = ("--host", "0.0.0.0", "--port", "0", "--http-port", "0")
    code, _, err = await mesolite("master", *flags, "--work-dir", str(tmp_path / "refused"))
    assert code == 2 and "--insecure" in err
    master = MasterProcess(tmp_path, "--host", "0.0.0.0", "--insecure")
    try:
        await master.start()
        assert "INSECURE" in master.banner
    finally:
        await master.stop()


async def test_the_master_and_state_commands_over_tls(tmp_path: Path, cluster_certs: Path) -> None:
    tls = ("--tls-dir", str(cluster_certs / "master"))
    master = MasterProcess(tmp_path, *tls, "--credentials", str(cluster_certs / "credentials"))
    try:
        await master.start()
        assert "TLS, every call authenticated" in master.banner
        state = ("state", "--master", master.http_address, "--json")
        for bundle in ("admin", "ci"):  # a certificate; a token beside the CA
            code, out, err = await mesolite(*state, "--tls-dir", str(cluster_certs / bundle))
            assert code == 0 and json.loads(out)["cluster"], err
        code, _, err = await mesolite(*state, "--ca", str(cluster_certs / "ca.crt"))
        assert code == 1 and "401" in err
        code, _, err = await mesolite(*state)  # plaintext to an HTTPS port
        assert code == 1 and "--tls-dir" in err
    finally:
        await master.stop()


async def test_another_principal_cannot_take_over_a_framework_on_the_wire(
    cluster: LocalCluster, cluster_certs: Path
) -> None:
    """The hijack of issue 11: read a framework's id from /state, subscribe with it.
    Refused PERMISSION_DENIED, for a certificate and for a token; the victim keeps
    its stream."""
    fw = RecordingFramework("victim", tls=cluster.bundle("framework"))
    async with running(fw, cluster.address):
        await wait_for_condition(lambda: fw.framework_id is not None, what="subscribed")
        assert fw.framework_id is not None
        hijack = scheduler_pb2.Call(
            subscribe=scheduler_pb2.Call.Subscribe(
                framework_info=scheduler_pb2.FrameworkInfo(
                    name="victim", role="*", framework_id=fw.framework_id
                )
            )
        )
        ca_only = TlsConfig(cluster_certs / "ca.crt")
        for tls, address, bearer in [
            (cluster.bundle("admin"), cluster.address, None),
            (ca_only, cluster.server.token_address, token(cluster_certs)),
        ]:
            channel = grpc_utils.create_channel(address, tls, bearer)
            try:
                call = scheduler_pb2_grpc.SchedulerStub(channel).Connect(iter([hijack]))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in call:
                        pass
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            finally:
                await channel.close()
        assert cluster.master.frameworks[fw.framework_id].connected
        assert cluster.master.frameworks[fw.framework_id].principal == "framework"


async def test_the_cli_trusts_only_the_masters_certificate_not_an_agents(
    tmp_path: Path, cluster_certs: Path
) -> None:
    """An agent's certificate is good for its host's addresses (its sandbox server), so
    one on the master's machine could answer the CLI at the master's address. The CLI
    checks for the name only the master's certificate holds (`mesolite-master`)."""

    async def fake_state(request: web.Request) -> web.Response:
        return web.json_response({"cluster": {"forged": True}})

    app = web.Application()
    app.router.add_get("/state", fake_state)
    runner = web.AppRunner(app)
    await runner.setup()
    agent_tls = TlsConfig.from_dir(cluster_certs / "agent")
    site = web.TCPSite(
        runner, "127.0.0.1", 0, ssl_context=agent_tls.server_context(require_client_cert=False)
    )
    await site.start()
    try:
        address = f"127.0.0.1:{site.port}"
        admin = TlsConfig.from_dir(cluster_certs / "admin")
        # The agent's certificate does hold this address: only the name check refuses it.
        assert await http_status(f"https://{address}/state", admin.client_context()) == 200
        code, out, err = await mesolite(
            "state", "--master", address, "--json", "--tls-dir", str(cluster_certs / "admin")
        )
        assert code == 1 and "forged" not in out, (out, err)
        assert "certificate" in err.lower(), err
    finally:
        await runner.cleanup()
