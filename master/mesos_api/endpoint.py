"""POST /api/v1/scheduler on the master's HTTP port: Apache Mesos' v1 scheduler API.

Answered in Mesos' order (`Master::Http::scheduler`, src/master/http.cpp):

    307  this master is not the leader (Location: the leader); 503 if none is known
    405  not POST
    400  no Content-Type;  415  one that is neither JSON nor protobuf
    413  a body over MAX_BODY bytes (a bound of mesolite's)
    400  a body that is not a Call, or past a bound (`wire.py`); a Call Mesos' validation
         refuses (no type, no framework id, the call's own field missing)
    SUBSCRIBE: 406 an Accept that allows neither encoding; 400 a Mesos-Stream-Id
         header, or a FrameworkInfo.principal other than the authenticated one;
         429 past the open subscriptions a client may hold (mesolite's bound);
         else 200, a chunked RecordIO stream of events with a new Mesos-Stream-Id,
         beginning with SUBSCRIBED, or with ERROR when the master refuses it
    other calls: 400 an unknown framework, or another principal's; 403 a framework
         not subscribed, or not over HTTP; 400 no Mesos-Stream-Id, or not the
         framework's current one; else 202, and the call goes to the core (`calls.py`)

Who calls is the connection's principal (`master.authn`: a client certificate or a
bearer token, required with TLS; the middleware answers 401 before this runs). The
core checks the ACLs (register_frameworks for the role, run_tasks for the user) at
SUBSCRIBE, as for gRPC frameworks; a framework belongs to the principal that
subscribed it, and only that principal may use its stream id.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from mesolite import http_serving
from mesolite.logs import clip
from mesolite.master import messages as msg
from mesolite.master.acl import Action
from mesolite.master.authn import Authenticator
from mesolite.master.errors import RegistrationRefused
from mesolite.master.http_access import Route
from mesolite.master.master import Master
from mesolite.master.mesos_api import calls, convert, media, recordio, wire
from mesolite.master.mesos_api.subscriptions import Subscription, Subscriptions
from mesolite.stream_writer import StreamWriter
from mesolite.v1.mesos import scheduler_pb2

log = structlog.get_logger(__name__)

PATH = "/api/v1/scheduler"
STREAM_ID = "Mesos-Stream-Id"
MAX_BODY = 4 << 20  # as the gRPC port's largest message
# Bodies past this are parsed in a worker thread: json_format turns JSON into a message at
# about 1 ms per KiB (a 1,000-task ACCEPT of 250 KB: 0.2-0.3 s), too long for the loop.
THREAD_PARSE_BYTES = 16 << 10
OUTBOX_CAPACITY = 10_000  # as a gRPC framework's (master/servicers.py)
BATCH_EVENTS = 1_000

Call = scheduler_pb2.Call
_CLIENT_LEFT = "the client closed the connection"

# The field each call must carry (Mesos' validation::scheduler::call::validate).
_REQUIRED = {
    Call.SUBSCRIBE: "subscribe",
    Call.ACCEPT: "accept",
    Call.DECLINE: "decline",
    Call.KILL: "kill",
    Call.SHUTDOWN: "shutdown",
    Call.ACKNOWLEDGE: "acknowledge",
    Call.RECONCILE: "reconcile",
    Call.MESSAGE: "message",
    Call.REQUEST: "request",
}


def _text(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=headers or None)


def call_problem(call: scheduler_pb2.Call, principal: str | None) -> str | None:
    """What Mesos' validation says of a Call before anything is done with it."""
    if not call.HasField("type") or call.type == Call.UNKNOWN:
        return "Expecting 'type' to be present"
    field = _REQUIRED.get(call.type)
    if field is not None and not call.HasField(field):  # type: ignore[arg-type]
        return f"Expecting '{field}' to be present"
    if call.type == Call.SUBSCRIBE:
        info = call.subscribe.framework_info
        if not call.subscribe.HasField("framework_info"):
            return "Expecting 'subscribe.framework_info' to be present"
        if info.HasField("id") and call.framework_id.value != info.id.value:
            return "'framework_id' differs from 'subscribe.framework_info.id'"
        if principal is not None and info.HasField("principal") and info.principal != principal:
            return (
                f"Authenticated principal '{principal}' does not match principal "
                f"'{info.principal}' set in `FrameworkInfo`"
            )
        return None
    if not call.framework_id.value:
        return "Expecting 'framework_id' to be present"
    if call.type == Call.KILL and not call.kill.task_id.value:
        return "Expecting 'kill.task_id' to be present"
    if call.type == Call.ACKNOWLEDGE:
        ack = call.acknowledge
        if not (ack.uuid and ack.task_id.value and ack.agent_id.value):
            return "Expecting 'acknowledge' to name an agent, a task and a uuid"
    return None


class SchedulerEndpoint:
    def __init__(
        self, master: Master, authn: Authenticator, subscriptions: Subscriptions | None = None
    ) -> None:
        self._master = master
        self._authn = authn
        deadline = master.config.http_connections.header_deadline
        self.subscriptions = subscriptions or Subscriptions(hold_for=3 * deadline)
        self._renew_every = deadline / 3

    def route(self) -> Route:
        return Route(PATH, self.handle, Action.REGISTER_FRAMEWORKS, method="*", core_checked=True)

    async def keep_alive(self, app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: renews the subscriptions' held connections."""
        task = asyncio.create_task(self.subscriptions.keep_alive(self._renew_every))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def handle(self, request: web.Request) -> web.StreamResponse:
        leadership = self._master.leadership  # master/leadership.py (HA masters: issue 16)
        if not leadership.is_leading():
            leader = leadership.leader()
            if leader is None:
                return _text(503, "No leading master")
            where = leader.http.partition("://")[2] or leader.http
            return _text(307, "Not the leading master", Location=f"//{where}{PATH}")
        if request.method != "POST":
            return _text(
                405, f"Expecting one of {{ 'POST' }}, but received '{request.method}'", Allow="POST"
            )
        header = request.headers.get("Content-Type")
        if header is None:
            return _text(400, "Expecting 'Content-Type' to be present")
        encoding = media.content_type(header)
        if encoding is None:
            return _text(415, f"Expecting 'Content-Type' of {media.JSON} or {media.PROTOBUF}")
        body = await _read_body(request)
        if body is None:
            return _text(413, f"Request body larger than {MAX_BODY} bytes")
        try:
            if len(body) > THREAD_PARSE_BYTES:
                call = await asyncio.to_thread(wire.parse_call, body, encoding)
            else:
                call = wire.parse_call(body, encoding)
        except wire.BadCall as e:
            return _text(400, str(e))
        principal = self._authn.request_principal(request)
        if problem := call_problem(call, principal):
            self._master.metrics.call_rejected(Call.Type.Name(call.type).lower())
            return _text(400, f"Failed to validate scheduler::Call: {problem}")
        if call.type == Call.SUBSCRIBE:
            return await self._subscribe(request, call, principal)
        return self._call(request, call, principal)

    def _call(
        self, request: web.Request, call: scheduler_pb2.Call, principal: str | None
    ) -> web.Response:
        framework_id = call.framework_id.value
        framework = self._master.frameworks.get(framework_id)
        if framework is None or framework.removing:
            return _text(400, "Framework cannot be found")
        if framework.principal != principal:
            log.warning(
                "mesos call for another principal's framework refused",
                framework_id=framework_id,
                principal=principal,
            )
            return _text(
                400,
                f"Authenticated principal '{principal or ''}' does not match principal "
                f"'{framework.principal or ''}' set in `FrameworkInfo`",
            )
        if framework.outbox is None:
            return _text(403, "Framework is not subscribed")
        subscription = self.subscriptions.of_framework(framework_id)
        if subscription is None or subscription.outbox is not framework.outbox:
            return _text(403, "Framework is not connected via HTTP")
        stream_id = request.headers.get(STREAM_ID)
        if stream_id is None:
            return _text(400, "All non-subscribe calls should include the 'Mesos-Stream-Id' header")
        if stream_id != subscription.stream_id:
            return _text(
                400,
                f"The stream ID '{clip(stream_id, 128)}' included in this request didn't match "
                f"the stream ID currently associated with framework ID {framework_id}",
            )
        if call.type == Call.UPDATE_FRAMEWORK:
            return _text(501, "UPDATE_FRAMEWORK is not supported by mesolite")
        calls.handle(self._master, framework_id, call)
        self.subscriptions.hold(subscription, request.protocol)
        return web.Response(status=202)

    async def _subscribe(
        self, request: web.Request, call: scheduler_pb2.Call, principal: str | None
    ) -> web.StreamResponse:
        encoding = media.response_media(request.headers.get("Accept"))
        if encoding is None:
            return _text(406, f"Expecting 'Accept' to allow '{media.PROTOBUF}' or '{media.JSON}'")
        if STREAM_ID in request.headers:
            return _text(400, "Subscribe calls should not include the 'Mesos-Stream-Id' header")
        client = principal if principal is not None else f"@{request.remote}"
        if refusal := self.subscriptions.admit(client):
            log.warning("mesos subscription refused", client=clip(client), reason=refusal)
            return _text(429, refusal)
        try:
            return await self._stream(request, call, principal, client, encoding)
        finally:
            self.subscriptions.release(client)

    async def _stream(
        self,
        request: web.Request,
        call: scheduler_pb2.Call,
        principal: str | None,
        client: str,
        encoding: str,
    ) -> web.StreamResponse:
        outbox: StreamWriter[msg.FrameworkMessage] = StreamWriter(OUTBOX_CAPACITY)
        response = web.StreamResponse(status=200)
        response.content_type = encoding
        response.headers["Cache-Control"] = "no-cache"
        response.enable_chunked_encoding()
        try:
            framework = convert.framework_from_mesos(call.subscribe.framework_info)
            framework_id = self._master.subscribe(framework.info, outbox, principal=principal)
        except (convert.ConvertError, RegistrationRefused) as e:
            log.warning("mesos subscription refused", principal=principal, reason=clip(str(e)))
            self._master.metrics.call_rejected("subscribe")
            response.headers[STREAM_ID] = str(uuid.uuid4())  # as Mesos: one per SUBSCRIBE
            await response.prepare(request)
            await response.write(
                recordio.encode(wire.encode(convert.error_event(str(e)), encoding))
            )
            return response
        subscription = Subscription(
            framework_id,
            principal,
            client,
            encoding,
            self._master.frameworks[framework_id].info.role,
            framework.partition_aware,
            framework.multi_role,
            outbox,
        )
        response.headers[STREAM_ID] = subscription.stream_id
        self.subscriptions.add(subscription)
        cancel = http_serving.on_close(request.protocol, lambda: outbox.close(_CLIENT_LEFT))
        unwatch = self._authn.watch_request(request, outbox.close)  # a token revoked: ends
        if framework.info.role in call.subscribe.suppressed_roles:
            self._master.suppress(framework_id)  # subscribed suppressed, as Mesos allows
        try:
            await response.prepare(request)
            async for messages in outbox.drain_batches(BATCH_EVENTS):
                self._master.registry.flush()  # what the events acknowledge is on disk
                chunk = b"".join(
                    recordio.encode(wire.encode(event, encoding))
                    for m in messages
                    if (
                        event := convert.event_of(
                            m,
                            subscription.role,
                            subscription.partition_aware,
                            subscription.multi_role,
                        )
                    )
                    is not None
                )
                if chunk:
                    await response.write(chunk)
            if outbox.close_reason != _CLIENT_LEFT and not outbox.overflowed:
                # Ended by the master (a newer subscription, a teardown, the ACLs): as
                # Mesos, the framework is told why in a last ERROR event.
                error = convert.error_event(f"Framework stream ended: {outbox.close_reason}")
                await response.write(recordio.encode(wire.encode(error, encoding)))
        except ConnectionError:
            pass  # the client went away
        finally:
            cancel()
            unwatch()
            outbox.close("the subscription ended")
            self.subscriptions.remove(subscription)
            self._master.disconnect_framework(framework_id, outbox)
        return response


async def _read_body(request: web.Request) -> bytes | None:
    """The request's body; None past MAX_BODY (read no further)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def setup(app: web.Application, master: Master, authn: Authenticator) -> list[Route]:
    """Serve the Mesos scheduler API on `app`; returns its route (for `add_routes`)."""
    endpoint = SchedulerEndpoint(master, authn)
    app[ENDPOINT_KEY] = endpoint
    app.cleanup_ctx.append(endpoint.keep_alive)
    return [endpoint.route()]


ENDPOINT_KEY = web.AppKey("mesos_scheduler_endpoint", SchedulerEndpoint)
