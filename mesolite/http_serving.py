"""Serving HTTP so that slow or numerous clients cannot take the port, or the process, down.

aiohttp on its own waits 75 s for a request's headers and accepts every connection
it is offered, so a client that opens connections and sends a header line now and
then holds one descriptor per connection; at the process's descriptor limit the
master can accept nothing, gRPC included. Both HTTP servers (the master's, and
an agent's sandbox server) are served through `LimitedSite` instead of aiohttp's
`TCPSite`, with these bounds (`ConnectionLimits`):

- **a deadline for request headers**: a connection that has not sent a whole request
  within `header_deadline` seconds of connecting, or of its last response, is
  closed (aiohttp's keep-alive timer, which runs from the connection's start, is
  set to it; sending bytes does not extend it); a TLS handshake has as long;
- **caps on connections**, checked as each is accepted, after its TLS handshake: in
  all, and, for connections without a verified client certificate (tokens,
  browsers, and anyone who can reach the port), in all and per address. A
  connection over a cap is closed at once. Connections with a certificate of the
  cluster's CA count only against the total, so an operator or the master's own
  sandbox proxy still gets in while anonymous clients crowd the port.

Two exceptions for long-lived clients (the Mesos scheduler API, `master/mesos_api/`):
`on_close(protocol, callback)` says when a connection goes (a streaming response
learns that its client left without writing to it), and `hold_idle(protocol, until)`
keeps one idle keep-alive connection open past the header deadline, for as long as
its holder renews it (pymesos keeps one connection for its calls, idle while the
framework waits for offers).

`ConnectionLimits.fitted()` brings the caps below the process's descriptor limit, and
`raise_descriptor_limit()` raises that soft limit to its hard limit at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import resource
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

log = structlog.get_logger("mesolite.http")

REFUSAL_LOG_INTERVAL = 60.0  # seconds: refusals are logged as counts, at most this often


@dataclass(frozen=True)
class ConnectionLimits:
    header_deadline: float = 10.0  # seconds to send a whole request's headers
    total: int = 1024  # open connections, in all
    anonymous: int = 256  # open connections without a client certificate
    anonymous_per_address: int = 64  # ... from one address

    def fitted(self, descriptor_limit: int) -> ConnectionLimits:
        """These limits, lowered so that HTTP connections can use at most half the
        process's descriptors, anonymous ones at most a quarter."""
        total = max(8, min(self.total, descriptor_limit // 2))
        anonymous = max(4, min(self.anonymous, total // 2))
        return dataclasses.replace(
            self,
            total=total,
            anonymous=anonymous,
            anonymous_per_address=max(2, min(self.anonymous_per_address, anonymous)),
        )


def raise_descriptor_limit() -> int:
    """Raises the soft limit on open descriptors to the hard limit; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # keep the soft limit
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


class Admission:
    """Counts open connections against `ConnectionLimits` (pure: no I/O)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.anonymous: Counter[str] = Counter()  # per address
        self.anonymous_total = 0

    def admit(self, address: str, *, anonymous: bool) -> str | None:
        """Takes a slot for a new connection; None, or why there is none."""
        limits = self.limits
        if self.total >= limits.total:
            return f"{limits.total} connections open"
        if anonymous:
            if self.anonymous_total >= limits.anonymous:
                return f"{limits.anonymous} connections without a client certificate open"
            if self.anonymous[address] >= limits.anonymous_per_address:
                return (
                    f"{limits.anonymous_per_address} connections without a client "
                    f"certificate open from {address}"
                )
            self.anonymous[address] += 1
            self.anonymous_total += 1
        self.total += 1
        return None

    def release(self, address: str, *, anonymous: bool) -> None:
        self.total -= 1
        if anonymous:
            self.anonymous_total -= 1
            self.anonymous[address] -= 1
            if not self.anonymous[address]:
                del self.anonymous[address]


class _RefusalLog:
    """Refused connections, logged as counts at most every REFUSAL_LOG_INTERVAL: a crowd
    of clients must not grow the log by a line each."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._counts: Counter[str] = Counter()
        self._last = 0.0

    def refused(self, reason: str) -> None:
        self._counts[reason] += 1
        now = time.monotonic()
        if now - self._last >= REFUSAL_LOG_INTERVAL:
            self._last = now
            counts, self._counts = self._counts, Counter()
            log.warning("connections refused", server=self._server, refused=dict(counts))


# Callbacks to run when a connection (by its aiohttp protocol) is lost.
_ON_CLOSE: dict[int, tuple[asyncio.Protocol, list[Callable[[], None]]]] = {}


def on_close(protocol: object, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` when the connection of `protocol` (a request's `protocol`) is lost,
    if it was accepted by a `LimitedSite`; returns what cancels that. Runs at most once."""
    entry = _ON_CLOSE.get(id(protocol))
    if entry is None or entry[0] is not protocol:
        return _nothing
    entry[1].append(callback)

    def cancel() -> None:
        current = _ON_CLOSE.get(id(protocol))
        if current is not None and callback in current[1]:
            current[1].remove(callback)

    return cancel


def _nothing() -> None:
    pass


def hold_idle(protocol: object, until: float) -> bool:
    """Keep the connection of `protocol` open while idle until `until` (the event loop's
    clock), not only the header deadline: aiohttp closes an idle keep-alive connection
    when its keep-alive timer fires past the connection's close time, which this moves
    on (aiohttp sets it again after each response, so the holder renews it more often
    than the header deadline). False if aiohttp keeps no such time (then the
    connection closes as any other)."""
    current = getattr(protocol, "_next_keepalive_close_time", None)
    if not isinstance(current, float):
        return False
    if until > current:
        protocol._next_keepalive_close_time = until  # type: ignore[attr-defined]
    return True


class _Admitted(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the admission check."""

    def __init__(
        self, inner: asyncio.Protocol, admission: Admission, refusals: _RefusalLog
    ) -> None:
        self._inner = inner
        self._admission = admission
        self._refusals = refusals
        self._slot: tuple[str, bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        anonymous = not transport.get_extra_info("peercert")  # verified by the handshake
        refusal = self._admission.admit(address, anonymous=anonymous)
        if refusal is not None:
            self._refusals.refused(refusal)
            assert isinstance(transport, asyncio.Transport)
            transport.abort()  # at once: no TLS shutdown to wait for
            return
        self._slot = (address, anonymous)
        _ON_CLOSE[id(self._inner)] = (self._inner, [])
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._slot is not None:
            address, anonymous = self._slot
            self._slot = None
            self._admission.release(address, anonymous=anonymous)
            self._inner.connection_lost(exc)
            _, callbacks = _ON_CLOSE.pop(id(self._inner), (None, []))
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("a connection's close callback failed")

    def data_received(self, data: bytes) -> None:
        if self._slot is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._slot is not None else None

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def runner(
    app: web.Application, limits: ConnectionLimits, *, shutdown_timeout: float = 60.0
) -> web.AppRunner:
    """aiohttp's runner for `app`, its keep-alive timer as the header deadline."""
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.header_deadline,
        shutdown_timeout=shutdown_timeout,
    )


class LimitedSite(web.BaseSite):
    """aiohttp's `TCPSite`, each connection admitted by `Admission` first."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        limits: ConnectionLimits,
        ssl_context: ssl.SSLContext | None = None,
        label: str = "http",
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._requested_port = port
        self.admission = Admission(limits)
        self._refusals = _RefusalLog(label)
        self.port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        admission, refusals = self.admission, self._refusals
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Admitted(server(), admission, refusals),
            self._host,
            self._requested_port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=admission.limits.header_deadline if self._ssl_context else None,
            backlog=self._backlog,
        )
        self.port = self._server.sockets[0].getsockname()[1]
