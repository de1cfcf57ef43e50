"""One place for gRPC channel and server options, so every component agrees."""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

_MB = 1024 * 1024

_COMMON_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", 64 * _MB),
    ("grpc.max_receive_message_length", 64 * _MB),
    # Long-lived streams: ping so that a dead peer is noticed even when idle.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

_CLIENT_OPTIONS: list[tuple[str, Any]] = [
    *_COMMON_OPTIONS,
    # Each channel keeps its own connection state: a fresh channel to a master
    # that came back must not inherit an old channel's long reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

_SERVER_OPTIONS: list[tuple[str, Any]] = [
    *_COMMON_OPTIONS,
    # Two masters on one port must fail loudly, not share the port.
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]


def create_server() -> grpc.aio.Server:
    return grpc.aio.server(options=_SERVER_OPTIONS)


def create_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=_CLIENT_OPTIONS)


def bind(server: grpc.aio.Server, host: str, port: int) -> int:
    """Bind an insecure port; returns the port actually bound (useful with port 0)."""
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    return int(bound)
