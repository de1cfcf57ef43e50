"""Fuzz the HTTP servers: the master's (/state, /metrics, the UI, /events, the sandbox
proxy) and an agent's sandbox server, with requests from tests/support/http_strategies.py.

A real master and a real agent (tests/cluster.py) with one finished task, whose
sandbox holds a stdout and a stderr, so that real ids reach the file reads. Each
example sends a few requests, by aiohttp or as raw bytes on a TCP connection; every
answer must be below 500 and hold no traceback, nothing may be logged at error
level, and the master must still answer GET /state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp.http_exceptions import HttpProcessingError
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs
from yarl import URL

from mesolite import certs, convert, grpc_utils
from mesolite.master.ui_routes import broadcaster
from mesolite.tls import TlsConfig
from mesolite.v1 import common_pb2, scheduler_pb2
from tests.cluster import LocalCluster
from tests.support import http_strategies as hs
from tests.support.calls import launch, subscribe
from tests.support.fuzzing import (
    Figures,
    error_logs,
    figures,
    fuzz_settings,
    fuzz_timeout,
    started,
)
from tests.support.wire_streams import WireStreams
from tests.waiting import wait_for_condition, within

pytestmark = [pytest.mark.slow, fuzz_timeout(300)]

# About 1,800 requests in all, under 10 s on a loaded 2-core machine.
CI_EXAMPLES = {"plain": 400, "tls": 300}
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
# /events streams left to end on their own (the server notices within a second; it
# allows 4 per client, then 429, and 64 in all, then 503).
EVENT_STREAMS = 32


@dataclass(frozen=True)
class Reach:
    """How the fuzz reaches the servers: plain HTTP to both, or HTTPS to the master with
    authentication on (the sandbox server then answers the master only)."""

    scheme: str
    kinds: tuple[str, ...]  # which server each request goes to, as often as listed
    token: str | None = None  # a real bearer token, sent with most requests


PLAIN = Reach("http", ("master",) * 6 + ("sandbox",) * 3 + ("raw",))


class HttpFuzz:
    """What one test run sends and checks; its servers live across the examples."""

    def __init__(
        self,
        cluster: LocalCluster,
        reach: Reach,
        ids: hs.Ids,
        http: aiohttp.ClientSession,
        found: Figures,
        stdlib_errors: Callable[[], list[logging.LogRecord]],
    ) -> None:
        self.cluster = cluster
        self.reach = reach
        self.ids = ids
        self.http = http
        self.found = found
        self.stdlib_errors = stdlib_errors
        self.master = cluster.server.http_address
        self.sandboxes = cluster.sandbox_servers[0].address
        runner = cluster.server._http
        assert runner is not None
        self.events = broadcaster(runner.app)

    async def example(self, data: st.DataObject) -> None:
        with capture_logs() as logs:
            for _ in range(data.draw(st.integers(1, 4), label="requests")):
                kind = data.draw(st.sampled_from(self.reach.kinds), label="server")
                if kind == "raw":
                    address = data.draw(st.sampled_from((self.master, self.sandboxes)))
                    await self.raw(address, data.draw(hs.raw_requests(), label="bytes"))
                elif kind == "master":
                    request = data.draw(hs.master_requests(self.ids))
                    # Three in four carry the token (hypothesis favours the low end: 0).
                    if self.reach.token and data.draw(st.integers(0, 3), label="token") < 3:
                        token = ("Authorization", f"Bearer {self.reach.token}")
                        request = replace(request, headers=(token, *request.headers))
                    await self.send(self.master, request)
                else:
                    await self.send(self.sandboxes, data.draw(hs.sandbox_requests(self.ids)))
                self.found.inputs += 1
            await self.still_serving()
            assert error_logs(logs) == [], error_logs(logs)
        assert self.stdlib_errors() == [], self.stdlib_errors()
        self.found.examples += 1

    async def send(self, address: str, request: hs.Request) -> None:
        url = URL(f"{self.reach.scheme}://{address}{request.target}", encoded=True)
        try:
            async with self.http.request(
                request.method,
                url,
                headers=list(request.headers),
                data=request.body or None,
                allow_redirects=False,
            ) as response:
                body = await self.read(request, response)
        except aiohttp.ClientResponseError:
            # aiohttp's client could not read the answer (to a HEAD it could not parse,
            # aiohttp's server answers 400 with a body). The server is judged by its
            # logs and the next GET /state.
            self.found.refused += 1
            return
        assert response.status < 500, (request, response.status, body[:300])
        assert b"Traceback" not in body, (request, body[:2000])
        if response.status >= 400:
            self.found.refused += 1

    async def read(self, request: hs.Request, response: aiohttp.ClientResponse) -> bytes:
        if response.content_type != "text/event-stream":
            return await within(response.read(), 20, f"the answer to {request}")
        # /events: its first event, then the client goes. The server notices within a
        # second; below its limit of streams (64), the test need not wait for that.
        await within(response.content.readuntil(b"\n\n"), 20, "the first event")
        response.close()
        if self.events.clients >= EVENT_STREAMS:
            await wait_for_condition(lambda: self.events.clients == 0, what="/events to end")
        return b""

    async def raw(self, address: str, data: bytes) -> None:
        """`data` on a connection of its own, which the client then half-closes."""
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(data)
            await writer.drain()
            writer.write_eof()
            answer = await within(reader.read(), 20, "the server to answer and close")
        except ConnectionError:
            answer = b""  # the server dropped the connection: an answer too
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        statuses = [int(s) for s in STATUS_LINE.findall(answer)]
        assert all(s < 500 for s in statuses), (data[:200], answer[:500])
        assert b"Traceback" not in answer, answer[:2000]
        if any(s >= 400 for s in statuses):
            self.found.refused += 1

    async def still_serving(self) -> None:
        token = {"Authorization": f"Bearer {self.reach.token}"} if self.reach.token else {}
        url = f"{self.reach.scheme}://{self.master}/state"
        async with self.http.get(url, headers=token) as response:
            assert response.status == 200
            assert (await response.json())["agents"]


def parser_refusal(record: logging.LogRecord) -> bool:
    """aiohttp's own refusal of a request it cannot parse: answered 400, and logged at
    error level with a traceback (aiohttp does so for every malformed request)."""
    error = record.exc_info[1] if record.exc_info else None
    return record.name == "aiohttp.server" and isinstance(error, HttpProcessingError)


async def finished_task(cluster: LocalCluster, tls: TlsConfig | None) -> hs.Ids:
    """A real agent that ran a task which wrote to stdout and stderr (its framework
    connects with `tls`, if the cluster has it, and acknowledges every update)."""
    agent = await cluster.add_agent("cpus:1;mem:256")
    assert agent.agent_id
    async with grpc_utils.create_channel(cluster.address, tls=tls) as channel:
        streams = WireStreams(channel)
        fw = streams.framework(subscribe("writer"))
        offers = await fw.answered(lambda e: e.HasField("offers"), 20)
        assert offers, (fw.code, fw.details)
        offer = next(e.offers.offers[0] for e in fw.events if e.HasField("offers"))
        fw.send(launch(offer, "out", {"cpus": 1.0, "mem": 64.0}, "echo hello; echo oops >&2"))
        acknowledged = 0
        while not any(ended(e) for e in fw.events):
            assert await fw.answered(lambda e: e.HasField("update"), 20), fw.code
            for e in [e for e in fw.events if e.HasField("update")][acknowledged:]:
                fw.send(acknowledge(e.update.status))
                acknowledged += 1
        framework_id = fw.events[0].subscribed.framework_id
        await streams.aclose()
    return hs.Ids(agent.agent_id, framework_id, "out")


def ended(event: scheduler_pb2.Event) -> bool:
    return (
        event.HasField("update")
        and convert.task_state_from_proto(event.update.status.state).is_terminal
    )


def acknowledge(status: common_pb2.TaskStatus) -> scheduler_pb2.Call:
    ack = scheduler_pb2.Call.Acknowledge(
        agent_id=status.agent_id, task_id=status.task_id, update_id=status.update_id
    )
    return scheduler_pb2.Call(acknowledge=ack)


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and bundles for a cluster with TLS, and a bearer token for principal "ci"."""
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, tokens=["ci"])
    return directory


@pytest.mark.parametrize("reaching", ["plain", "tls"])
def test_the_http_servers_survive_fuzzed_requests(
    reaching: str, tmp_path: Path, cluster_certs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def stdlib_errors() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.ERROR and not parser_refusal(r)]

    tls = reaching == "tls"
    reach = PLAIN
    if tls:
        token = (cluster_certs / "ci" / "token").read_text().strip()
        reach = Reach("https", ("master",), token)
    client = TlsConfig.from_dir(cluster_certs / "ci").client_context() if tls else None
    with (
        asyncio.Runner() as loop,
        figures(f"HTTP ({reaching})") as found,
        started(loop, LocalCluster(tmp_path, certs=cluster_certs if tls else None)) as cluster,
        started(loop, _session(client)) as http,
    ):
        framework_tls = cluster.bundle("framework") if tls else None
        ids = loop.run(finished_task(cluster, framework_tls))
        fuzz_http = HttpFuzz(cluster, reach, ids, http, found, stdlib_errors)

        @fuzz_settings(CI_EXAMPLES[reaching])
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            loop.run(fuzz_http.example(data))

        fuzz()


@contextlib.asynccontextmanager
async def _session(tls: ssl.SSLContext | None) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=tls) if tls else None
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        yield http


async def test_a_segment_longer_than_a_file_name_is_a_bad_request(tmp_path: Path) -> None:
    """Regression (found by this fuzz): the agent answered 500 (ENAMETOOLONG), and the
    master's proxy 502."""
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:1;mem:64", name="agent1")
        (tmp_path / "agent1" / "sandboxes" / "f").mkdir(parents=True)  # reads reach the disk
        long = "a" * 256
        sandboxes = cluster.sandbox_servers[0].address
        urls = [
            f"http://{sandboxes}/sandbox/f/{long}/stdout",
            f"http://{cluster.server.http_address}/agents/{agent.agent_id}/sandbox/f/{long}/stdout",
        ]
        async with aiohttp.ClientSession() as http:
            for url in urls:
                async with http.get(url) as response:
                    assert response.status == 400, (url, await response.text())
                    assert "invalid task id" in await response.text()
