"""Fuzz the master over the wire: hundreds of inputs on real gRPC streams.

A real master (`tests/cluster.py`: gRPC and HTTP on 127.0.0.1, its allocation and
health loops running, invariants checked, the fuzz ACLs) is sent the examples of
`tests/support/fuzz_session.py` by raw clients (`tests/support/wire_streams.py`):
frameworks and agents that speak protobuf and send whatever hypothesis draws, and
bytes that are not messages at all. No agent runs a task here: the raw agents only
answer, so no fuzzed command is ever executed.

After every step, besides the checks every fuzz layer makes: every stream that ended
did so with a documented status (a refusal, OK, or CANCELLED by the client), and
nothing was logged at error level by grpc or asyncio either. After the batch: no
servicer task is left running, and a real agent with a framework runs a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from mesolite import convert, grpc_utils
from mesolite.master.master import Master
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2
from tests.cluster import LocalCluster, fast
from tests.raw_client import RawFramework, resources
from tests.support import wire_strategies as ws
from tests.support.calls import register, subscribe
from tests.support.fuzz_session import TOTAL, FuzzSession, outstanding
from tests.support.fuzzing import (
    REFUSALS,
    Figures,
    figures,
    fuzz_settings,
    fuzz_timeout,
    started,
    write_acls,
)
from tests.support.wire_streams import AGENT_GATEWAY, CLIENT_RACE, SCHEDULER, WireStreams
from tests.waiting import wait_for_condition

pytestmark = [pytest.mark.slow, fuzz_timeout(300)]

# About 400 inputs, 11 s on a quiet 2-core machine (halved to keep CI within 15 minutes).
CI_EXAMPLES = 60
ENDINGS = REFUSALS | {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED}
OFFER_WAIT = 10.0  # the allocation loop runs every 0.2 s


class WireSession(FuzzSession):
    """Raw clients of a real master; the steps may also send bytes that are not messages."""

    STEPS = (*FuzzSession.STEPS, ("garbage", 2))

    def __init__(
        self,
        data: st.DataObject,
        found: Figures,
        cluster: LocalCluster,
        channel: grpc.aio.Channel,
        errors: Callable[[], list[logging.LogRecord]],
    ) -> None:
        super().__init__(data, found)
        self._cluster = cluster
        self._streams = WireStreams(channel)
        self._errors = errors

    @property
    def master(self) -> Master:
        master: Master = self._cluster.master
        return master

    @property
    def streams(self) -> WireStreams:
        return self._streams

    async def offers(self, fw: Any) -> list[scheduler_pb2.Offer]:
        await fw.answered(lambda e: bool(outstanding(self.master, [e])), OFFER_WAIT)
        return outstanding(self.master, fw.events)

    async def until(self, stream: Any, found: Callable[[Any], bool]) -> Any:
        assert await stream.answered(found, 20), f"the stream ended: {stream.code}"
        return next(e for e in stream.events if found(e))

    async def other_step(self, kind: str) -> None:
        if kind != "garbage":
            return
        draw = self.data.draw
        path = draw(st.sampled_from((SCHEDULER, AGENT_GATEWAY)), label="service")
        valid = (subscribe("junk") if path == SCHEDULER else register(TOTAL)).SerializeToString()
        junk = draw(ws.garbage(valid), label="bytes")
        later = draw(st.booleans(), label="after a valid first message")
        decode = scheduler_pb2.Call if path == SCHEDULER else agent_pb2.AgentCall
        try:
            decode.FromString(junk)
            undecodable = False
        except DecodeError:
            undecodable = True
        stream = self.streams.raw(path, valid if later else junk)
        if later:
            stream.send(junk)
        self.found.inputs += 1
        if undecodable:  # the master ends the stream: no barrier, no write racing that
            await stream.answered(lambda e: False, 20)
        await self.settled()
        if undecodable:
            self.found.refused += 1
            assert stream.code == grpc.StatusCode.INVALID_ARGUMENT, (stream.code, stream.details)
            assert stream.details.startswith("a message could not be decoded")

    def other_checks(self) -> None:
        # A stream the master ended while the client wrote may show the client's race
        # (CLIENT_RACE); the master's side is judged by its logs, where grpc logs an
        # exception a handler raised.
        odd = [
            s
            for s in self.streams.streams
            if s.ended and s.code not in ENDINGS and (s.code, s.details) != CLIENT_RACE
        ]
        assert odd == [], [(s.code, s.details, s.sent, s.events) for s in odd]
        assert self._errors() == [], self._errors()

    async def disconnected(self) -> None:
        # A client that hangs up is done at once; its handler on the master, soon after.
        await wait_for_condition(
            lambda: self.connected_on_master() == [], what="the master to close every stream"
        )


def servicer_readers() -> list[asyncio.Task[Any]]:
    """The servicers' reader tasks still running (one per open stream)."""
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "_read_into.<locals>.read"
    ]


async def still_serving(cluster: LocalCluster) -> None:
    """No stream left behind, and a real agent runs a framework's task."""
    await wait_for_condition(lambda: servicer_readers() == [], what="every stream's reader to end")
    agent = await cluster.add_agent("cpus:1;mem:256", name="real")
    async with RawFramework(cluster.address, name="after-the-fuzz") as fw:
        offer = None
        while offer is None:
            event = await fw.next_event("offers")
            offer = next((o for o in event.offers.offers if o.agent_id == agent.agent_id), None)
        task = common_pb2.TaskInfo(
            task_id="after", command="sleep 30", resources=resources(cpus=1, mem=64)
        )
        accept = scheduler_pb2.Call.Accept(offer_ids=[offer.offer_id], tasks=[task])
        fw.send(scheduler_pb2.Call(accept=accept))
        while (status := await fw.next_update()).state != common_pb2.TASK_RUNNING:
            assert not convert.task_state_from_proto(status.state).is_terminal, status


@pytest.fixture(scope="module")
def acls_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_acls(tmp_path_factory.mktemp("fuzz"))


def stdlib_errors(caplog: pytest.LogCaptureFixture) -> Callable[[], list[logging.LogRecord]]:
    """What the standard library's logging (grpc, asyncio, aiohttp) logged at error level."""
    return lambda: [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_master_survives_fuzzed_streams_over_the_wire(
    tmp_path: Path, acls_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        asyncio.Runner() as loop,
        figures("over the wire") as found,
        started(loop, LocalCluster(tmp_path, fast(acls_file=acls_file))) as cluster,
        started(loop, _channel(cluster.address)) as channel,
    ):

        @fuzz_settings(CI_EXAMPLES, shrink=False)
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            errors = stdlib_errors(caplog)
            loop.run(WireSession(data, found, cluster, channel, errors).play())

        fuzz()
        loop.run(still_serving(cluster))
    assert stdlib_errors(caplog)() == []


@contextlib.asynccontextmanager
async def _channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc_utils.create_channel(address) as channel:
        yield channel


# Explicit cases ------------------------------------------------------------------------


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path) as cluster:
        yield cluster


async def test_undecodable_bytes_refuse_the_stream_over_the_wire(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (found by the fuzz): as a first message, garbage escaped the servicer
    (grpc logged an error, the client saw UNKNOWN); after one, the stream ended OK."""
    async with grpc_utils.create_channel(cluster.address) as channel:
        streams = WireStreams(channel)
        firsts = {SCHEDULER: subscribe("fw"), AGENT_GATEWAY: register(TOTAL)}
        for path, valid in firsts.items():
            streams.raw(path, b"\xff\xff\xff")
            streams.raw(path, valid.SerializeToString()).send(b"\xff\xff\xff")
        await wait_for_condition(lambda: all(s.ended for s in streams.streams), what="refusals")
        for stream in streams.streams:
            assert stream.code == grpc.StatusCode.INVALID_ARGUMENT, stream.code
            assert stream.details.startswith("a message could not be decoded: Error parsing")
        await streams.aclose()
    assert stdlib_errors(caplog)() == []
    async with RawFramework(cluster.address) as fw:  # still serving
        assert fw.framework_id


async def test_an_unknown_method_and_oversized_messages(cluster: LocalCluster) -> None:
    """UNIMPLEMENTED for a method the master does not have; RESOURCE_EXHAUSTED for a
    message over 4 MiB; a 3 MB framework name, within that, is refused as too long."""
    async with grpc_utils.create_channel(cluster.address) as channel:
        streams = WireStreams(channel)
        nowhere = streams.raw("/mesolite.v1.Scheduler/Nope", b"")
        huge = streams.framework(subscribe("x" * 5_000_000))
        long = streams.framework(subscribe("x" * 3_000_000))
        await wait_for_condition(lambda: all(s.ended for s in streams.streams), what="refusals")
        assert nowhere.code == grpc.StatusCode.UNIMPLEMENTED
        assert huge.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert long.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "longer than" in long.details and len(long.details) < 1000
        await streams.aclose()
    assert cluster.master.frameworks == {}
    async with RawFramework(cluster.address) as fw:  # still serving
        assert fw.framework_id
