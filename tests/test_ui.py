"""The web UI's HTTP side: the page and its assets, /events, and task sandboxes
(the agent's sandbox server, and the master's proxy to it) on real servers."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from mesolite.agent.sandbox_http import SandboxServer, create_sandbox_app
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.master.master import MasterConfig
from mesolite.master.server import MasterServer
from mesolite.master.ui_routes import StateBroadcaster, StreamLimits, broadcaster
from mesolite.sandbox_protocol import DEFAULT_LENGTH, OFFSET_HEADER, SIZE_HEADER
from tests.cluster import LocalCluster
from tests.event_streams import events_app
from tests.recording import RecordingFramework, running
from tests.support.snapshots import empty_snapshot
from tests.waiting import wait_for_condition, within


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls.extend(v for k, v in attrs if k in ("src", "href") and v is not None)


async def _events(response: aiohttp.ClientResponse) -> AsyncGenerator[tuple[str, str], None]:
    """(event, data) for each event of a text/event-stream; comments are skipped."""
    event, data = "message", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if data:
                yield event, data
            event, data = "message", ""
        elif line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            data += line[len("data: ") :]


async def _next_state(events: AsyncIterator[tuple[str, str]]) -> dict[str, Any]:
    async for event, data in events:
        if event == "state":
            state: dict[str, Any] = json.loads(data)
            return state
    raise AssertionError("the event stream ended")


async def test_page_and_its_assets_are_local_only(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster, aiohttp.ClientSession() as http:
        base = URL(f"http://{cluster.server.http_address}/")
        async with http.get(base) as response:
            assert response.status == 200
            assert response.content_type == "text/html"
            assert "default-src 'none'" in response.headers["Content-Security-Policy"]
            page = await response.text()
        links = _Links()
        links.feed(page)
        assets = [u for u in links.urls if not u.startswith("data:")]
        assert sorted(assets) == ["ui/app.js", "ui/style.css"]
        for url in assets:
            async with http.get(base.join(URL(url))) as response:
                assert response.status == 200, url
                text = await response.text()
            # Nothing fetched from elsewhere: no absolute URLs but the SVG namespace name.
            others = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s'\"]*", text)) - {
                "http://www.w3.org/2000/svg"
            }
            assert others == set(), url
            assert "@import" not in text and "url(" not in text
        async with http.get(base / "ui" / "missing.js") as response:
            assert response.status == 404


async def test_events_stream_a_first_snapshot_then_changes(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster, aiohttp.ClientSession() as http:
        await cluster.add_agent("cpus:2;mem:1024", name="first")
        url = f"http://{cluster.server.http_address}/events"
        async with http.get(url) as response:
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            events = _events(response)
            first = await within(_next_state(events), 10, "the first snapshot")
            assert [a["hostname"] for a in first["agents"]] == ["first"]
            assert first["agents"][0]["address"].startswith("127.0.0.1:")
            assert first["cluster"]["total"] == {"cpus": 2.0, "mem": 1024.0}
            assert first["completed_tasks"] == []
            # Every key of GET /state is there.
            assert set(await cluster.state()) <= set(first)

            await cluster.add_agent("cpus:1;mem:512", name="second")

            async def until_two_agents() -> dict[str, Any]:
                while len((state := await _next_state(events))["agents"]) < 2:
                    pass
                return state

            second = await within(until_two_agents(), 10, "an event with the second agent")
            assert second["cluster"]["total"] == {"cpus": 3.0, "mem": 1536.0}
        app_broadcaster = broadcaster(cluster.server._http.app)  # type: ignore[union-attr]
        await wait_for_condition(lambda: app_broadcaster.clients == 0, 10, "the stream to end")


async def test_master_stops_promptly_with_event_streams_open(tmp_path: Path) -> None:
    server = MasterServer(MasterConfig(allocation_interval=0.2), "127.0.0.1", 0, 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://{server.http_address}/events"
            async with http.get(url) as first, http.get(url) as second:
                for response in (first, second):
                    await within(_next_state(_events(response)), 10, "a first snapshot")
                await within(server.stop(grace=0.1), 5, "the master to stop")
                for response in (first, second):
                    # The streams end (cleanly or cut off), they do not hang.
                    async def drained(response: aiohttp.ClientResponse = response) -> None:
                        try:
                            while await response.content.readany():
                                pass
                        except aiohttp.ClientPayloadError:
                            pass

                    await within(drained(), 5, "the stream to end")
    finally:
        if server.master is not None and not server._closed.is_set():
            await server.stop()


async def test_events_of_an_ever_changing_state_come_once_per_interval() -> None:
    # Every render differs (n counts them) and records when it was made, on the
    # loop's clock. The stream's first event is rendered when it connects; after
    # that the broadcaster renders at most once per interval, however late a
    # loaded machine delivers the events. That is what is asserted, not how many
    # events arrive in a second (which depends on the machine).
    interval = 0.2
    loop = asyncio.get_running_loop()
    calls = itertools.count()
    hub = StateBroadcaster(
        lambda: empty_snapshot(master_id=f"m{next(calls)}", time=loop.time()),
        interval=interval,
        limits=StreamLimits(total=1),
    )
    async with events_app(hub) as client:
        response = await client.get("/events")
        assert response.status == 200
        assert (await client.get("/events")).status == 503  # limits.total
        received: list[dict[str, Any]] = []
        stream = _events(response)
        while len(received) < 6:
            event, data = await within(anext(stream), 10, "the next state event")
            assert event == "state"
            received.append(json.loads(data))
        await stream.aclose()
    renders = [int(e["master_id"][1:]) for e in received]
    assert renders == sorted(set(renders)), renders  # each change once, in order
    times = [e["time"] for e in received[1:]]  # rendered by the broadcaster's loop
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= interval - 1e-3, gaps


async def test_an_unchanging_state_is_sent_once_then_heartbeats() -> None:
    clock = itertools.count()
    # Only the clock changes: no new event.
    hub = StateBroadcaster(lambda: empty_snapshot(time=float(next(clock))), heartbeat=0.3)
    async with events_app(hub) as client:
        response = await client.get("/events")
        lines: list[bytes] = []
        while lines.count(b": keepalive\n") < 2:
            lines.append(await within(response.content.readline(), 5, "a heartbeat"))
        assert sum(line.startswith(b"event: state") for line in lines) == 1
        hub.close()  # as on shutdown: the stream ends
        rest = await within(response.content.read(), 5, "the stream to end")
        assert rest.strip() == b""


async def test_sandbox_proxy_serves_a_real_tasks_output(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster, aiohttp.ClientSession() as http:
        agent = await cluster.add_agent("cpus:2;mem:1024")
        fw = RecordingFramework("printer")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            command = "echo hello from the sandbox; echo oops >&2"
            await fw.launch(offer, [TaskSpec("echo-1", command, Resources(cpus=1, mem=64))])
            await fw.wait_state("echo-1", TaskState.FINISHED)
            base = f"http://{cluster.server.http_address}/agents/{agent.agent_id}/sandbox"
            task = f"{base}/{fw.framework_id}/echo-1"

            async with http.get(f"{task}/stdout") as response:
                assert response.status == 200
                assert await response.text() == "hello from the sandbox\n"
                assert response.headers[OFFSET_HEADER] == "0"
                assert response.headers[SIZE_HEADER] == "23"
            async with http.get(f"{task}/stderr") as response:
                assert await response.text() == "oops\n"
            async with http.get(f"{task}/stdout", params={"offset": 6, "length": 4}) as response:
                assert await response.text() == "from"
                assert response.headers[OFFSET_HEADER] == "6"
            async with http.get(f"{task}/stdout", params={"length": 8}) as response:
                assert await response.text() == "sandbox\n"  # no offset: the tail

            # The page lists the ended task, so its output stays one click away.
            async with http.get(f"http://{cluster.server.http_address}/events") as response:
                state = await within(_next_state(_events(response)), 10, "a snapshot")
            ended = {t["id"]: t for t in state["completed_tasks"]}
            assert ended["echo-1"]["state"] == "TASK_FINISHED"
            assert ended["echo-1"]["agent_id"] == agent.agent_id

            for bad, status in [
                (f"{base}/{fw.framework_id}/nope/stdout", 404),  # no such task
                (f"{task}/task.json", 404),  # only stdout and stderr
                (f"{task}/stdout?offset=-1", 400),
                (f"{task}/stdout?length=x", 400),
                (f"http://{cluster.server.http_address}/agents/nope/sandbox/f/t/stdout", 404),
            ]:
                async with http.get(URL(bad, encoded=True)) as response:
                    assert response.status == status, bad


@pytest.mark.parametrize(
    "path",
    [
        "/{fw}/..%2F..%2Fsecret/stdout",
        "/..%2F..%2Fsecret/x/stdout",
        "/{fw}/../../secret/stdout",
        "/../../secret/stdout",
        "/%2E%2E/%2E%2E/stdout",
        "/{fw}/..%5C..%5Csecret/stdout",
        "/{fw}/..%00/stdout",
    ],
)
async def test_sandbox_proxy_rejects_path_traversal(tmp_path: Path, path: str) -> None:
    async with LocalCluster(tmp_path) as cluster, aiohttp.ClientSession() as http:
        agent = await cluster.add_agent("cpus:1;mem:256")
        secret = tmp_path / "agent1" / "secret"
        secret.mkdir()
        (secret / "stdout").write_text("not for the page")
        fw = "some-framework"
        (tmp_path / "agent1" / "sandboxes" / fw / "t").mkdir(parents=True)
        base = f"http://{cluster.server.http_address}/agents/{agent.agent_id}/sandbox"
        async with http.get(URL(base + path.format(fw=fw), encoded=True)) as response:
            assert response.status in (400, 404)
            assert "not for the page" not in await response.text()


@pytest.fixture
async def sandbox_client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    sandbox = tmp_path / "sandboxes" / "fw" / "task"
    sandbox.mkdir(parents=True)
    (sandbox / "stdout").write_bytes(bytes(range(256)) * 1024)  # 256 KiB
    (sandbox / "stderr").write_text("")
    async with TestClient(TestServer(create_sandbox_app(tmp_path))) as client:
        yield client


async def test_sandbox_server_defaults_to_the_tail_and_caps_the_length(
    sandbox_client: TestClient[Any, Any],
) -> None:
    response = await sandbox_client.get("/sandbox/fw/task/stdout")
    assert response.status == 200
    body = await response.read()
    assert len(body) == DEFAULT_LENGTH
    assert response.headers[SIZE_HEADER] == str(256 * 1024)
    assert response.headers[OFFSET_HEADER] == str(256 * 1024 - DEFAULT_LENGTH)
    response = await sandbox_client.get("/sandbox/fw/task/stdout?offset=0&length=99999999")
    assert len(await response.read()) == 256 * 1024  # the whole file: under the 1 MiB cap
    response = await sandbox_client.get("/sandbox/fw/task/stdout?offset=999999")
    assert await response.read() == b""
    assert response.headers[OFFSET_HEADER] == str(256 * 1024)
    response = await sandbox_client.get("/sandbox/fw/task/stderr")
    assert response.status == 200 and await response.read() == b""


async def test_sandbox_server_serves_no_links_nor_special_files(
    sandbox_client: TestClient[Any, Any], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdout").write_text("agent-only")
    linked = tmp_path / "sandboxes" / "fw" / "linked"
    linked.mkdir()
    (linked / "stdout").symlink_to(outside / "stdout")  # a task can do this to its sandbox
    os.mkfifo(linked / "stderr")  # must not block the reader
    (tmp_path / "sandboxes" / "fw" / "dirlink").symlink_to(outside)
    for path in [
        "/sandbox/fw/linked/stdout",
        "/sandbox/fw/linked/stderr",
        "/sandbox/fw/dirlink/stdout",
        "/sandbox/fw/missing/stdout",
    ]:
        response = await asyncio.wait_for(sandbox_client.get(path), 5)
        assert response.status == 404, path
        assert "agent-only" not in await response.text()


async def test_sandbox_server_address_is_what_it_listens_on(tmp_path: Path) -> None:
    async with SandboxServer(tmp_path, "127.0.0.1", 0) as server, aiohttp.ClientSession() as http:
        host, port = server.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) == server.port > 0
        async with http.get(f"http://{server.address}/sandbox/f/t/stdout") as response:
            assert response.status == 404
