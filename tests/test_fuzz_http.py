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
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.http_exceptions import HttpProcessingError
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs
from yarl import URL

from mesolite import convert
from mesolite.master.ui_routes import broadcaster
from mesolite.v1 import common_pb2, scheduler_pb2
from tests.cluster import LocalCluster
from tests.raw_client import RawFramework, resources
from tests.support import http_strategies as hs
from tests.support.fuzzing import (
    Figures,
    error_logs,
    figures,
    fuzz_settings,
    fuzz_timeout,
    started,
)
from tests.waiting import wait_for_condition, within

pytestmark = [pytest.mark.slow, fuzz_timeout(300)]

# About 10 s and 1,300 requests on a loaded 2-core machine.
CI_EXAMPLES = 500
STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3}) ")
KINDS = ("master",) * 6 + ("sandbox",) * 3 + ("raw",)
EVENT_STREAMS = 32  # /events streams left to end on their own (the server allows 64)


class HttpFuzz:
    """What one test run sends and checks; its servers live across the examples."""

    def __init__(
        self,
        cluster: LocalCluster,
        ids: hs.Ids,
        http: aiohttp.ClientSession,
        found: Figures,
        stdlib_errors: Callable[[], list[logging.LogRecord]],
    ) -> None:
        self.cluster = cluster
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
                kind = data.draw(st.sampled_from(KINDS), label="server")
                if kind == "raw":
                    address = data.draw(st.sampled_from((self.master, self.sandboxes)))
                    await self.raw(address, data.draw(hs.raw_requests(), label="bytes"))
                elif kind == "master":
                    await self.send(self.master, data.draw(hs.master_requests(self.ids)))
                else:
                    await self.send(self.sandboxes, data.draw(hs.sandbox_requests(self.ids)))
                self.found.inputs += 1
            await self.still_serving()
            assert error_logs(logs) == [], error_logs(logs)
        assert self.stdlib_errors() == [], self.stdlib_errors()
        self.found.examples += 1

    async def send(self, address: str, request: hs.Request) -> None:
        url = URL(f"http://{address}{request.target}", encoded=True)
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
        async with self.http.get(f"http://{self.master}/state") as response:
            assert response.status == 200
            assert (await response.json())["agents"]


def parser_refusal(record: logging.LogRecord) -> bool:
    """aiohttp's own refusal of a request it cannot parse: answered 400, and logged at
    error level with a traceback (aiohttp does so for every malformed request)."""
    error = record.exc_info[1] if record.exc_info else None
    return record.name == "aiohttp.server" and isinstance(error, HttpProcessingError)


async def finished_task(cluster: LocalCluster) -> hs.Ids:
    """A real agent that ran a task which wrote to stdout and stderr."""
    agent = await cluster.add_agent("cpus:1;mem:256")
    async with RawFramework(cluster.address, name="writer") as fw:
        offer = (await fw.next_event("offers")).offers.offers[0]
        task = common_pb2.TaskInfo(
            task_id="out",
            command="echo hello; echo oops >&2",
            resources=resources(cpus=1, mem=64),
        )
        accept = scheduler_pb2.Call.Accept(offer_ids=[offer.offer_id], tasks=[task])
        fw.send(scheduler_pb2.Call(accept=accept))
        while not convert.task_state_from_proto((await fw.next_update()).state).is_terminal:
            pass
        assert agent.agent_id
        return hs.Ids(agent.agent_id, fw.framework_id, "out")


def test_the_http_servers_survive_fuzzed_requests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def stdlib_errors() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.ERROR and not parser_refusal(r)]

    with (
        asyncio.Runner() as loop,
        figures("HTTP") as found,
        started(loop, LocalCluster(tmp_path)) as cluster,
        started(loop, _session()) as http,
    ):
        ids = loop.run(finished_task(cluster))
        fuzz_http = HttpFuzz(cluster, ids, http, found, stdlib_errors)

        @fuzz_settings(CI_EXAMPLES)
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            loop.run(fuzz_http.example(data))

        fuzz()


@contextlib.asynccontextmanager
async def _session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
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
