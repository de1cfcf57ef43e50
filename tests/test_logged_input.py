"""What a client sends is logged clipped: a rejected 3 MB id makes a short log line.

A real `mesolite master` process (its own logging set-up, as an operator runs it),
sent raw protobuf with 3 MB ids: each call is rejected, and every line the master
logs stays short, as does each error sent back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from mesolite import grpc_utils
from mesolite.logs import LOGGED_VALUE_LIMIT, clip, clip_values
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from tests.cluster import MasterProcess
from tests.raw_client import Call, RawFramework, resources
from tests.waiting import within

HUGE = "x" * 3_000_000  # under the 4 MB message limit
LINE_LIMIT = 4096  # bytes: "a few KB"


def test_clip_keeps_short_values_and_both_ends_of_long_ones() -> None:
    assert clip("abc") == "abc"
    assert clip("a" * 64) == "a" * 64
    assert clip("a" * 200, 200) == "a" * 200
    long = "head-" + "x" * 1_000_000 + "-tail"
    for limit in (64, 200, 1000):
        clipped = clip(long, limit)
        assert len(clipped) <= limit
        assert clipped.startswith("head-") and clipped.endswith("-tail")
    assert "(1000010 characters)" in clip(long, 200)  # says how long it was
    event = clip_values(None, "warning", {"event": "e", "id": long, "ids": [long], "n": 3})
    assert all(len(str(v)) <= LOGGED_VALUE_LIMIT for v in event.values())
    assert event["n"] == 3


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[MasterProcess]:
    process = MasterProcess(tmp_path)
    await process.start()
    try:
        yield process
    finally:
        await process.stop()


async def test_rejected_calls_with_3mb_ids_log_short_lines(
    master: MasterProcess, tmp_path: Path
) -> None:
    async with RawFramework(master.address) as fw:
        errors = [
            await fw.error_for(Call(kill=Call.Kill(task_id=HUGE))),
            await fw.error_for(Call(decline=Call.Decline(offer_ids=[HUGE]))),
            await fw.error_for(
                Call(
                    accept=Call.Accept(
                        offer_ids=["no-such-offer"],
                        tasks=[
                            common_pb2.TaskInfo(
                                task_id=HUGE, command="true", resources=resources(cpus=1)
                            )
                        ],
                    )
                )
            ),
            await fw.error_for(Call(call_id=HUGE[:1_000_000], kill=Call.Kill(task_id="t"))),
        ]
    for message in errors:
        assert len(message) < LINE_LIMIT, len(message)

    # A rogue agent registering with a 3 MB id is refused, with a short reason.
    async with grpc_utils.create_channel(master.address) as channel:
        stub = agent_pb2_grpc.AgentGatewayStub(channel)

        async def register() -> AsyncIterator[agent_pb2.AgentCall]:
            yield agent_pb2.AgentCall(
                register=agent_pb2.AgentCall.Register(
                    agent_id=HUGE, hostname="rogue", total=resources(cpus=1)
                )
            )

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await within(stub.Connect(register()).read(), 10, "the refusal")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(refused.value.details() or "") < LINE_LIMIT

    await master.stop()  # flushes the log
    log = (tmp_path / "master-1.log").read_bytes()
    lines = log.splitlines()
    assert sum(b"call rejected" in line for line in lines) == 4
    assert any(b"agent registration refused" in line for line in lines)
    longest = max(lines, key=len)
    assert len(longest) < LINE_LIMIT, longest[:300]
    assert len(log) < 64 * 1024, len(log)
