"""One agent stream's plumbing: its outbox, its single writer, heartbeats, and how it ended.

The agent (`agent/agent.py`) runs one `AgentGateway.Connect` stream at a time;
these helpers are the parts that do not depend on the agent's state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import grpc.aio
import structlog

from mesolite.agent import _wire as wire
from mesolite.v1 import agent_pb2

log = structlog.get_logger("mesolite.agent.agent")

# Messages for the stream's writer; None asks it to half-close the stream.
Outbox: TypeAlias = "asyncio.Queue[agent_pb2.AgentCall | None]"


@dataclass(frozen=True, slots=True)
class StreamEnd:
    code: grpc.StatusCode
    details: str
    registered: bool  # whether the master had answered `registered` on this stream


async def read_event(call: Any) -> agent_pb2.AgentEvent | None:
    msg = await call.read()
    return None if msg is grpc.aio.EOF else msg


async def ended(call: Any, registered: bool) -> StreamEnd:
    return StreamEnd(await call.code(), await call.details() or "", registered)


async def write_loop(call: Any, outbox: Outbox) -> None:
    """The stream's only writer: grpc.aio allows one write in flight per call."""
    while True:
        msg = await outbox.get()
        try:
            if msg is None:
                await call.done_writing()
                return
            await call.write(msg)
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            # The reader sees the stream's status and ends the session.
            log.debug("stream closed for writing", error=repr(e))
            return


async def heartbeats(outbox: Outbox, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        await outbox.put(wire.heartbeat_call())
