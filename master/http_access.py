"""The master's HTTP routes and what each one asks to do: the one place it is checked.

Every route the master serves is a `Route`: a path, a handler and an `Action`,
named after the Mesos ACL it corresponds to. `create_app` (master/http.py) adds
them all with `add_routes`, and `check_permission`, a middleware, calls the
app's `Guard` with the matched route's action before the handler runs. A route
added without an action is refused (403), never served unchecked.

The guard decides: it returns the request's principal (None for an anonymous
client) or raises `web.HTTPUnauthorized` / `web.HTTPForbidden`. Without
authentication it is `allow_anyone`. With authentication, a guard takes the
principal from the connection (client certificate or bearer token) and checks
it against the ACLs for the action, and for `ACCESS_SANDBOXES` the framework
in `request.match_info["framework_id"]`. Handlers read the principal with
`principal(request)`: /events counts its streams per principal.

    | route                                        | action             |
    | GET /  GET /ui/{name}                        | view_ui            |
    | GET /state  GET /events                      | view_state         |
    | GET /metrics                                 | view_metrics       |
    | GET /agents/{a}/sandbox/{f}/{t}/{file}       | access_sandboxes   |
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

log = structlog.get_logger(__name__)


class Action(enum.StrEnum):
    """What a request asks to do: the permission a guard checks."""

    VIEW_UI = "view_ui"  # the page, its script and its style: no cluster data
    VIEW_STATE = "view_state"  # the cluster's state: GET /state and the /events stream
    VIEW_METRICS = "view_metrics"  # GET /metrics
    ACCESS_SANDBOXES = "access_sandboxes"  # a task's stdout and stderr


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    handler: Handler
    action: Action
    method: str = "GET"


Guard = Callable[[web.Request, Action], Awaitable[str | None]]
"""May this request do this action? Returns its principal (None: anonymous), or raises
web.HTTPUnauthorized (who are you?) or web.HTTPForbidden (not you)."""


async def allow_anyone(request: web.Request, action: Action) -> str | None:
    """The guard without authentication: everyone is anonymous and may do everything."""
    return None


_ACTIONS = web.AppKey("route_actions", dict[web.AbstractResource, Action])
_GUARD: web.AppKey[Guard] = web.AppKey("route_guard")
_PRINCIPAL = web.RequestKey("principal", str)


def add_routes(app: web.Application, routes: Iterable[Route], guard: Guard) -> None:
    """Serve `routes` on `app`, each checked by `guard` (with `check_permission`)."""
    actions = app.setdefault(_ACTIONS, {})
    app[_GUARD] = guard
    for route in routes:
        resource = app.router.add_resource(route.path)
        resource.add_route(route.method, route.handler)
        actions[resource] = route.action


def principal(request: web.Request) -> str | None:
    """Who the guard found the request to come from; None if anonymous."""
    return request.get(_PRINCIPAL)


def action_of(request: web.Request) -> Action | None:
    """The action of the route `request` matched; None if it matched none (a 404)."""
    resource = request.match_info.route.resource
    return None if resource is None else request.app[_ACTIONS].get(resource)


@web.middleware
async def check_permission(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place a route's permission is checked, before its handler runs."""
    if request.match_info.route.resource is not None:
        action = action_of(request)
        if action is None:
            log.error("route served without an action", path=request.path)
            raise web.HTTPForbidden(text="no permission is defined for this route")
        who = await request.app[_GUARD](request, action)
        if who is not None:
            request[_PRINCIPAL] = who
    return await handler(request)


__all__ = [
    "Action",
    "Guard",
    "Route",
    "action_of",
    "add_routes",
    "allow_anyone",
    "check_permission",
    "principal",
]
