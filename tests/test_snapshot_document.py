"""GET /state does not hold the event loop: the snapshot is taken on the loop, the JSON
is made in a worker thread, and requests that arrive together share one snapshot.

With 2,000 frameworks, each GET /state held the loop for its whole encoding, and
eight at once for eight encodings (scripts/state_loop_stall.py measures it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler

from mesolite.master import http, metrics
from mesolite.master.http import create_app
from mesolite.master.read_model import build_snapshot
from mesolite.master.snapshot_document import SnapshotDocument, encode_json
from mesolite.snapshot import ClusterSnapshot
from tests.support.core import CoreHarness
from tests.support.snapshots import empty_snapshot
from tests.waiting import wait_for_condition, within

T = TypeVar("T")


def busy_core() -> CoreHarness:
    core = CoreHarness()
    frameworks = [core.subscribe(f"fw{i}", role=f"r{i % 3}") for i in range(30)]
    for i in range(10):
        core.add_agent("cpus:8;mem:8192;gpus:1", hostname=f"h{i}")
    for fw in frameworks[:10]:
        [offer, *_] = core.allocate_for(fw)
        core.launch(fw, offer, f"{fw.framework_id}-t", "cpus:1;mem:64")
    core.master.allocate()
    return core


class Gate:
    """Wraps the function that does a document's work off the loop: records the threads
    it runs on, and holds it (off the loop) until `release()`."""

    def __init__(self) -> None:
        self.loop_thread = threading.current_thread()
        self.threads: list[threading.Thread] = []
        self._released = threading.Event()

    def wrap(self, function: Callable[..., T]) -> Callable[..., T]:
        def gated(*args: Any) -> T:
            self.threads.append(threading.current_thread())
            if threading.current_thread() is not self.loop_thread:
                assert self._released.wait(10), "the test never released the work"
            return function(*args)

        return gated

    def release(self) -> None:
        self._released.set()


@pytest.mark.parametrize("path", ["/state", "/metrics"])
async def test_concurrent_requests_share_a_snapshot_rendered_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    core = busy_core()
    gate = Gate()
    builds = 0

    def counting_build(master: Any, **kwargs: Any) -> ClusterSnapshot:
        nonlocal builds
        builds += 1
        return build_snapshot(master, **kwargs)

    monkeypatch.setattr(http, "build_snapshot", counting_build)
    if path == "/state":
        monkeypatch.setattr(ClusterSnapshot, "to_json", gate.wrap(ClusterSnapshot.to_json))
    else:
        monkeypatch.setattr(metrics, "state_metrics", gate.wrap(metrics.state_metrics))
    arrived = 0

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        return await handler(request)

    app = create_app(core.master)
    app.middlewares.append(count)
    async with TestClient(TestServer(app)) as client:

        async def get() -> bytes:
            response = await client.get(path)
            assert response.status == 200
            return await response.read()

        requests = [asyncio.create_task(get()) for _ in range(8)]
        try:
            await wait_for_condition(lambda: arrived == 8, 10, "all eight requests in")
        finally:
            gate.release()
        bodies = await within(asyncio.gather(*requests), 20, "the answers")
    assert builds <= 2, builds  # the first request's, and one for all that came during it
    assert gate.threads and gate.loop_thread not in gate.threads
    if path == "/state":
        state = build_snapshot(core.master).to_json()
        assert all(json.loads(body) == state for body in bodies)
    else:
        assert all(b"mesolite_framework_tasks{" in body for body in bodies)


@pytest.mark.unit
async def test_an_answer_is_never_older_than_its_request() -> None:
    versions = itertools.count(1)
    gate = threading.Event()
    on_loop: list[bool] = []

    def snapshot() -> ClusterSnapshot:
        return empty_snapshot(master_id=str(next(versions)))

    def encode(s: ClusterSnapshot) -> bytes:
        on_loop.append(threading.current_thread() is threading.main_thread())
        assert gate.wait(10)
        return s.master_id.encode()

    document = SnapshotDocument(snapshot, encode)
    first = asyncio.ensure_future(document.body())
    await asyncio.sleep(0)  # its snapshot (version 1) is taken
    during = [asyncio.ensure_future(document.body()) for _ in range(5)]
    gate.set()
    assert await within(first, 10) == b"1"
    # Arrived after version 1 was taken: they share version 2, taken after the first
    # encoding, not version 1.
    assert await within(asyncio.gather(*during), 10) == [b"2"] * 5
    assert await document.body() == b"3"  # alone: a snapshot of its own
    assert document.builds == 3 and on_loop == [False] * 3


@pytest.mark.unit
async def test_a_client_that_goes_away_does_not_cancel_the_others() -> None:
    gate = threading.Event()

    def encode(s: ClusterSnapshot) -> bytes:
        assert gate.wait(10)
        return b"state"

    document = SnapshotDocument(empty_snapshot, encode)
    leaving, staying = (asyncio.ensure_future(document.body()) for _ in range(2))
    await asyncio.sleep(0)
    leaving.cancel()
    gate.set()
    assert await within(staying, 10) == b"state"


@pytest.mark.unit
@pytest.mark.parametrize(
    "value",
    [
        {"a": [1, 2.5, None, True], "b": {"c": {"d": ["é", "\u2028"]}}, "e": []},
        [{"x": 1}, [], {}, "s"],
        "plain",
        {"": {"": {"": {}}}},
    ],
)
def test_encode_json_is_json_dumps(value: Any) -> None:
    assert encode_json(value) == json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.unit
def test_the_snapshot_document_is_the_snapshots_json() -> None:
    core = busy_core()
    snapshot = build_snapshot(core.master)
    document = snapshot.to_json()
    assert encode_json(document) == json.dumps(document, separators=(",", ":")).encode()
    assert len(document["frameworks"]) == 30
