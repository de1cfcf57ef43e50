"""The master's HTTP routes and what each one asks to do: the one place it is checked.

Every route the master serves is a `Route`: a path, a handler and the ACL
`Action` (`master.acl`) a client needs for it. `create_app` (master/http.py)
adds them all with `add_routes`, and `check_permission`, a middleware, calls
the app's `Guard` with the matched route's action before the handler runs. A
route added without an action is refused (403), never served unchecked.

    | route                                          | action              |
    | GET /  GET /ui/{name}  GET /state  GET /events | view_state          |
    | GET /metrics                                   | view_state          |
    | GET /agents/{a}/sandbox/{f}/{t}/{file}         | access_sandboxes    |
    | POST /api/v1/frameworks/{f}/teardown           | teardown_frameworks |
    | POST /api/v1/frameworks/{f}/tasks/{t}/kill     | kill_tasks          |
    | POST /workloads (mesolite.workloads.http)      | register_frameworks |
    | POST /workloads/{name}/stop                    | teardown_frameworks |
    | POST /api/v1/scheduler (master.mesos_api)      | register_frameworks |

The Mesos scheduler API's route is `core_checked`: its role is in the body, so the
core checks register_frameworks (and run_tasks) when the framework subscribes, as it
does for a gRPC framework, and only the principal that subscribed a framework may
make its calls.

The guard decides: it returns the request's principal (None for an anonymous
client) or raises `web.HTTPUnauthorized` / `web.HTTPForbidden`. The master's is
`acl_guard`: the ACLs, through `Master.authorized`, with the principal found by
`principal_of` (the master's is `master.authn`: a client certificate or a bearer
token, and with TLS a request without either never gets here; without TLS every
request is anonymous, which ACLs allow only where they say ANY, and without an
ACL file everything is allowed). For `access_sandboxes`, `teardown_frameworks`
and `kill_tasks` the object is the principal of the framework named in the path
(none for a framework the master does not know: only an entry whose object is
ANY lets such a request through, to be told 404); a route that declares
`object_of` gives its own instead (a submitted workload's role, a workload's
submitter). Stopping one's own workload needs no ACL entry (`teardown_frameworks`
there is for ending another principal's). Handlers read the principal with
`principal(request)`: /events counts its streams per principal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from mesolite.master.acl import OBJECT_KEY, Action

if TYPE_CHECKING:
    from mesolite.master.master import Master

log = structlog.get_logger(__name__)


ObjectOf = Callable[[web.Request], Awaitable[str | None]]
"""The ACL object of a request (a role, an owner's principal), read from it; may raise an
HTTP error (400 for a body it cannot read, 404 for a name it does not know)."""


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    handler: Handler
    action: Action
    method: str = "GET"
    object_of: ObjectOf | None = None
    # The core checks `action` per call, after reading the body, as for gRPC frameworks
    # (the Mesos scheduler API: the role is in the body): the guard is not asked.
    core_checked: bool = False


Guard = Callable[[web.Request, Action], Awaitable[str | None]]
"""May this request do this action? Returns its principal (None: anonymous), or raises
web.HTTPUnauthorized (who are you?) or web.HTTPForbidden (not you)."""


async def allow_anyone(request: web.Request, action: Action) -> str | None:
    """A guard that lets everyone, anonymous, do everything (for tests)."""
    return None


def anonymous(request: web.Request) -> str | None:
    """No authentication: nobody is anyone."""
    return None


def acl_guard(
    master: Master, principal_of: Callable[[web.Request], str | None] = anonymous
) -> Guard:
    """The master's ACLs applied to each route's action, for the principal `principal_of`
    finds (see the module docstring)."""

    async def guard(request: web.Request, action: Action) -> str | None:
        who = principal_of(request)
        obj = None
        route_object = request.app.get(_OBJECTS, {}).get(request.match_info.route.resource)
        if route_object is not None:
            obj = await route_object(request)
            if action is Action.TEARDOWN_FRAMEWORKS and obj == who:
                return who  # one's own workload
        elif OBJECT_KEY[action] == "framework_principals":
            framework = master.frameworks.get(request.match_info.get("framework_id", ""))
            obj = framework.principal if framework is not None else None
        if not master.authorized(action, who, obj):
            if who is None:
                raise web.HTTPUnauthorized(text="authenticate first: anonymous clients may not")
            raise web.HTTPForbidden(text=f"principal {who!r} may not {action.value}")
        return who

    return guard


_ACTIONS = web.AppKey("route_actions", dict[web.AbstractResource, Action])
_OBJECTS = web.AppKey("route_objects", dict[web.AbstractResource | None, ObjectOf])
_CORE_CHECKED = web.AppKey("core_checked_routes", set[web.AbstractResource])
_GUARD: web.AppKey[Guard] = web.AppKey("route_guard")
_PRINCIPAL = web.RequestKey("principal", str)


def add_routes(app: web.Application, routes: Iterable[Route], guard: Guard) -> None:
    """Serve `routes` on `app`, each checked by `guard` (with `check_permission`)."""
    actions = app.setdefault(_ACTIONS, {})
    objects = app.setdefault(_OBJECTS, {})
    core_checked = app.setdefault(_CORE_CHECKED, set())
    app[_GUARD] = guard
    for route in routes:
        resource = app.router.add_resource(route.path)
        resource.add_route(route.method, route.handler)
        actions[resource] = route.action
        if route.object_of is not None:
            objects[resource] = route.object_of
        if route.core_checked:
            core_checked.add(resource)


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
        if request.match_info.route.resource in request.app[_CORE_CHECKED]:
            return await handler(request)  # authenticated; the core authorizes each call
        who = await request.app[_GUARD](request, action)
        if who is not None:
            request[_PRINCIPAL] = who
    return await handler(request)


__all__ = [
    "Guard",
    "ObjectOf",
    "Route",
    "acl_guard",
    "action_of",
    "add_routes",
    "allow_anyone",
    "anonymous",
    "check_permission",
    "principal",
]
