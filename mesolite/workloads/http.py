"""Submitting and stopping workloads over the master's HTTP port.

    POST /workloads               {"source": "sweep.toml", "text": "<the file>"}
                                  201 and the workload; 400 with `FILE:LINE: problem`
    POST /workloads/{name}/stop   200 and the workload

Served by the master's HTTP app (`MasterServer(routes=...)`), so a request passes the
same checks as every other: its Host header, who sends it (a client certificate or a
bearer token, with TLS), and the ACLs (`master.http_access`):

- a submission is `register_frameworks` in the workload's role, for the submitter's
  principal: who may run a framework in a role may run a workload there;
- a stop is `teardown_frameworks` of the workload's owner: the principal that submitted
  it may stop it, another only if the ACLs let it end that principal's frameworks.

The body must be `application/json`, which a web page on another origin cannot send
without the browser asking first (a CORS preflight the master never answers), so a
page a user visits cannot submit in their name. Bodies are bounded (`MAX_BODY`).
The views (`mesolite jobs|services`, the web UI) read GET /state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from mesolite._dataclass_json import encode
from mesolite.master.acl import Action
from mesolite.master.http_access import Route, principal
from mesolite.snapshot import JobSnapshot, ServiceSnapshot
from mesolite.workloads.runner import SubmissionRefused, WorkloadRunner
from mesolite.workloads.spec import MAX_FILE_BYTES, WorkloadFileError, WorkloadSpec

__all__ = ["MAX_BODY", "routes"]

MAX_BODY = 4 * MAX_FILE_BYTES  # the file, JSON-escaped
MAX_SOURCE = 256
Posted = tuple[WorkloadSpec, str, str]  # the spec, the file's text, its name
_POSTED: web.RequestKey[Posted] = web.RequestKey("posted_workload")

CurrentRunner = Callable[[], WorkloadRunner | None]


def routes(current: CurrentRunner) -> list[Route]:
    """The routes, for the runner `current()` returns (None: workloads are off)."""

    def runner() -> WorkloadRunner:
        found = current()
        if found is None:
            raise web.HTTPServiceUnavailable(text="this master runs no built-in workloads\n")
        return found

    async def posted(request: web.Request) -> Posted:
        """The submitted file, read and checked once per request."""
        if _POSTED in request:
            return request[_POSTED]
        if request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(text="send the workload as application/json\n")
        body = await _read_at_most(request, MAX_BODY)
        try:
            data = json.loads(body)
        except ValueError:
            raise web.HTTPBadRequest(text="the body is not JSON\n") from None
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(text='expected {"source": ..., "text": ...}\n')
        text, source = data.get("text"), data.get("source", "<workload>")
        if not isinstance(text, str) or not isinstance(source, str):
            raise web.HTTPBadRequest(text='"text" and "source" must be strings\n')
        # A name for messages and logs: bounded, and no control characters to forge lines.
        source = "".join(c if c.isprintable() else "?" for c in source[:MAX_SOURCE])
        try:
            spec = runner().check(text, source)
        except WorkloadFileError as e:
            raise web.HTTPBadRequest(text=f"{e}\n") from None
        request[_POSTED] = (spec, text, source)
        return spec, text, source

    async def role_of(request: web.Request) -> str | None:
        spec, _, _ = await posted(request)
        return spec.role

    async def owner_of(request: web.Request) -> str | None:
        try:
            return runner().owner_of(request.match_info["name"])
        except SubmissionRefused as e:
            raise web.HTTPNotFound(text=f"{e}\n") from None

    async def submit(request: web.Request) -> web.Response:
        _, text, source = await posted(request)
        try:
            workload = runner().submit(text, source, principal(request))
        except SubmissionRefused as e:
            return web.Response(status=e.status, text=f"{e}\n")
        return _answer(workload.snapshot(), status=201)

    async def stop(request: web.Request) -> web.Response:
        try:
            workload = await runner().stop(request.match_info["name"])
        except SubmissionRefused as e:
            return web.Response(status=e.status, text=f"{e}\n")
        return _answer(workload.snapshot())

    return [
        Route("/workloads", submit, Action.REGISTER_FRAMEWORKS, "POST", role_of),
        Route("/workloads/{name}/stop", stop, Action.TEARDOWN_FRAMEWORKS, "POST", owner_of),
    ]


async def _read_at_most(request: web.Request, limit: int) -> bytes:
    """The request's body; 413 as soon as it is longer than `limit`, read no further."""
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(limit, request.content_length)
    body = bytearray()
    while chunk := await request.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(limit, len(body))
    return bytes(body)


def _answer(snapshot: JobSnapshot | ServiceSnapshot, status: int = 200) -> web.Response:
    """The workload as /state shows it, with its kind."""
    kind = "job" if isinstance(snapshot, JobSnapshot) else "service"
    document: dict[str, Any] = {"kind": kind, **encode(snapshot)}
    return web.json_response(document, status=status)
