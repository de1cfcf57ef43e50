"""Read-only HTTP views of the master: `GET /state` as JSON, `GET /metrics` for Prometheus,
and the web UI (`master.ui_routes`).

/state is `ClusterSnapshot.to_json()` (mesolite/snapshot.py), built per request by
`master.read_model.build_snapshot`. Its shape is a contract that tools read, published
as docs/state.schema.json: add fields, never rename.
"""

from __future__ import annotations

import functools

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from mesolite.master.master import Master
from mesolite.master.read_model import agent_snapshot, build_snapshot
from mesolite.master.ui_routes import setup_ui

MASTER_KEY = web.AppKey("master", Master)


async def _state(request: web.Request) -> web.Response:
    return web.json_response(build_snapshot(request.app[MASTER_KEY]).to_json())


def create_app(master: Master) -> web.Application:
    app = web.Application()
    app[MASTER_KEY] = master
    app.router.add_get("/state", _state)
    app.router.add_get("/metrics", make_aiohttp_handler(master.metrics.registry))
    # GET / (the web UI), /events, task sandboxes
    setup_ui(
        app,
        snapshot=functools.partial(build_snapshot, master),
        agent=functools.partial(agent_snapshot, master),
    )
    return app
