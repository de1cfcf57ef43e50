"""What the fuzz tests found (tests/test_fuzz_*.py), one regression test each.

Each drives the real servicers in-process (tests/support/servicer_streams.py) or
the code that was wrong, with the smallest input that showed the fault.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from structlog.testing import capture_logs

from mesolite.master import validation
from mesolite.master.servicers import AgentGatewayService, SchedulerService
from mesolite.resources import InvalidResources, Resources
from mesolite.sandbox_protocol import BadRequest, check_segment
from mesolite.v1 import common_pb2, scheduler_pb2
from tests.support.calls import register, subscribe
from tests.support.core import CONFIG, CoreHarness
from tests.support.servicer_streams import ServicerStreams, Stream

pytestmark = pytest.mark.unit

Call = scheduler_pb2.Call
CPUS = {"cpus": 4.0}


@pytest.fixture
async def denying(tmp_path: Path) -> AsyncIterator[ServicerStreams]:
    """Servicers of a master whose ACLs let frameworks into role `a` only, and no agent."""
    acls = tmp_path / "acls.json"
    acls.write_text(
        json.dumps(
            {"register_frameworks": [{"principals": {"type": "ANY"}, "roles": {"values": ["a"]}}]}
        )
    )
    master = CoreHarness(replace(CONFIG, acls_file=acls)).master
    streams = ServicerStreams(SchedulerService(master), AgentGatewayService(master))
    yield streams
    await streams.aclose()


async def test_a_subscription_the_acls_deny_is_refused_permission_denied(
    denying: ServicerStreams,
) -> None:
    """Found by the in-process fuzz: a FORBIDDEN refusal had no gRPC status, so the
    servicer raised KeyError and the framework saw UNKNOWN."""
    refused = denying.framework(subscribe("fw", "b"))
    allowed = denying.framework(subscribe("fw", "a"))
    await denying.settle()
    assert denying.crashes() == []
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert "may not register frameworks in role 'b'" in refused.details
    assert allowed.code is None and allowed.events[0].HasField("subscribed")


async def test_a_registration_the_acls_deny_is_refused_permission_denied(
    denying: ServicerStreams,
) -> None:
    agent = denying.agent(register(CPUS))
    await denying.settle()
    assert denying.crashes() == []
    assert agent.code == grpc.StatusCode.PERMISSION_DENIED


def undecodable() -> DecodeError:
    """What grpc raises to a handler reading bytes that are not a message."""
    try:
        Call.FromString(b"\xff\xff\xff")
    except DecodeError as e:
        return e
    raise AssertionError("those bytes decoded")


async def test_undecodable_bytes_refuse_the_stream_invalid_argument(core: CoreHarness) -> None:
    """Found by the fuzz over the wire: bytes that are not a message, as a stream's first
    message, escaped the servicer (grpc logged an error, the client saw UNKNOWN); after
    it, the master logged a bug and ended the stream OK, with no reason."""
    streams = ServicerStreams(SchedulerService(core.master), AgentGatewayService(core.master))
    with capture_logs() as logs:
        first: list[Stream[Any, Any]] = [
            streams.framework(undecodable()),
            streams.agent(undecodable()),
        ]
        later: list[Stream[Any, Any]] = [
            streams.framework(subscribe("fw")),
            streams.agent(register(CPUS)),
        ]
        await streams.settle()
        for stream in later:
            stream.send(undecodable())
        await streams.settle()
    assert streams.crashes() == []
    for stream in first + later:
        assert stream.code == grpc.StatusCode.INVALID_ARGUMENT, stream.code
        assert stream.details.startswith("a message could not be decoded: Error parsing")
    assert [e for e in logs if e["log_level"] == "error"] == []
    assert not any(f.connected for f in core.master.frameworks.values())
    assert not any(a.connected for a in core.master.agents.values())


@pytest.mark.parametrize("value", ["t1\n", "\n", "t1\n\n"])
def test_an_id_with_a_final_newline_is_invalid(value: str) -> None:
    """Found by the in-process fuzz: `^...$` with `re.match` let a final newline in,
    so a task id "0\\n" was launched (and would name the task's sandbox directory)."""
    assert validation.id_problem("task id", value) is not None
    assert validation.id_problem("task id", "t1") is None


def test_a_resource_name_with_a_final_newline_is_invalid() -> None:
    with pytest.raises(InvalidResources, match="invalid resource name"):
        Resources({"cpus\n": 1.0})
    assert Resources({"cpus": 1.0})["cpus"] == 1.0


async def test_a_launch_with_a_newline_in_the_task_id_is_rejected(core: CoreHarness) -> None:
    streams = ServicerStreams(SchedulerService(core.master), AgentGatewayService(core.master))
    agent = streams.agent(register({"cpus": 1.0}))
    fw = streams.framework(subscribe("fw"))
    await streams.settle()
    core.master.allocate()
    await streams.settle()
    [offer] = [e.offers.offers[0] for e in fw.events if e.HasField("offers")]
    task = common_pb2.TaskInfo(
        task_id="0\n", command="true", resources=common_pb2.Resources(scalars={"cpus": 0.5})
    )
    fw.send(Call(call_id="c1", accept=Call.Accept(offer_ids=[offer.offer_id], tasks=[task])))
    await streams.settle()
    [error] = [e.error for e in fw.events if e.HasField("error")]
    assert error.call_id == "c1" and "invalid task id" in error.message
    assert not [e for e in agent.events if e.HasField("launch_task")]
    assert core.master.frameworks[fw.events[0].subscribed.framework_id].tasks == {}
    await streams.aclose()


@pytest.mark.parametrize("value", ["a" * 256, "é" * 128, "a" * 1000])
def test_a_segment_longer_than_a_file_name_names_no_sandbox(value: str) -> None:
    """Found by the HTTP fuzz: opening it failed with ENAMETOOLONG, which the agent's
    sandbox server answered 500 (and the master's proxy 502)."""
    with pytest.raises(BadRequest, match="invalid task id"):
        check_segment("task id", value)
    assert check_segment("task id", "a" * 255) == "a" * 255
