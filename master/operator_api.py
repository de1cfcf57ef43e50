"""The master's operator API: what `mesolite teardown` and `mesolite kill` call.

    POST /api/v1/frameworks/{framework_id}/teardown              teardown_frameworks
    POST /api/v1/frameworks/{framework_id}/tasks/{task_id}/kill  kill_tasks

On the master's HTTP port, beside /state, so the CLI reaches it as it reaches the
views: the same address, TLS and principal (a client certificate or a bearer
token, `master.authn`). Each route's ACL action (object: the framework's
principal) is checked by the route table's guard (`master.http_access`) before
the handler runs; the handler then asks the core (`master/operator.py`), which
checks the request against the state.

A call must be `Content-Type: application/json` with a JSON object as its body
(`{}`; at most `MAX_BODY` bytes): a web page cannot send that to another origin
without a CORS preflight, which this server never grants, so a page the operator
visits cannot tear frameworks down through the operator's browser (its client
certificate included).

Answers are JSON: `{"framework_id": ..., "message": ...}` and 200 when done,
`{"error": ...}` with 400 (a bad id or body), 404 (no such framework or task),
409 (it has already ended, is being torn down, or its agent is away), 415 (not
JSON); the guard's 401 and 403 say who may not. Every refusal, whoever refused it
(authentication, the ACLs, this module, the core), is logged with the ids and the
caller's principal and counted in `mesolite_calls_rejected_total{call=...}`
(`operator_teardown`, `operator_kill`), by `count_refusals`, the app's outermost
middleware.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from mesolite.logs import clip
from mesolite.master.acl import Action
from mesolite.master.authn import Authenticator
from mesolite.master.errors import OperatorCallRefused, Refusal
from mesolite.master.http_access import Route, action_of
from mesolite.master.master import Master

log = structlog.get_logger(__name__)

MAX_BODY = 4096
TEARDOWN_PATH = "/api/v1/frameworks/{framework_id}/teardown"
KILL_PATH = "/api/v1/frameworks/{framework_id}/tasks/{task_id}/kill"
# The `call` label of mesolite_calls_rejected_total for each operator call.
CALLS = {Action.TEARDOWN_FRAMEWORKS: "operator_teardown", Action.KILL_TASKS: "operator_kill"}

_MASTER = web.AppKey("operator_master", Master)

_STATUS = {
    Refusal.INVALID: web.HTTPBadRequest,
    Refusal.NOT_FOUND: web.HTTPNotFound,
    Refusal.PRECONDITION: web.HTTPConflict,
    Refusal.FORBIDDEN: web.HTTPForbidden,
}


def _error(kind: type[web.HTTPException], message: str) -> web.HTTPException:
    return kind(text=json.dumps({"error": message}), content_type="application/json")


def _too_large(size: int) -> web.HTTPException:
    return web.HTTPRequestEntityTooLarge(
        MAX_BODY,
        size,
        text=json.dumps({"error": f"the body is larger than {MAX_BODY} bytes"}),
        content_type="application/json",
    )


async def _body(request: web.Request) -> dict[str, Any]:
    """The call's JSON object; refused unless it is one, sent as application/json."""
    if request.content_type != "application/json":
        raise _error(
            web.HTTPUnsupportedMediaType,
            "send Content-Type: application/json with a JSON object body ({})",
        )
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise _too_large(request.content_length)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():  # to its end, at most MAX_BODY bytes
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_large(size)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        raise _error(web.HTTPBadRequest, "the body is not JSON") from None
    if not isinstance(body, dict) or body:
        raise _error(web.HTTPBadRequest, "the body must be an empty JSON object: {}")
    return body


def _caller(request: web.Request) -> str | None:
    return Authenticator.request_principal(request)


async def _teardown(request: web.Request) -> web.Response:
    await _body(request)
    framework_id = request.match_info["framework_id"]
    try:
        tasks = request.app[_MASTER].operator_teardown(framework_id, _caller(request))
    except OperatorCallRefused as e:
        raise _error(_STATUS[e.refusal], str(e)) from None
    return web.json_response(
        {
            "framework_id": framework_id,
            "tasks_killed": tasks,
            "message": f"framework {framework_id} torn down: {tasks} task(s) being killed; "
            "it is removed once they have ended",
        }
    )


async def _kill(request: web.Request) -> web.Response:
    await _body(request)
    framework_id, task_id = request.match_info["framework_id"], request.match_info["task_id"]
    try:
        agent_id = request.app[_MASTER].operator_kill(framework_id, task_id, _caller(request))
    except OperatorCallRefused as e:
        raise _error(_STATUS[e.refusal], str(e)) from None
    return web.json_response(
        {
            "framework_id": framework_id,
            "task_id": task_id,
            "agent_id": agent_id,
            "message": f"kill of task {task_id} sent to agent {agent_id}; its framework "
            "hears how it ended",
        }
    )


def setup_operator_api(app: web.Application, master: Master) -> list[Route]:
    """Set `app` up for the operator API; returns its routes for the route table."""
    app[_MASTER] = master
    return [
        Route(TEARDOWN_PATH, _teardown, Action.TEARDOWN_FRAMEWORKS, method="POST"),
        Route(KILL_PATH, _kill, Action.KILL_TASKS, method="POST"),
    ]


@web.middleware
async def count_refusals(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Log and count every refused operator call, whichever layer refused it."""
    action = action_of(request)
    call = CALLS.get(action) if action is not None else None
    if call is None or _MASTER not in request.app:
        return await handler(request)
    try:
        response = await handler(request)
    except web.HTTPException as e:
        if e.status >= 400:
            _refused(request, call, e.status, e.text or e.reason)
        raise
    if response.status >= 400:
        _refused(request, call, response.status, response.reason)
    return response


def _refused(request: web.Request, call: str, status: int, reason: str) -> None:
    request.app[_MASTER].metrics.call_rejected(call)
    info = request.match_info
    log.warning(
        "operator call refused",
        call=call,
        status=status,
        reason=clip(_message(reason)),
        principal=_caller(request),
        framework_id=clip(info.get("framework_id", "")),
        task_id=clip(info["task_id"]) if "task_id" in info else None,
        remote=request.remote,
    )


def _message(text: str) -> str:
    """The error's message, from a JSON error body or plain text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    return str(body.get("error", text)) if isinstance(body, dict) else text.strip()


__all__ = [
    "CALLS",
    "KILL_PATH",
    "MAX_BODY",
    "TEARDOWN_PATH",
    "count_refusals",
    "setup_operator_api",
]
