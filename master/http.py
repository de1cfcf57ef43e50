"""The master's HTTP port: `GET /state` as JSON, `GET /metrics` for Prometheus, the web
UI (`master.ui_routes`), the operator API (`master.operator_api`: `POST /api/v1/...`,
a teardown, a kill), and Apache Mesos' scheduler API for unmodified Mesos frameworks
(`master.mesos_api`: `POST /api/v1/scheduler`).

Every request passes three checks first: its Host header (`mesolite.http_hosts`,
against DNS rebinding), who sends it (`master.authn`: with authentication on, a
request without a principal is refused with 401, whatever its path), then the
permission its route asks for (`master.http_access`: the route table, and the ACLs
judging the principal authentication found).

/state is `ClusterSnapshot.to_json()` (mesolite/snapshot.py), with every ended task the
master keeps, or with the newest N of them for `?completed_tasks=N`, from a snapshot taken by
`master.read_model.build_snapshot` after the request arrived, encoded in a worker
thread (`master.snapshot_document`: concurrent requests share one snapshot); /metrics
is rendered from a snapshot in the same way (`MasterMetrics.exposition`). The shape
of /state is a contract that tools read, published as docs/state.schema.json: add
fields, never rename.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from mesolite.http_hosts import AllowedHosts, host_check
from mesolite.master.acl import Action
from mesolite.master.authn import Authenticator
from mesolite.master.http_access import Guard, Route, acl_guard, add_routes, check_permission
from mesolite.master.master import Master
from mesolite.master.mesos_api import endpoint as mesos_endpoint
from mesolite.master.operator_api import count_refusals, setup_operator_api
from mesolite.master.read_model import COMPLETED_TASKS_SHOWN, agent_snapshot, build_snapshot
from mesolite.master.snapshot_document import SnapshotDocument
from mesolite.master.ui_routes import StreamLimits, setup_ui
from mesolite.snapshot import ClusterSnapshot, WorkloadViews

MASTER_KEY = web.AppKey("master", Master)
STATE_KEY = web.AppKey("state_document", SnapshotDocument)
METRICS_KEY = web.AppKey("metrics_document", SnapshotDocument)


class ShorterStates:
    """GET /state?completed_tasks=N: the state with only the newest N ended tasks (the
    CLI's views ask for 0 unless they show the history). One shared document per N,
    for the `size` Ns asked for last; `snapshot(N)` takes one."""

    def __init__(self, snapshot: Callable[[int], ClusterSnapshot], size: int = 8) -> None:
        self._snapshot = snapshot
        self._size = size
        self._documents: dict[int, SnapshotDocument] = {}

    def document(self, shown: int) -> SnapshotDocument:
        document = self._documents.pop(shown, None)
        if document is None:
            document = SnapshotDocument(functools.partial(self._snapshot, shown))
        self._documents[shown] = document  # the newest last
        while len(self._documents) > self._size:
            del self._documents[next(iter(self._documents))]
        return document


SHORTER_STATES_KEY = web.AppKey("shorter_states", ShorterStates)
_MAX_SHOWN = 10**9


async def _state(request: web.Request) -> web.Response:
    """The state; `?completed_tasks=N` holds the newest N ended tasks, not all kept."""
    shown = request.query.get("completed_tasks", "all")
    if shown == "all":
        document = request.app[STATE_KEY]
    elif shown.isascii() and shown.isdigit() and int(shown) <= _MAX_SHOWN:
        document = request.app[SHORTER_STATES_KEY].document(int(shown))
    else:
        raise web.HTTPBadRequest(text="completed_tasks must be 'all' or a whole number\n")
    body = await document.body()  # encoded off the loop
    return web.Response(body=body, content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    body = await request.app[METRICS_KEY].body()  # rendered off the loop
    response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
    response.enable_compression()  # if the scraper accepts it (aiohttp: in a thread)
    return response


def create_app(
    master: Master,
    *,
    allowed_hosts: AllowedHosts | None = None,
    guard: Guard | None = None,
    authn: Authenticator | None = None,
    sandbox_ssl: ssl.SSLContext | None = None,
    routes: Sequence[Route] = (),
    workloads: Callable[[], WorkloadViews] | None = None,
) -> web.Application:
    """The master's HTTP app. `allowed_hosts`: the Host headers it answers (default: the
    local names only); `authn`: who sends each request (default: authentication off,
    every request anonymous); `guard`: who may do what (`master.http_access`; default:
    the master's ACLs, for the principal `authn` found). `sandbox_ssl`, when given, is
    how the sandbox proxy reaches the agents: HTTPS, verified against the cluster's CA,
    presenting the master's certificate. `routes` are served beside the master's own,
    checked the same way (the built-in workloads' submissions); `workloads` gives the
    jobs and services every snapshot shows.
    /events streams are limited by `master.config` (`event_streams*`)."""
    config = master.config
    authn = authn or Authenticator(enabled=False)
    app = web.Application(
        middlewares=[
            count_refusals,  # outermost: operator calls refused by any layer are counted
            host_check(allowed_hosts or AllowedHosts()),
            authn.middleware(),
            check_permission,
        ]
    )
    app[MASTER_KEY] = master

    def snapshot(ended_tasks: int | None = COMPLETED_TASKS_SHOWN) -> ClusterSnapshot:
        views = workloads() if workloads else ((), ())
        return build_snapshot(master, ended_tasks=ended_tasks, workloads=views)

    # GET /state holds every ended task the master keeps (unless asked for fewer); the
    # web UI's events the newest only; /metrics none.
    app[STATE_KEY] = SnapshotDocument(functools.partial(snapshot, None))
    app[SHORTER_STATES_KEY] = ShorterStates(snapshot)
    app[METRICS_KEY] = SnapshotDocument(functools.partial(snapshot, 0), master.metrics.exposition)
    served = [
        Route("/state", _state, Action.VIEW_STATE),
        Route("/metrics", _metrics, Action.VIEW_STATE),
        # GET / (the web UI), /events, task sandboxes
        *setup_ui(
            app,
            snapshot=snapshot,
            agent=functools.partial(agent_snapshot, master),
            limits=StreamLimits(
                total=config.event_streams, per_client=config.event_streams_per_client
            ),
            sandbox_ssl=sandbox_ssl,
        ),
        *setup_operator_api(app, master),
        # POST /api/v1/scheduler: Mesos frameworks (master/mesos_api/)
        *mesos_endpoint.setup(app, master, authn),
        *routes,
    ]
    add_routes(app, served, guard or acl_guard(master, authn.request_principal))
    return app
