"""Read-only HTTP views of the master: `GET /state` as JSON, `GET /metrics` for Prometheus,
and the web UI (`master.ui_routes`).

/state is `ClusterSnapshot.to_json()` (mesolite/snapshot.py), built per request by
`master.read_model.build_snapshot`. Its shape is a contract that tools read, published
as docs/state.schema.json: add fields, never rename.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client.aiohttp import make_aiohttp_handler

from mesolite.master.master import Master
from mesolite.master.read_model import agent_snapshot, build_snapshot
from mesolite.master.ui_routes import setup_ui

MASTER_KEY = web.AppKey("master", Master)


async def _state(request: web.Request) -> web.Response:
    return web.json_response(build_snapshot(request.app[MASTER_KEY]).to_json())


def create_app(
    master: Master,
    *,
    middlewares: Iterable[Middleware] = (),
    sandbox_ssl: ssl.SSLContext | None = None,
) -> web.Application:
    """`middlewares` run before every route (the authenticator's first); `sandbox_ssl`,
    when given, is how the sandbox proxy reaches the agents: HTTPS, verified against the
    cluster's CA, presenting the master's certificate."""
    app = web.Application(middlewares=list(middlewares))
    app[MASTER_KEY] = master
    app.router.add_get("/state", _state)
    app.router.add_get("/metrics", make_aiohttp_handler(master.metrics.registry))
    # GET / (the web UI), /events, task sandboxes
    setup_ui(
        app,
        snapshot=functools.partial(build_snapshot, master),
        agent=functools.partial(agent_snapshot, master),
        sandbox_ssl=sandbox_ssl,
    )
    return app
