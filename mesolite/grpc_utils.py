"""One place for gRPC channel and server options, so every component agrees.

TLS too: `bind(..., tls=...)` listens with the master's certificate and, by default,
requires and verifies a client certificate from the cluster's CA (mutual TLS; the peer's
principal is then its certificate's CN, `auth_context()["x509_common_name"]`). grpcio's
Python API offers only "require and verify" or "do not ask" for client certificates, so a
port for bearer-token clients is a second, server-authenticated TLS port
(`client_cert=False`). `create_channel(..., tls=..., token=...)` verifies the server
against the CA, presents the client's certificate if it has one, and sends a token as
`authorization: Bearer <token>` on every call, never over plaintext.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from mesolite.tls import MASTER_SERVER_NAME, TlsConfig, TlsError

_MB = 1024 * 1024

_COMMON_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", 64 * _MB),
    # Long-lived streams: ping so that a dead peer is noticed even when idle.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

_CLIENT_OPTIONS: list[tuple[str, Any]] = [
    *_COMMON_OPTIONS,
    ("grpc.max_receive_message_length", 64 * _MB),  # offers of a large cluster
    # Each channel keeps its own connection state: a fresh channel to a master
    # that came back must not inherit an old channel's long reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

# What the master accepts from one client message: a bound on what any client can
# make it parse (a registration of 10,000 tasks is well under it).
MAX_CLIENT_MESSAGE = 4 * _MB

_SERVER_OPTIONS: list[tuple[str, Any]] = [
    *_COMMON_OPTIONS,
    ("grpc.max_receive_message_length", MAX_CLIENT_MESSAGE),
    # HTTP/2 streams one connection may hold open at once (the servicers bound
    # streams per client across connections: master/stream_limits.py).
    ("grpc.max_concurrent_streams", 64),
    # Two masters on one port must fail loudly, not share the port.
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


# New streams grpc queues for the application by default: the aio server accepts them one
# per turn of its event loop, and past 1,000 waiting grpc drops new ones at random (all
# of them past 3,000), which clients see as CANCELLED or "Internal error from Core". A
# storm of agents registering at once is all new streams.
DEFAULT_PENDING_STREAMS = 1_000


def create_server(
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    pending_streams: int = DEFAULT_PENDING_STREAMS,
) -> grpc.aio.Server:
    """A server that queues up to `pending_streams` new streams (RPCs) not yet taken
    by the application (grpc's `max_pending_requests`, soft and hard limit alike), for
    at most 30 s each (grpc's default), rather than drop them."""
    options = [
        *_SERVER_OPTIONS,
        ("grpc.server.max_pending_requests", pending_streams),
        ("grpc.server.max_pending_requests_hard_limit", pending_streams),
    ]
    return grpc.aio.server(interceptors=list(interceptors), options=options)


def create_channel(
    target: str, tls: TlsConfig | None = None, token: str | None = None
) -> grpc.aio.Channel:
    """A channel to the master at `target` (HOST:PORT): plaintext without `tls`; with it,
    the server must hold a certificate from `tls.ca` naming `MASTER_SERVER_NAME` (only the
    master's does), `tls.cert` is presented, and `token` is sent as a bearer token on
    every call."""
    if tls is None:
        if token is not None:
            raise TlsError("a bearer token is sent only over TLS: give the CA to verify with")
        return grpc.aio.insecure_channel(target, options=_CLIENT_OPTIONS)
    material = tls.read()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=material.ca, private_key=material.key, certificate_chain=material.cert
    )
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    # The master is known by a name only its certificate holds, wherever it is dialled.
    options = [*_CLIENT_OPTIONS, ("grpc.ssl_target_name_override", MASTER_SERVER_NAME)]
    return grpc.aio.secure_channel(target, credentials, options=options)


def bind(
    server: grpc.aio.Server,
    host: str,
    port: int,
    tls: TlsConfig | None = None,
    *,
    client_cert: bool = True,
) -> int:
    """Bind a port; returns the port actually bound (useful with port 0). Plaintext without
    `tls`; with it, TLS with `tls.cert`, and a client certificate from `tls.ca` required
    unless `client_cert` is False (the bearer-token port)."""
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        material = tls.read()
        if material.cert is None or material.key is None:
            raise TlsError("a TLS server needs a certificate and key (tls.crt, tls.key)")
        credentials = grpc.ssl_server_credentials(
            [(material.key, material.cert)],
            root_certificates=material.ca,
            require_client_auth=client_cert,
        )
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    return int(bound)
