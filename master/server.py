"""The master process: gRPC and HTTP servers around the `Master` core, plus its clocks.

async with MasterServer(config, host="127.0.0.1", port=0, http_port=0) as server:
    print(server.grpc_address, server.http_address)
    snapshot = server.snapshot()  # the cluster now, as GET /state shows it
    await server.wait_closed()

With `config.tls` both ports speak TLS and every call must name a principal
(master/authn.py): the gRPC port requires a client certificate from the cluster's CA,
HTTPS takes a certificate or a bearer token, and `token_port` (when given) is a second
gRPC port for bearer-token clients. Without TLS the master listens only on loopback,
unless `config.insecure` (`mesolite.tls.check_listen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

import grpc.aio
import structlog
from aiohttp import web

from mesolite import grpc_utils, http_serving
from mesolite.http_hosts import AllowedHosts
from mesolite.master.authn import Authenticator
from mesolite.master.effects import AsyncioTimers, RegistryStore
from mesolite.master.errors import MasterError
from mesolite.master.ha import LeadershipInterceptor, leadership_middleware
from mesolite.master.http import create_app
from mesolite.master.http_access import Route
from mesolite.master.leadership import Leadership, SoleLeadership
from mesolite.master.master import Master, MasterConfig
from mesolite.master.read_model import build_snapshot
from mesolite.master.servicers import AgentGatewayService, SchedulerService
from mesolite.master.stream_limits import GrpcStreamLimits
from mesolite.snapshot import ClusterSnapshot, WorkloadViews
from mesolite.tls import TlsError, check_listen
from mesolite.v1 import agent_pb2_grpc, scheduler_pb2_grpc

log = structlog.get_logger(__name__)

# How often the master logs what it did as one line (master/activity.py).
ACTIVITY_LOG_PERIOD = 10.0


class MasterServer:
    def __init__(
        self,
        config: MasterConfig,
        host: str = "127.0.0.1",
        port: int = 5050,
        http_port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        token_port: int | None = None,
        routes: Sequence[Route] = (),
        workloads: Callable[[], WorkloadViews] | None = None,
        registry: RegistryStore | None = None,
        leadership: Leadership | None = None,
        master_id: str | None = None,
    ) -> None:
        """`routes`: HTTP routes served beside the master's own, checked by its ACLs like
        them; `workloads`: the jobs and services every snapshot shows (both from the
        built-in workload frameworks run beside the master, `mesolite.workloads`).
        `registry`: the store (default: SQLite in `config.work_dir`); `leadership`: whether
        this master leads (default: always; an HA master passes its `Election`,
        `master/ha.py`), checked by every call, request and stream write."""
        self.config = config
        self._registry = registry
        self._master_id = master_id  # an HA master's, as its election names it
        self.leadership: Leadership = leadership or SoleLeadership()
        self._routes = tuple(routes)
        self._workloads = workloads
        self._clock = clock  # the master's timeouts run on it (tests may skip ahead)
        self.host = host
        self._port = port
        self._http_port = http_port
        self._token_port = token_port
        self.authn = Authenticator(enabled=False)
        self.master: Master | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._closed = asyncio.Event()
        self.port = 0
        self.http_port = 0
        self.token_port = 0  # the bearer-token gRPC port, once bound (0: none)

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def token_address(self) -> str:
        return f"{self.host}:{self.token_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.config.tls else 'http'}://{self.http_address}"

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now, as GET /state shows it (call on the server's event loop)."""
        if self.master is None:
            raise RuntimeError("the master server has not started")
        return build_snapshot(
            self.master, workloads=self._workloads() if self._workloads else ((), ())
        )

    async def start(self) -> None:
        tls = self.config.tls
        check_listen("the master", self.host, tls=tls is not None, insecure=self.config.insecure)
        if tls is None and (self.config.credentials_file or self._token_port is not None):
            raise TlsError("bearer tokens are accepted only over TLS: give the master --tls-dir")
        if tls is not None and self.config.acls_file is None:
            log.warning(
                "authentication without ACLs: every principal may do everything, a "
                "framework's certificate may register an agent; give --acls (`mesolite "
                "certs init` wrote a starter acls.json)"
            )
        authn = self.authn = Authenticator(tls is not None, self.config.credentials_file)
        loop = asyncio.get_running_loop()
        timers = AsyncioTimers(loop)
        master = self.master = Master(
            self.config,
            timers=timers,
            clock=self._clock,
            registry=self._registry,
            master_id=self._master_id,
        )
        # One commit per turn of the loop, before any message it acknowledges goes out.
        master.registry.defer_commits(loop.call_soon)
        master.registry.write_observer = master.metrics.registry_write.observe
        master.metrics.watch_leadership(self.leadership)
        master.leadership = self.leadership
        cfg = self.config
        self._grpc = grpc_utils.create_server(
            interceptors=[authn.interceptor(), LeadershipInterceptor(self.leadership)],
            # Every agent and framework may connect at once (a master restart, a
            # registration storm): grpc must queue that many new streams for us.
            pending_streams=cfg.max_agents + cfg.max_frameworks,
        )
        limits = GrpcStreamLimits(self.config.grpc_streams)  # shared by both services
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(
            SchedulerService(master, authn, limits, self.leadership), self._grpc
        )
        agent_pb2_grpc.add_AgentGatewayServicer_to_server(
            AgentGatewayService(master, authn, limits, self.leadership), self._grpc
        )
        self.port = grpc_utils.bind(self._grpc, self.host, self._port, tls)
        if self._token_port is not None:
            self.token_port = grpc_utils.bind(
                self._grpc, self.host, self._token_port, tls, client_cert=False
            )
        await self._grpc.start()

        app = create_app(
            master,
            allowed_hosts=AllowedHosts(self.config.http_allowed_hosts, self.host),
            authn=authn,
            # The master reads the agents' sandboxes over HTTPS, as the principal it is.
            sandbox_ssl=tls.client_context() if tls else None,
            routes=self._routes,
            workloads=self._workloads,
        )
        app.middlewares.insert(0, leadership_middleware(self.leadership))
        http_limits = self.config.http_connections.fitted(http_serving.descriptor_limit())
        self._http = http_serving.runner(app, http_limits)
        await self._http.setup()
        site = http_serving.LimitedSite(
            self._http,
            self.host,
            self._http_port,
            limits=http_limits,
            ssl_context=tls.server_context(require_client_cert=False) if tls else None,
            label="master",
        )
        await site.start()
        self.http_port = site.port

        # The periodic actions run only while this master leads: one that wakes from a
        # stall past its lease must not, say, find every agent silent and remove it.
        leading = self.leadership.is_leading
        self._loops = [
            asyncio.create_task(self._allocation_loop(master)),
            # Cheap however many agents there are (it reads only the silent ones).
            asyncio.create_task(
                _every(min(1.0, cfg.agent_heartbeat_interval), master.check_agent_health, leading)
            ),
            asyncio.create_task(
                _every(cfg.framework_heartbeat_interval, master.send_framework_heartbeats, leading)
            ),
            asyncio.create_task(_every(ACTIVITY_LOG_PERIOD, master.log_activity, leading)),
        ]
        log.info(
            "master started",
            master_id=master.master_id,
            grpc=self.grpc_address,
            http=self.http_url,
            authentication=authn.enabled,
        )

    async def _allocation_loop(self, master: Master) -> None:
        # Runs every allocation interval, and promptly whenever something frees
        # resources (the master sets `allocation_wanted`); everything that
        # happened since the last cycle is batched into the next one.
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as the event is set, and stop() would hang.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.allocation_interval):
                    await master.allocation_wanted.wait()
            master.allocation_wanted.clear()
            if not self.leadership.is_leading():
                continue
            try:
                with master.metrics.time_cycle():
                    master.allocate()
                master.check_preemption()
            except Exception:
                log.exception("allocation cycle failed")

    def step_down(self) -> None:
        """The term ended (an HA master): stop acting at once. The periodic actions end
        and every stream is closed; `stop()` follows."""
        for task in self._loops:
            task.cancel()
        if self.master is not None:
            self.master.shutdown()

    async def stop(self, grace: float = 1.0) -> None:
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.master is not None:
            self.master.shutdown()
        if self._grpc is not None:
            await self._grpc.stop(grace)
        if self._http is not None:
            await self._http.cleanup()
        if self.master is not None:
            with contextlib.suppress(MasterError):  # what is acknowledged is stored already
                await self.master.registry.durable()
            self.master.registry.close()  # last: stream handlers may still have written
        self._closed.set()
        log.info("master stopped")

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> MasterServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _every(
    seconds: float,
    action: Callable[[], object | Awaitable[object]],
    when: Callable[[], bool] = lambda: True,
) -> None:
    while True:
        await asyncio.sleep(seconds)
        if not when():
            continue
        try:
            action()
        except Exception:
            log.exception("periodic action failed", action=getattr(action, "__name__", "?"))
