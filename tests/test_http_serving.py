"""Slow and numerous HTTP clients (mesolite/http_serving.py): a deadline for request
headers, and caps on connections fitted below the descriptor limit. The attack it
answers, run on a real master with TLS and a low descriptor limit, is in
tests/test_attack_review.py (`test_slow_unauthenticated_http_clients_...`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from mesolite.http_serving import Admission, ConnectionLimits, LimitedSite, runner
from tests.waiting import within

pytestmark = pytest.mark.integration


# The pure parts --------------------------------------------------------------------------


@pytest.mark.unit
def test_anonymous_connections_are_capped_per_address_and_in_all() -> None:
    admission = Admission(ConnectionLimits(total=10, anonymous=3, anonymous_per_address=2))
    assert admission.admit("10.0.0.1", anonymous=True) is None
    assert admission.admit("10.0.0.1", anonymous=True) is None
    refusal = admission.admit("10.0.0.1", anonymous=True)
    assert refusal is not None and "from 10.0.0.1" in refusal
    assert admission.admit("10.0.0.2", anonymous=True) is None
    refusal = admission.admit("10.0.0.3", anonymous=True)
    assert refusal is not None and "3 connections without a client certificate" in refusal
    # A client with a certificate is not turned away by the anonymous crowd ...
    assert admission.admit("10.0.0.1", anonymous=False) is None
    # ... and a closed connection gives its slot back.
    admission.release("10.0.0.1", anonymous=True)
    assert admission.admit("10.0.0.3", anonymous=True) is None
    assert (admission.total, admission.anonymous_total) == (4, 3)


@pytest.mark.unit
def test_every_connection_counts_against_the_total() -> None:
    admission = Admission(ConnectionLimits(total=3, anonymous=3, anonymous_per_address=3))
    assert admission.admit("a", anonymous=False) is None
    assert admission.admit("b", anonymous=False) is None
    assert admission.admit("c", anonymous=True) is None
    assert admission.admit("d", anonymous=False) == "3 connections open"
    admission.release("a", anonymous=False)
    assert admission.admit("d", anonymous=False) is None


@pytest.mark.unit
def test_limits_are_fitted_below_the_descriptor_limit() -> None:
    fitted = ConnectionLimits(total=1024, anonymous=256, anonymous_per_address=64).fitted(256)
    assert (fitted.total, fitted.anonymous, fitted.anonymous_per_address) == (128, 64, 64)
    roomy = ConnectionLimits().fitted(1 << 20)
    assert roomy == ConnectionLimits()  # only ever lowered


# A real server ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(limits: ConnectionLimits) -> AsyncIterator[int]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    http = runner(app, limits, shutdown_timeout=1.0)
    await http.setup()
    site = LimitedSite(http, "127.0.0.1", 0, limits=limits)
    await site.start()
    try:
        yield site.port
    finally:
        await http.cleanup()


async def get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return await within(reader.read(), 10, "an answer")
    finally:
        writer.close()


async def test_a_client_that_never_finishes_its_headers_is_closed_at_the_deadline() -> None:
    """aiohttp alone waits 75 s; a client sending a header line now and then held its
    connection for as long as it liked (2 minutes in the review)."""
    async with serving(ConnectionLimits(header_deadline=1.0)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")

        async def dribble() -> None:
            for n in range(100):  # an attacker's pace, not a wait for the server
                writer.write(f"X-Slow-{n}: 1\r\n".encode())
                await asyncio.sleep(0.1)

        dribbling = asyncio.create_task(dribble())
        try:
            closed = await within(reader.read(), 8, "the server to close the slow connection")
            assert closed == b"", closed  # closed without an answer
            assert not dribbling.done(), "the client stopped before the server closed"
        finally:
            dribbling.cancel()
            writer.close()


async def test_connections_over_the_cap_are_closed_and_the_others_served() -> None:
    limits = ConnectionLimits(total=10, anonymous=10, anonymous_per_address=3)
    async with serving(limits) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            assert await get(port) == b"", "a fourth connection from one address was served"
            reader, writer = held[0]
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = await within(reader.read(), 10, "an answer on a held connection")
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
            await within(_closed(held[0][1]), 10, "the answered connection to close")
            assert (await get(port)).endswith(b"hello"), "a freed slot was not given back"
        finally:
            for _, writer in held:
                writer.close()


async def _closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
