"""What the fuzz tests found (tests/test_fuzz_*.py), one regression test each.

Each drives the real servicers in-process (tests/support/servicer_streams.py) or
the code that was wrong, with the smallest input that showed the fault.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from mesolite.master.servicers import AgentGatewayService, SchedulerService
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2
from tests.support.core import CONFIG, CoreHarness
from tests.support.servicer_streams import ServicerStreams

pytestmark = pytest.mark.unit

Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall


def subscribe(role: str = "*") -> Call:
    info = scheduler_pb2.FrameworkInfo(name="fw", role=role)
    return Call(subscribe=Call.Subscribe(framework_info=info))


def register(**scalars: float) -> AgentCall:
    total = common_pb2.Resources(scalars=scalars or {"cpus": 4.0})
    return AgentCall(register=AgentCall.Register(hostname="h", total=total))


@pytest.fixture
async def denying(tmp_path: Path) -> AsyncIterator[ServicerStreams]:
    """Servicers of a master whose ACLs let frameworks into role `a` only, and no agent."""
    acls = tmp_path / "acls.json"
    acls.write_text(
        json.dumps(
            {
                "register_frameworks": [
                    {"principals": {"type": "ANY"}, "roles": {"values": ["a"]}}
                ]
            }
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
    refused = denying.framework(subscribe("b"))
    allowed = denying.framework(subscribe("a"))
    await denying.settle()
    assert denying.crashes() == []
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert "may not register frameworks in role 'b'" in refused.details
    assert allowed.code is None and allowed.events[0].HasField("subscribed")


async def test_a_registration_the_acls_deny_is_refused_permission_denied(
    denying: ServicerStreams,
) -> None:
    agent = denying.agent(register())
    await denying.settle()
    assert denying.crashes() == []
    assert agent.code == grpc.StatusCode.PERMISSION_DENIED
