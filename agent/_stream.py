"""One agent stream's plumbing: its heartbeats, its reads, and how it ended.

The agent (`agent/agent.py`) runs one `AgentGateway.Connect` stream at a time;
these helpers are the parts that do not depend on the agent's state. Its calls go
out through a `StreamWriter` (`mesolite/stream_writer.py`), the stream's one writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import grpc.aio
import structlog

from mesolite.agent import _wire as wire
from mesolite.masters import leader_hint
from mesolite.model import TaskUsage
from mesolite.stream_writer import StreamWriter
from mesolite.v1 import agent_pb2

log = structlog.get_logger("mesolite.agent.agent")

# The calls queued for the stream's one writer.
Outbox: TypeAlias = StreamWriter[agent_pb2.AgentCall]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    code: grpc.StatusCode
    details: str
    registered: bool  # whether the master had answered `registered` on this stream
    leader: str | None = None  # the leader a standby master named (`mesolite.masters`)


async def read_event(call: Any) -> agent_pb2.AgentEvent | None:
    msg = await call.read()
    return None if msg is grpc.aio.EOF else msg


async def ended(call: Any, registered: bool) -> StreamEnd:
    leader = leader_hint(await call.trailing_metadata())
    return StreamEnd(await call.code(), await call.details() or "", registered, leader)


async def heartbeats(
    outbox: Outbox, interval: float, usage: Callable[[], Awaitable[list[TaskUsage]]]
) -> None:
    """A heartbeat every `interval` seconds, with what `usage()` measured just before."""
    while True:
        await asyncio.sleep(interval)
        await outbox.put(wire.heartbeat_call(await usage()))
