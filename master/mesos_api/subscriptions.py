"""The open Mesos subscriptions: one per SUBSCRIBE stream, each with its Mesos-Stream-Id.

A subscription is one framework's event stream: the outbox the master core sends to
(a `StreamWriter`, as for a gRPC framework), and what the front door needs to write
those messages as Mesos events (the encoding, the framework's role and capabilities).
Its stream id is valid while the stream is open; calls name it in `Mesos-Stream-Id`
and must come from the principal that subscribed.

Bounds: at most `per_client` open streams per client (its principal, or its address
when anonymous), and each subscription holds open at most `HELD_CONNECTIONS` idle
keep-alive connections its calls came on (`hold`, renewed by `keep_alive` every
`renew_every` seconds while the stream lives, `mesolite.http_serving.hold_idle`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import structlog

from mesolite import http_serving
from mesolite.master import messages as msg
from mesolite.stream_writer import StreamWriter

log = structlog.get_logger(__name__)

HELD_CONNECTIONS = 4  # idle connections for calls held open per subscription
STREAMS_PER_CLIENT = 64


@dataclass(eq=False)
class Subscription:
    framework_id: str
    principal: str | None
    client: str
    encoding: str
    role: str
    partition_aware: bool
    multi_role: bool
    outbox: StreamWriter[msg.FrameworkMessage]
    stream_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    held: OrderedDict[int, object] = field(default_factory=OrderedDict)


class Subscriptions:
    def __init__(self, per_client: int = STREAMS_PER_CLIENT, hold_for: float = 30.0) -> None:
        """`hold_for`: how long past each renewal an idle held connection stays open."""
        self._per_client = per_client
        self._hold_for = hold_for
        self._by_stream: dict[str, Subscription] = {}
        self._by_framework: dict[str, Subscription] = {}
        self._clients: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._by_stream)

    def admit(self, client: str) -> str | None:
        """Room for one more stream of `client` (taken until `release`), or why not."""
        if self._clients[client] >= self._per_client:
            return f"{self._per_client} subscriptions of one client are open, its maximum"
        self._clients[client] += 1
        return None

    def release(self, client: str) -> None:
        self._clients[client] -= 1
        if self._clients[client] <= 0:
            del self._clients[client]

    def add(self, subscription: Subscription) -> None:
        self._by_stream[subscription.stream_id] = subscription
        self._by_framework[subscription.framework_id] = subscription
        log.info(
            "mesos subscription opened",
            framework_id=subscription.framework_id,
            stream_id=subscription.stream_id,
            principal=subscription.principal,
        )

    def remove(self, subscription: Subscription) -> None:
        if self._by_stream.pop(subscription.stream_id, None) is None:
            return
        if self._by_framework.get(subscription.framework_id) is subscription:
            del self._by_framework[subscription.framework_id]
        subscription.held.clear()  # its connections close at their next deadline
        log.info(
            "mesos subscription closed",
            framework_id=subscription.framework_id,
            stream_id=subscription.stream_id,
            reason=subscription.outbox.close_reason or None,
        )

    def of_framework(self, framework_id: str) -> Subscription | None:
        """The framework's open Mesos subscription, if it is subscribed over HTTP."""
        return self._by_framework.get(framework_id)

    def hold(self, subscription: Subscription, protocol: object) -> None:
        """Keep the connection a call of `subscription` came on open while idle (the
        newest HELD_CONNECTIONS of them)."""
        key = id(protocol)
        subscription.held[key] = protocol
        subscription.held.move_to_end(key)
        while len(subscription.held) > HELD_CONNECTIONS:
            subscription.held.popitem(last=False)
        self._renew(subscription)

    def _renew(self, subscription: Subscription) -> None:
        until = asyncio.get_running_loop().time() + self._hold_for
        for key, protocol in list(subscription.held.items()):
            if getattr(protocol, "transport", None) is None or not http_serving.hold_idle(
                protocol, until
            ):
                del subscription.held[key]  # closed, or aiohttp cannot hold it

    async def keep_alive(self, renew_every: float) -> None:
        """Renew the held connections of every open subscription, forever."""
        while True:
            await asyncio.sleep(renew_every)
            for subscription in list(self._by_stream.values()):
                self._renew(subscription)
