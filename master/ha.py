"""Highly available masters on etcd: a standby until elected, then the master.

    ha = HaMaster(RegistryUrl.parse("etcd://h1:2379,h2:2379/mesolite"), host=..., port=5050)
    await ha.start()                    # standby: ports bound, refusing, campaigning
    registry = await ha.until_leading() # elected: the registry read back from etcd
    server = MasterServer(config, host, ha.port, ha.http_port, registry=registry,
                          leadership=ha.election)
    await ha.election.lost.wait()       # the term ended: stop serving, exit

A standby keeps the master's ports (the same TLS on both) but serves nothing: every gRPC
call is refused with UNAVAILABLE, its details and trailing metadata
(`LEADER_METADATA`) naming the leader, and every HTTP request is answered 307 to the
same path on the leader (503 while no leader is known), after the same Host check the
master does. No state is read and no call is taken. On election the standby's servers
stop and the master binds the same ports; it recovers from the registry exactly as a
restarted master does (`master/recovery.py`: the grace for recovered frameworks, the
agents' re-registration window).

The leader's servers check leadership too (`LeadershipInterceptor`,
`leadership_middleware`, and the stream writers in `master/servicers.py`): a master
whose lease lapsed refuses everything from that instant, even before it has noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import structlog
from aiohttp import web

from mesolite import grpc_utils, http_serving
from mesolite.http_hosts import AllowedHosts, host_check
from mesolite.master.election import DEFAULT_TTL, Election
from mesolite.master.etcd_client import EtcdClient, EtcdError, EtcdTls
from mesolite.master.etcd_registry import EtcdRegistry
from mesolite.master.leadership import LEADER_METADATA, Leadership, MasterAddress
from mesolite.tls import TlsConfig

log = structlog.get_logger(__name__)

DEFAULT_COMPACTION_INTERVAL = 300.0


@dataclass(frozen=True, slots=True)
class RegistryUrl:
    """`etcd://h1:2379,h2:2379/prefix` (`mesolite master --registry`)."""

    endpoints: tuple[str, ...]
    prefix: str

    @staticmethod
    def parse(url: str) -> RegistryUrl:
        scheme, sep, rest = url.partition("://")
        if scheme != "etcd" or not sep:
            raise ValueError(f"a registry URL is etcd://HOST:PORT,.../PREFIX, got {url!r}")
        hosts, _, path = rest.partition("/")
        endpoints = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if not endpoints:
            raise ValueError(f"no etcd endpoint in {url!r}")
        for endpoint in endpoints:
            host, colon, port = endpoint.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"an etcd endpoint is HOST:PORT, got {endpoint!r} in {url!r}")
        prefix = "/" + path.strip("/") if path.strip("/") else "/mesolite"
        return RegistryUrl(endpoints, prefix)


def _refusal(leadership: Leadership) -> tuple[str, tuple[tuple[str, str], ...]]:
    leader = leadership.leader()
    if leader is None or leadership.is_leading():
        return "this master is not leading and no leader is known yet; try again", ()
    return (
        f"this master is a standby; the leader is at {leader.grpc}",
        ((LEADER_METADATA, leader.grpc),),
    )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], leadership: Leadership) -> None:
    details, metadata = _refusal(leadership)
    await context.abort(grpc.StatusCode.UNAVAILABLE, details, trailing_metadata=metadata)


def _refusing_handler(leadership: Leadership) -> grpc.RpcMethodHandler:
    """Any method (the wire is the same for every kind): refuse before reading."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _abort(context, leadership)
        yield b""  # never reached: makes this an async generator (a streaming handler)

    return grpc.stream_stream_rpc_method_handler(refuse)


class _RefuseAll(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, leadership: Leadership) -> None:
        self._handler = _refusing_handler(leadership)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return self._handler


class LeadershipInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """On the leader's server: a call that starts while this master is not leading is
    refused as a standby refuses it."""

    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership
        self._refuse = _refusing_handler(leadership)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if not self._leadership.is_leading():
            return self._refuse
        return await continuation(handler_call_details)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def leadership_middleware(leadership: Leadership) -> Any:
    """HTTP while not leading: 307 to the same path and query on the leader, or 503."""

    @web.middleware
    async def check_leading(request: web.Request, handler: Handler) -> web.StreamResponse:
        if leadership.is_leading():
            return await handler(request)
        leader = leadership.leader()
        if leader is None:
            raise web.HTTPServiceUnavailable(
                text="this master is not leading and no leader is known yet; try again"
            )
        raise web.HTTPTemporaryRedirect(
            leader.http.rstrip("/") + request.rel_url.path_qs,
            text=f"this master is a standby; the leader is at {leader.http}",
        )

    return check_leading


class StandbyServer:
    """The master's ports while it waits: refusing, pointing at the leader."""

    def __init__(
        self,
        leadership: Leadership,
        host: str,
        port: int,
        http_port: int,
        tls: TlsConfig | None,
        allowed_hosts: AllowedHosts,
    ) -> None:
        self._leadership = leadership
        self._host, self._want_port, self._want_http = host, port, http_port
        self._tls = tls
        self._allowed = allowed_hosts
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self.port = 0
        self.http_port = 0

    async def start(self) -> None:
        self._grpc = grpc_utils.create_server()
        self._grpc.add_generic_rpc_handlers([_RefuseAll(self._leadership)])
        self.port = grpc_utils.bind(self._grpc, self._host, self._want_port, self._tls)
        await self._grpc.start()
        app = web.Application(
            middlewares=[host_check(self._allowed), leadership_middleware(self._leadership)]
        )

        async def never(request: web.Request) -> web.StreamResponse:
            raise web.HTTPServiceUnavailable(text="a standby serves nothing")

        app.router.add_route("*", "/{tail:.*}", never)
        limits = http_serving.ConnectionLimits().fitted(http_serving.descriptor_limit())
        self._http = http_serving.runner(app, limits, shutdown_timeout=0.0)
        await self._http.setup()
        site = http_serving.LimitedSite(
            self._http,
            self._host,
            self._want_http,
            limits=limits,
            ssl_context=self._tls.server_context(require_client_cert=False) if self._tls else None,
            label="standby master",
        )
        await site.start()
        self.http_port = site.port

    async def stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(0)
        if self._http is not None:
            await self._http.cleanup()


class HaMaster:
    def __init__(
        self,
        url: RegistryUrl,
        *,
        host: str,
        port: int,
        http_port: int,
        tls: TlsConfig | None = None,
        etcd_tls: EtcdTls | None = None,
        ttl: int = DEFAULT_TTL,
        advertise_host: str | None = None,
        allowed_hosts: AllowedHosts | None = None,
        compaction_interval: float = DEFAULT_COMPACTION_INTERVAL,
        master_id: str | None = None,
    ) -> None:
        self.url = url
        self._host = host
        self._advertise = advertise_host or host
        self._tls = tls
        self._ttl = ttl
        self._compaction_interval = compaction_interval
        self.master_id = master_id or uuid.uuid4().hex[:12]
        self.client = EtcdClient(url.endpoints, tls=etcd_tls, timeout=float(ttl))
        self._standby_args = (port, http_port, allowed_hosts or AllowedHosts((), host))
        self.election: Election | None = None
        self._standby: StandbyServer | None = None
        self._compactor: asyncio.Task[None] | None = None
        self.registry: EtcdRegistry | None = None
        self.port = 0
        self.http_port = 0

    async def start(self) -> None:
        """Bind the ports as a standby; the election starts with `until_leading`."""
        port, http_port, allowed = self._standby_args
        holder = _Deferred()
        self._standby = StandbyServer(holder, self._host, port, http_port, self._tls, allowed)
        await self._standby.start()
        self.port, self.http_port = self._standby.port, self._standby.http_port
        scheme = "https" if self._tls else "http"
        me = MasterAddress(
            self.master_id,
            f"{self._advertise}:{self.port}",
            f"{scheme}://{self._advertise}:{self.http_port}",
        )
        self.election = holder.target = Election(self.client, self.url.prefix, me, self._ttl)
        log.info("standby master started", master_id=self.master_id, grpc=me.grpc, http=me.http)

    async def until_leading(self) -> EtcdRegistry:
        """Wait as a standby; once elected, the registry read back (the standby's
        servers are stopped: the master binds the same ports next)."""
        assert self.election is not None and self._standby is not None, "start() first"
        fence = await self.election.campaign()
        await self._standby.stop()
        self._standby = None
        registry = EtcdRegistry(
            self.client,
            self.url.prefix,
            fence,
            on_fenced=self.election.lose,
            write_timeout=float(self._ttl),
            leading=self.election.is_leading,
        )
        # First of the term's end callbacks: nothing the master does as it stops
        # serving (closing streams, a failover-0 framework's teardown) is written.
        self.election.on_lost(registry.fence_off)
        await registry.load()
        self.registry = registry
        if self._compaction_interval > 0:
            self._compactor = asyncio.create_task(self._compact(registry))
        return registry

    async def _compact(self, registry: EtcdRegistry) -> None:
        """Compact etcd's history up to the registry's newest write, periodically (etcd
        keeps every revision otherwise; only the leader writes, so only it compacts)."""
        compacted = 0
        while True:
            await asyncio.sleep(self._compaction_interval)
            revision = registry.revision
            if revision > compacted:
                try:
                    await self.client.compact(revision)
                    compacted = revision
                    log.info("etcd history compacted", revision=revision)
                except EtcdError as e:
                    log.warning("etcd compaction failed", error=str(e))

    async def close(self) -> None:
        if self._compactor is not None:
            self._compactor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._compactor
        if self._standby is not None:
            await self._standby.stop()
        if self.election is not None:
            await self.election.close(resign=True)
        await self.client.close()


class _Deferred:
    """The standby's leadership before the election exists: none known."""

    target: Leadership | None = None

    def is_leading(self) -> bool:
        return self.target.is_leading() if self.target else False

    def leader(self) -> MasterAddress | None:
        return self.target.leader() if self.target else None

    def standbys(self) -> list[MasterAddress]:
        return self.target.standbys() if self.target else []
