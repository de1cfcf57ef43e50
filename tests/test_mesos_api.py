"""The Mesos v1 scheduler API (POST /api/v1/scheduler, master/mesos_api/): status codes,
RecordIO framing, and each call and event in the JSON shapes of Mesos'
docs/scheduler-http-api.md, against a real master and agent on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mesolite.master import messages as msg
from mesolite.master.leadership import MasterAddress
from mesolite.master.mesos_api import convert, media, recordio, wire
from mesolite.master.mesos_api.endpoint import MAX_BODY
from mesolite.master.mesos_api.subscriptions import HELD_CONNECTIONS, Subscription, Subscriptions
from mesolite.master.offers import InvalidTask
from mesolite.model import Offer, StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from mesolite.stream_writer import StreamWriter
from mesolite.v1.mesos import mesos_pb2, scheduler_pb2
from tests.cluster import LocalCluster
from tests.waiting import wait_for_condition

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


def subscribe_call(name: str = "mesos-fw", **info: Any) -> dict[str, Any]:
    return {
        "type": "SUBSCRIBE",
        "subscribe": {"framework_info": {"user": "", "name": name, **info}},
    }


class Stream:
    """One SUBSCRIBE: its response, events as they come, and calls on its stream id."""

    def __init__(self, session: aiohttp.ClientSession, url: str, response: aiohttp.ClientResponse):
        self.session = session
        self.url = url
        self.response = response
        self.stream_id = response.headers["Mesos-Stream-Id"]
        self.events: list[dict[str, Any]] = []
        self.raw = bytearray()
        self._decoder = recordio.Decoder()
        self._acks: list[asyncio.Task[None]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for chunk in self.response.content.iter_any():
            self.raw += chunk
            for record in self._decoder.feed(chunk):
                event = json.loads(record)
                self.events.append(event)
                status = event.get("update", {}).get("status", {})
                if "uuid" in status:  # acknowledged, as pymesos does (implicit acks)
                    self._acks.append(asyncio.create_task(self.acknowledge(status)))

    async def acknowledge(self, status: dict[str, Any]) -> None:
        ack = {"agent_id": status["agent_id"], "task_id": status["task_id"], "uuid": status["uuid"]}
        response = await self.call({"type": "ACKNOWLEDGE", "acknowledge": ack})
        assert response.status == 202

    @property
    def framework_id(self) -> str:
        return str(self.events[0]["subscribed"]["framework_id"]["value"])

    async def event(self, kind: str, start: int = 0) -> dict[str, Any]:
        def found() -> bool:
            return any(e["type"] == kind for e in self.events[start:])

        await wait_for_condition(found, timeout=15)
        return next(e for e in self.events[start:] if e["type"] == kind)

    async def call(self, body: dict[str, Any], **headers: str) -> aiohttp.ClientResponse:
        body = {"framework_id": {"value": self.framework_id}, **body}
        headers = {"Mesos-Stream-Id": self.stream_id, **headers}
        async with self.session.post(self.url, json=body, headers=headers) as r:
            await r.read()
            return r

    async def close(self) -> None:
        self._reader.cancel()
        for ack in self._acks:
            ack.cancel()
        self.response.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path) as c:
        await c.add_agent("cpus:4;mem:1024")
        yield c


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def url_of(cluster: LocalCluster) -> str:
    return f"http://{cluster.server.http_address}/api/v1/scheduler"


async def subscribe(session: aiohttp.ClientSession, cluster: LocalCluster, **info: Any) -> Stream:
    url = url_of(cluster)
    response = await session.post(url, json=subscribe_call(**info), headers=JSON_HEADERS)
    assert response.status == 200
    stream = Stream(session, url, response)
    await stream.event("SUBSCRIBED")
    return stream


async def test_status_codes(cluster: LocalCluster, session: aiohttp.ClientSession) -> None:
    url = url_of(cluster)
    sub = json.dumps(subscribe_call()).encode()

    async def post(body: bytes, **headers: str) -> tuple[int, str]:
        skip = () if "Content-Type" in headers else ("Content-Type",)
        async with session.post(url, data=body, headers=headers, skip_auto_headers=skip) as r:
            return r.status, await r.text()

    async with session.get(url) as r:
        assert (r.status, r.headers["Allow"]) == (405, "POST")
    assert (await post(sub))[0] == 400  # no Content-Type
    assert "Content-Type" in (await post(sub))[1]
    assert (await post(sub, **{"Content-Type": "text/plain"}))[0] == 415
    assert (await post(b"{nope", **{"Content-Type": "application/json"}))[0] == 400
    assert (await post(b"[]", **{"Content-Type": "application/json"}))[0] == 400
    assert (await post(b"\xff\xff", **{"Content-Type": "application/x-protobuf"}))[0] == 400
    status, text = await post(b"{}", **{"Content-Type": "application/json"})
    assert status == 400 and "Failed to validate" in text
    status, text = await post(sub, **{"Content-Type": "application/json", "Accept": "text/html"})
    assert status == 406
    status, text = await post(sub, **{"Content-Type": "application/json", "Mesos-Stream-Id": "x"})
    assert status == 400 and "should not include" in text
    big = b" " * (MAX_BODY + 1)
    assert (await post(big, **{"Content-Type": "application/json"}))[0] == 413

    stream = await subscribe(session, cluster)
    revive = {"type": "REVIVE"}
    assert (await stream.call(revive)).status == 202
    assert (await stream.call(revive, **{"Mesos-Stream-Id": "stale"})).status == 400
    async with session.post(
        url, json={"type": "REVIVE", "framework_id": {"value": stream.framework_id}}
    ) as r:
        assert r.status == 400 and "Mesos-Stream-Id" in await r.text()
    async with session.post(
        url,
        json={"type": "REVIVE", "framework_id": {"value": "nobody"}},
        headers={"Mesos-Stream-Id": stream.stream_id},
    ) as r:
        assert r.status == 400 and "cannot be found" in await r.text()
    no_type = {"framework_id": {"value": stream.framework_id}}
    async with session.post(url, json=no_type, headers={"Mesos-Stream-Id": stream.stream_id}) as r:
        assert r.status == 400
    # Past the core's bound of tasks per ACCEPT: refused before a task is converted.
    task = {"task_id": {"value": "t"}}
    many = {
        "type": "ACCEPT",
        "accept": {
            "offer_ids": [],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": [task] * 1001}}],
        },
    }
    assert (await stream.call(many)).status == 400
    await stream.close()


async def test_not_subscribed_is_403_and_not_over_http_is_403(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    url = url_of(cluster)
    stream = await subscribe(session, cluster, failover_timeout=60)
    framework_id, stream_id = stream.framework_id, stream.stream_id
    await stream.close()
    await wait_for_condition(
        lambda: not cluster.master.frameworks[framework_id].connected, timeout=10
    )
    body = {"type": "REVIVE", "framework_id": {"value": framework_id}}
    async with session.post(url, json=body, headers={"Mesos-Stream-Id": stream_id}) as r:
        assert (r.status, await r.text()) == (403, "Framework is not subscribed\n")


async def test_a_non_leader_redirects_to_the_leader(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    class Follower:
        def is_leading(self) -> bool:
            return False

        def leader(self) -> MasterAddress | None:
            return MasterAddress("m2", "10.0.0.9:5050", "http://10.0.0.9:5051")

        def standbys(self) -> list[MasterAddress]:
            return []

    cluster.master.leadership = Follower()
    async with session.post(
        url_of(cluster), json=subscribe_call(), headers=JSON_HEADERS, allow_redirects=False
    ) as r:
        assert r.status == 307
        assert r.headers["Location"] == "//10.0.0.9:5051/api/v1/scheduler"


async def test_recordio_stream_and_event_shapes(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    stream = await subscribe(session, cluster, capabilities=[{"type": "MULTI_ROLE"}], roles=["web"])
    assert stream.response.headers["Content-Type"].startswith("application/json")
    assert stream.response.headers.get("Transfer-Encoding") == "chunked"
    subscribed = stream.events[0]
    assert subscribed["type"] == "SUBSCRIBED"
    assert set(subscribed["subscribed"]) == {"framework_id", "heartbeat_interval_seconds"}
    offers_event = await stream.event("OFFERS")
    [offer] = offers_event["offers"]["offers"]
    assert set(offer) >= {"id", "framework_id", "agent_id", "hostname", "resources"}
    assert offer["framework_id"] == {"value": stream.framework_id}
    cpus = next(r for r in offer["resources"] if r["name"] == "cpus")
    assert cpus == {
        "name": "cpus",
        "type": "SCALAR",
        "scalar": {"value": 4.0},
        "role": "*",
        "allocation_info": {"role": "web"},
    }
    await stream.event("HEARTBEAT")

    task = {
        "name": "t",
        "task_id": {"value": "t1"},
        "agent_id": offer["agent_id"],
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 32}},
        ],
        "command": {"value": 'test "$MESOS_TASK_ID" = t1 && exit 3'},
    }
    bad = {
        **task,
        "task_id": {"value": "t2"},
        "resources": [
            {"name": "ports", "type": "RANGES", "ranges": {"range": [{"begin": 1, "end": 2}]}}
        ],
    }
    accept = {
        "type": "ACCEPT",
        "accept": {
            "offer_ids": [offer["id"]],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": [task, bad]}}],
            "filters": {"refuse_seconds": -1},  # clamped to the default, not refused
        },
    }
    assert (await stream.call(accept)).status == 202

    def update(task_id: str, state: str) -> dict[str, Any] | None:
        for e in stream.events:
            if e["type"] == "UPDATE":
                status = e["update"]["status"]
                if status["task_id"]["value"] == task_id and status["state"] == state:
                    return dict(status)
        return None

    await wait_for_condition(lambda: update("t2", "TASK_ERROR") is not None, timeout=15)
    error = update("t2", "TASK_ERROR")
    assert error is not None
    assert (error["source"], error["reason"]) == ("SOURCE_MASTER", "REASON_TASK_INVALID")
    assert "uuid" not in error  # the master's own: nothing to acknowledge
    await wait_for_condition(lambda: update("t1", "TASK_FAILED") is not None, timeout=20)
    failed = update("t1", "TASK_FAILED")
    assert failed is not None
    assert set(failed) >= {"task_id", "state", "message", "source", "agent_id", "timestamp", "uuid"}
    # exit 3 only if MESOS_TASK_ID was set; the next update came only once this acked
    assert failed["source"] == "SOURCE_EXECUTOR" and "status 3" in failed["message"]

    # KILL of an unknown task: reconciliation answers TASK_LOST.
    assert (
        await stream.call({"type": "KILL", "kill": {"task_id": {"value": "ghost"}}})
    ).status == 202
    await wait_for_condition(lambda: update("ghost", "TASK_LOST") is not None, timeout=10)
    # ACCEPT of an offer that is gone: TASK_LOST (not partition-aware) with the reason.
    stale = {
        "type": "ACCEPT",
        "accept": {
            "offer_ids": [offer["id"]],
            "operations": [
                {"type": "LAUNCH", "launch": {"task_infos": [{**task, "task_id": {"value": "t3"}}]}}
            ],
        },
    }
    assert (await stream.call(stale)).status == 202
    await wait_for_condition(lambda: update("t3", "TASK_LOST") is not None, timeout=10)
    assert update("t3", "TASK_LOST")["reason"] == "REASON_INVALID_OFFERS"  # type: ignore[index]
    for call in (
        {
            "type": "MESSAGE",
            "message": {
                "agent_id": offer["agent_id"],
                "executor_id": {"value": "e"},
                "data": "aGk=",
            },
        },
        {"type": "REQUEST", "request": {"requests": []}},
        {
            "type": "SHUTDOWN",
            "shutdown": {"agent_id": offer["agent_id"], "executor_id": {"value": "e"}},
        },
        {"type": "RECONCILE", "reconcile": {"tasks": [{"task_id": {"value": "t1"}}]}},
        {"type": "SUPPRESS"},
        {"type": "DECLINE", "decline": {"offer_ids": [offer["id"]]}},
    ):
        assert (await stream.call(call)).status == 202, call
    assert (await stream.call({"type": "TEARDOWN"})).status == 202
    await asyncio.wait_for(stream._reader, 10)  # the stream ends
    # The whole body is RecordIO: records back to back, nothing else.
    decoder = recordio.Decoder()
    records = decoder.feed(bytes(stream.raw))
    assert decoder.pending == 0 and len(records) == len(stream.events)
    assert all(json.loads(r)["type"] for r in records)


async def test_protobuf_bodies_and_events(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    """Calls and events in binary protobuf, RecordIO lengths in bytes (a non-ASCII task id
    is longer in bytes than in characters)."""
    call = scheduler_pb2.Call(type=scheduler_pb2.Call.SUBSCRIBE)
    call.subscribe.framework_info.name = "proto"
    call.subscribe.framework_info.user = ""
    headers = {"Content-Type": media.PROTOBUF, "Accept": media.PROTOBUF}
    url = url_of(cluster)
    async with session.post(url, data=call.SerializeToString(), headers=headers) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith(media.PROTOBUF)
        stream_id = r.headers["Mesos-Stream-Id"]
        decoder = recordio.Decoder()
        events: list[scheduler_pb2.Event] = []

        async def until(found: Callable[[], bool]) -> None:
            async with asyncio.timeout(15):
                while not found():
                    chunk = await r.content.readany()
                    events.extend(scheduler_pb2.Event.FromString(x) for x in decoder.feed(chunk))

        await until(lambda: any(e.type == scheduler_pb2.Event.OFFERS for e in events))
        assert events[0].type == scheduler_pb2.Event.SUBSCRIBED
        framework_id = events[0].subscribed.framework_id
        [offer] = next(e for e in events if e.type == scheduler_pb2.Event.OFFERS).offers.offers
        accept = scheduler_pb2.Call(type=scheduler_pb2.Call.ACCEPT, framework_id=framework_id)
        accept.accept.offer_ids.add().CopyFrom(offer.id)
        op = accept.accept.operations.add(type=mesos_pb2.Offer.Operation.LAUNCH)
        task = op.launch.task_infos.add(name="tâche")
        task.task_id.value = "tâche-ünïcode"  # not a valid id: TASK_ERROR, quoting it
        task.agent_id.CopyFrom(offer.agent_id)
        task.command.value = "true"
        posted = {"Content-Type": media.PROTOBUF, "Mesos-Stream-Id": stream_id}
        async with session.post(url, data=accept.SerializeToString(), headers=posted) as a:
            assert a.status == 202

        def errors() -> list[scheduler_pb2.Event]:
            return [e for e in events if e.update.status.state == mesos_pb2.TASK_ERROR]

        await until(lambda: bool(errors()))
        assert errors()[0].update.status.task_id.value == "tâche-ünïcode"
        await until(lambda: events[-1].type == scheduler_pb2.Event.HEARTBEAT)  # still in step


async def test_a_refused_subscription_is_an_error_event(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    body = subscribe_call(id={"value": "not-known"})
    body["framework_id"] = {"value": "not-known"}
    async with session.post(url_of(cluster), json=body, headers=JSON_HEADERS) as r:
        assert r.status == 200
        [record] = recordio.Decoder().feed(await r.read())
    event = json.loads(record)
    assert event["type"] == "ERROR" and "not known" in event["error"]["message"]


# Units ---------------------------------------------------------------------------


@pytest.mark.unit
def test_recordio_framing() -> None:
    assert recordio.encode(b'{"a":1}') == b'7\n{"a":1}'
    decoder = recordio.Decoder(max_record=10)
    stream = recordio.encode(b"hello") + recordio.encode(b"\n\n")
    assert [r for i in range(len(stream)) for r in decoder.feed(stream[i : i + 1])] == [
        b"hello",
        b"\n\n",
    ]
    with pytest.raises(recordio.RecordIOError):
        recordio.Decoder(max_record=10).feed(b"11\n")
    with pytest.raises(recordio.RecordIOError):
        recordio.Decoder().feed(b"x\nabc")
    with pytest.raises(ValueError):
        recordio.encode(b"")


@pytest.mark.unit
def test_media_negotiation() -> None:
    assert media.content_type("application/json; charset=utf-8") == media.JSON
    assert media.content_type("text/plain") is None
    assert media.response_media(None) == media.JSON
    assert media.response_media("*/*") == media.JSON
    assert media.response_media("application/x-protobuf") == media.PROTOBUF
    assert media.response_media("application/json;q=0, application/*") == media.PROTOBUF
    assert media.response_media("text/html") is None


@pytest.mark.unit
def test_refuse_seconds_clamped_as_mesos() -> None:
    f = mesos_pb2.Filters
    assert convert.refuse_seconds(None) is None
    assert convert.refuse_seconds(f(refuse_seconds=2.5)) == 2.5
    assert convert.refuse_seconds(f()) == 5.0  # Mesos' default
    assert convert.refuse_seconds(f(refuse_seconds=-3)) == 5.0
    assert convert.refuse_seconds(f(refuse_seconds=float("nan"))) == 5.0
    assert convert.refuse_seconds(f(refuse_seconds=1e12)) == 365 * 24 * 3600
    assert convert.refuse_seconds(f(refuse_seconds=float("inf"))) == 365 * 24 * 3600


@pytest.mark.unit
@pytest.mark.parametrize("state", [TaskState.UNREACHABLE, TaskState.DROPPED, TaskState.GONE])
def test_partition_states_are_lost_unless_partition_aware(state: TaskState) -> None:
    status = TaskStatus("t", "f", "a", state, source=StatusSource.MASTER)
    lost = mesos_pb2.TaskState.Name(convert.status_to_mesos(status, partition_aware=False).state)
    aware = mesos_pb2.TaskState.Name(convert.status_to_mesos(status, partition_aware=True).state)
    assert (lost, aware) == ("TASK_LOST", state.value)


@pytest.mark.unit
def test_an_accept_past_the_bound_is_refused_before_conversion() -> None:
    """240,000 tiny tasks: refused on counting the parsed document, in milliseconds (the
    conversion of that many fields takes seconds)."""
    tasks = [{"task_id": {"value": "t"}}] * 240_000
    body = json.dumps(
        {
            "type": "ACCEPT",
            "framework_id": {"value": "f"},
            "accept": {"operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}]},
        }
    ).encode()
    started = time.perf_counter()
    with pytest.raises(wire.BadCall, match="240000 tasks"):
        wire.parse_call(body, media.JSON)
    spent = time.perf_counter() - started
    json_alone = time.perf_counter()
    json.loads(body)
    json_alone = time.perf_counter() - json_alone
    assert spent < 10 * json_alone + 0.05  # counting costs next to nothing beside parsing


@pytest.mark.unit
def test_tasks_mesolite_cannot_run_are_invalid() -> None:
    def task(**fields: Any) -> mesos_pb2.TaskInfo:
        base: dict[str, Any] = {"task_id": {"value": "t"}, "command": {"value": "true"}}
        return json_format_parse({**base, **fields})

    assert isinstance(convert.task_from_mesos(task(), ""), TaskSpec)
    for fields in (
        {"executor": {"executor_id": {"value": "e"}}},
        {"container": {"type": "MESOS"}},
        {"command": {"value": "x", "uris": [{"value": "http://x"}]}},
        {
            "command": {
                "value": "x",
                "environment": {"variables": [{"name": "A", "type": "SECRET"}]},
            }
        },
        {"resources": [{"name": "cpus", "type": "SCALAR", "scalar": {"value": 1}, "role": "r"}]},
    ):
        assert isinstance(convert.task_from_mesos(task(**fields), ""), InvalidTask), fields
    argv = convert.task_from_mesos(
        task(command={"shell": False, "value": "/bin/echo", "arguments": ["echo", "a b"]}), ""
    )
    assert isinstance(argv, TaskSpec) and argv.command == "/bin/echo 'a b'"


@pytest.mark.unit
async def test_subscriptions_bound_streams_and_held_connections() -> None:
    subs = Subscriptions(per_client=2)
    assert subs.admit("p") is None and subs.admit("p") is None
    assert subs.admit("p") is not None  # a third stream of one client
    assert subs.admit("q") is None
    subs.release("p")
    assert subs.admit("p") is None

    class Connection:
        def __init__(self) -> None:
            self.transport = object()
            self._next_keepalive_close_time = 0.0

    outbox: StreamWriter[msg.FrameworkMessage] = StreamWriter(10)
    sub = Subscription("f", None, "p", media.JSON, "*", False, False, outbox)
    subs.add(sub)
    connections = [Connection() for _ in range(HELD_CONNECTIONS + 2)]
    for c in connections:
        subs.hold(sub, c)
    assert list(sub.held.values()) == connections[2:]  # the newest few only
    now = asyncio.get_running_loop().time()
    assert all(c._next_keepalive_close_time > now for c in connections[2:])
    subs.remove(sub)
    assert subs.of_framework("f") is None and not sub.held


def json_format_parse(document: dict[str, Any]) -> mesos_pb2.TaskInfo:
    from google.protobuf import json_format

    return json_format.ParseDict(document, mesos_pb2.TaskInfo())


async def test_failing_over_to_a_new_subscription(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    """SUBSCRIBE with the framework's id (a scheduler failing over): the old stream is told
    why in an ERROR and ends, the new one has a new stream id, the old id is stale."""
    first = await subscribe(session, cluster, failover_timeout=60)
    framework_id = first.framework_id
    again = subscribe_call(failover_timeout=60, id={"value": framework_id})
    again["framework_id"] = {"value": framework_id}
    response = await session.post(url_of(cluster), json=again, headers=JSON_HEADERS)
    second = Stream(session, url_of(cluster), response)
    await second.event("SUBSCRIBED")
    assert second.framework_id == framework_id and second.stream_id != first.stream_id
    error = await first.event("ERROR")
    assert "another scheduler subscribed" in error["error"]["message"]
    await asyncio.wait_for(first._reader, 10)  # the old stream ended
    assert (await first.call({"type": "REVIVE"})).status == 400  # its stream id is stale
    assert (await second.call({"type": "REVIVE"})).status == 202
    await second.close()


async def test_subscribing_suppressed(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> None:
    body = subscribe_call()
    body["subscribe"]["suppressed_roles"] = ["*"]
    response = await session.post(url_of(cluster), json=body, headers=JSON_HEADERS)
    stream = Stream(session, url_of(cluster), response)
    await stream.event("SUBSCRIBED")
    assert cluster.master.frameworks[stream.framework_id].suppressed
    assert (await stream.call({"type": "REVIVE"})).status == 202
    await stream.event("OFFERS")
    await stream.close()


@pytest.mark.unit
def test_each_core_message_as_mesos_documents_its_event() -> None:
    """The JSON of each event, as docs/scheduler-http-api.md shows it (with the nesting
    of scheduler.proto, which Mesos sends and pymesos reads: `offers.offers`)."""
    offer = Offer("o1", "f1", "s1", "agent.host", Resources.parse("cpus:2"), {"os": "ubuntu"})

    def event(message: msg.FrameworkMessage) -> dict[str, Any] | None:
        pb = convert.event_of(message, "engineering", partition_aware=False, multi_role=True)
        return None if pb is None else wire.to_dict(pb)

    assert event(msg.Offers([offer])) == {
        "type": "OFFERS",
        "offers": {"offers": [{
            "allocation_info": {"role": "engineering"},
            "id": {"value": "o1"},
            "framework_id": {"value": "f1"},
            "agent_id": {"value": "s1"},
            "hostname": "agent.host",
            "resources": [{
                "allocation_info": {"role": "engineering"},
                "name": "cpus", "type": "SCALAR", "scalar": {"value": 2.0}, "role": "*",
            }],
            "attributes": [{"name": "os", "type": "TEXT", "text": {"value": "ubuntu"}}],
        }]},
    }  # fmt: skip
    assert event(msg.Rescind("o1")) == {"type": "RESCIND", "rescind": {"offer_id": {"value": "o1"}}}
    status = TaskStatus("t1", "f1", "s1", TaskState.RUNNING, timestamp=5.0, update_id="u-1")
    assert event(msg.Update(status)) == {
        "type": "UPDATE",
        "update": {"status": {
            "task_id": {"value": "t1"}, "state": "TASK_RUNNING", "source": "SOURCE_EXECUTOR",
            "agent_id": {"value": "s1"}, "timestamp": 5.0, "uuid": "dS0x",  # b"u-1"
        }},
    }  # fmt: skip
    assert convert.update_id_of(b"u-1") == "u-1"
    assert event(msg.AgentFailure("s1")) == {
        "type": "FAILURE",
        "failure": {"agent_id": {"value": "s1"}},
    }
    assert event(msg.Error("Framework is not authorized")) == {
        "type": "ERROR",
        "error": {"message": "Framework is not authorized"},
    }
    assert event(msg.Heartbeat()) == {"type": "HEARTBEAT"}
    assert event(msg.Subscribed("f1", 15.0)) == {
        "type": "SUBSCRIBED",
        "subscribed": {"framework_id": {"value": "f1"}, "heartbeat_interval_seconds": 15.0},
    }
    assert event(msg.Reconciled("c", 0)) is None  # mesolite's own marker: no Mesos event


@pytest.mark.unit
def test_a_task_past_a_list_bound_is_invalid() -> None:
    task = mesos_pb2.TaskInfo()
    task.task_id.value = "t"
    task.command.value = "true"
    task.command.arguments.extend(["a"] * (convert.MAX_ARGUMENTS + 1))
    invalid = convert.task_from_mesos(task, "")
    assert isinstance(invalid, InvalidTask) and "arguments" in invalid.problem
