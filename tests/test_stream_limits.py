"""The bounds on gRPC streams per client (master/stream_limits.py), as bookkeeping."""

from __future__ import annotations

import pytest

from mesolite.master.stream_limits import GrpcStreamLimits, GrpcStreamLimitsConfig

pytestmark = pytest.mark.unit


def test_streams_waiting_for_their_first_message_are_bounded_per_client() -> None:
    limits = GrpcStreamLimits(GrpcStreamLimitsConfig(per_client=10, waiting_per_client=2))
    assert limits.open("a") is None
    assert limits.open("a") is None
    refusal = limits.open("a")
    assert refusal is not None and "first message" in refusal
    assert limits.open("b") is None  # another client is not affected
    limits.first_message_done("a")
    assert limits.open("a") is None  # one subscribed: room for one more waiting


def test_open_streams_are_bounded_per_client_and_released() -> None:
    limits = GrpcStreamLimits(GrpcStreamLimitsConfig(per_client=2, waiting_per_client=2))
    for _ in range(2):
        assert limits.open("a") is None
        limits.first_message_done("a")
    refusal = limits.open("a")
    assert refusal is not None and "2 streams" in refusal
    limits.close("a")
    assert limits.open("a") is None
    limits.first_message_done("a")
    limits.close("a")
    limits.close("a")
    assert limits.streams("a") == 0
    assert limits.clients() == 0  # nothing kept for gone clients
