"""A `StateBroadcaster` served alone, for tests of the /events streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from mesolite.master.ui_routes import StateBroadcaster


@contextlib.asynccontextmanager
async def events_app(hub: StateBroadcaster) -> AsyncIterator[TestClient[Any, Any]]:
    """`hub.stream` served at /events, with `hub.run()` in the background."""
    app = web.Application()
    app.router.add_get("/events", hub.stream)
    runner = asyncio.create_task(hub.run())
    try:
        async with TestClient(TestServer(app)) as client:
            yield client
    finally:
        hub.close()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
