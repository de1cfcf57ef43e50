"""The master's wire edge: gRPC servicers for frameworks and agents.

Thin by design. Each stream has one reader (calls -> `Master` methods, with
protobuf converted to domain values on the way in) and one writer (the peer's
outbox, a `StreamWriter`, with domain messages converted to protobuf on the way out). Rejected
calls become ERROR events; nothing else happens here.

Who calls is settled before a servicer runs: with authentication on, the interceptor
(`master/authn.py`) has refused every call without a principal; the servicers pass the
principal (a certificate's CN, or a token's) to the core with the subscription or the
registration. It comes from the connection, never from a field the client fills in.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar
from urllib.parse import unquote

import grpc
import grpc.aio
import structlog
from google.protobuf.message import DecodeError, Message

from mesolite import convert
from mesolite.logs import clip
from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.authn import Authenticator
from mesolite.master.errors import RegistryFenced
from mesolite.master.leadership import Leadership, SoleLeadership
from mesolite.master.master import CallRejected, Master, Refusal, RegistrationRefused
from mesolite.master.stream_limits import GrpcStreamLimits
from mesolite.resources import InvalidResources
from mesolite.stream_writer import StreamWriter, in_batches
from mesolite.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

log = structlog.get_logger(__name__)

T = TypeVar("T")
M = TypeVar("M")  # a master message (master.messages)
E = TypeVar("E", bound=Message)  # its wire form

# How far a peer may fall behind in reading its messages before the master drops it.
OUTBOX_CAPACITY = 10_000

# A peer that asked for batches (Register.batches, Subscribe.batches) gets whatever is
# waiting in its outbox in one message (`in_batches`: at most 1 MiB, never its first
# message), up to this many: one write never holds a whole backlog. Each message costs
# the event loop about as much as its handling, so the busier the master, the more each
# write carries.
BATCH_EVENTS = 1_000

# Why a stream is refused (INVALID_ARGUMENT) when its peer sends bytes that are not a
# message: grpc decodes each message as the handler reads it, raising DecodeError.
_UNDECODABLE = "a message could not be decoded"


async def _first(
    requests: AsyncIterator[T], context: grpc.aio.ServicerContext[Any, Any]
) -> T | None:
    """The stream's first message; None if the peer sent none."""
    try:
        return await anext(requests)
    except StopAsyncIteration:
        return None
    except DecodeError as e:
        log.warning("undecodable first message; stream refused", reason=str(e))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{_UNDECODABLE}: {e}")
        return None


@contextlib.asynccontextmanager
async def _admitted(
    authn: Authenticator,
    limits: GrpcStreamLimits,
    requests: AsyncIterator[T],
    context: grpc.aio.ServicerContext[Any, Any],
    outbox: StreamWriter[Any],
) -> AsyncIterator[tuple[str | None, T | None]]:
    """A new stream, authenticated and within its client's limits: its principal and
    first message (None if it ended before sending one). If the stream's credential
    (a bearer token) is revoked while it is open, its `outbox` is closed: it ends."""
    principal = await authn.grpc_caller(context)
    client = _client_of(principal, context)
    first = await _open_stream(limits, client, requests, context)
    unwatch = authn.watch(context, outbox.close)
    try:
        yield principal, first
    finally:
        unwatch()
        limits.close(client)


def _client_of(principal: str | None, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """Who a stream counts against: its host, and its principal if it has one (agents
    may share a principal; one client is one principal on one host)."""
    host = peer_host(context.peer()) or context.peer()
    return f"{principal}@{host}" if principal else host


async def _open_stream(
    limits: GrpcStreamLimits,
    client: str,
    requests: AsyncIterator[T],
    context: grpc.aio.ServicerContext[Any, Any],
) -> T | None:
    """Admit a stream of `client` and read its first message, within the limits.

    Aborts the call when the client holds too many streams or the first message
    does not come in time. Once this returns, the caller owns one open stream of
    `client` and must `limits.close(client)` when it ends.
    """
    if refusal := limits.open(client):
        log.warning("stream refused", client=clip(client), reason=refusal)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
    try:
        async with asyncio.timeout(limits.config.first_message_timeout):
            return await _first(requests, context)
    except TimeoutError:
        limits.close(client)
        timeout = limits.config.first_message_timeout
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED, f"no first message within {timeout:g} s"
        )
        raise  # not reached: abort raises
    except BaseException:
        limits.close(client)
        raise
    finally:
        limits.first_message_done(client)


# Error texts quote what the client sent; they go back to it (and to the log) clipped.
_ERROR_TEXT_LIMIT = 1000

_STATUS_OF = {
    Refusal.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Refusal.PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
}


async def _refuse(
    context: grpc.aio.ServicerContext[object, object], e: RegistrationRefused
) -> None:
    await context.abort(_STATUS_OF[e.refusal], clip(str(e), _ERROR_TEXT_LIMIT))


def _read_into(
    requests: AsyncIterator[T], handle: Callable[[T], None], outbox: StreamWriter[Any]
) -> asyncio.Task[None]:
    """Feed every incoming message to `handle`; close the outbox when the peer stops."""

    async def read() -> None:
        try:
            async for request in requests:
                handle(request)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except DecodeError as e:  # bad input, not a bug: the stream is refused
            log.warning("undecodable message; closing the stream", reason=str(e))
            outbox.close(f"{_UNDECODABLE}: {e}")
        except Exception:
            # A bug, not bad input (that is rejected with an ERROR): end the
            # stream, loudly, rather than leave the peer talking to nobody.
            log.exception("handling a message failed; closing the stream")
        finally:
            outbox.close("the peer closed its stream")

    return asyncio.create_task(read())


async def _send_out(
    outbox: StreamWriter[M],
    master: Master,
    to_wire: Callable[[M], E],
    wrap: Callable[[list[E]], E],
    alone: Callable[[E], bool],
    batches: bool,
    leading: Callable[[], bool],
) -> AsyncIterator[E]:
    """What the master sends on one stream, converted by `to_wire`, in batches made by
    `wrap` if the peer asked for them (`alone`: never batched). What the messages
    acknowledge is stored (`durable()`) before they go out, and only while this master
    leads: a deposed one ends the stream instead (its peer reconnects, to the leader)."""
    async for messages in outbox.drain_batches(BATCH_EVENTS):
        try:
            await master.registry.durable()
        except RegistryFenced as e:
            outbox.close(f"this master no longer leads: {e}")
            return
        if not leading():
            outbox.close("this master no longer leads")
            return
        events = map(to_wire, messages)
        for event in in_batches(events, wrap, alone) if batches else events:
            yield event


# Frameworks ------------------------------------------------------------------


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        master: Master,
        authn: Authenticator | None = None,
        limits: GrpcStreamLimits | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._master = master
        self._authn = authn or Authenticator(enabled=False)
        self._limits = limits or GrpcStreamLimits()
        self._leadership = leadership or SoleLeadership()

    async def Connect(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.Call],
        context: grpc.aio.ServicerContext[scheduler_pb2.Call, scheduler_pb2.Event],
    ) -> AsyncIterator[scheduler_pb2.Event]:
        outbox: StreamWriter[msg.FrameworkMessage] = StreamWriter(OUTBOX_CAPACITY)
        async with _admitted(self._authn, self._limits, request_iterator, context, outbox) as (
            principal,
            first,
        ):
            if first is None:
                return
            if (kind := first.WhichOneof("call")) != "subscribe":
                self._master.metrics.call_rejected(kind)
                log.warning("stream refused: the first call is not SUBSCRIBE", call=kind)
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "the first call must be SUBSCRIBE"
                )
            try:
                info = convert.framework_info_from_proto(first.subscribe.framework_info)
                framework_id = self._master.subscribe(info, outbox, principal=principal)
            except RegistrationRefused as e:
                self._master.metrics.call_rejected("subscribe")
                log.warning(
                    "subscription refused",
                    reason=clip(str(e), _ERROR_TEXT_LIMIT),
                    refusal=e.refusal.value,
                    framework_id=clip(info.framework_id) or None,
                    principal=principal,
                )
                await _refuse(context, e)
                return

            def handle(call: scheduler_pb2.Call) -> None:
                if outbox.closed:
                    return  # replaced by a newer subscription; ignore stale calls
                if call.WhichOneof("call") != "batch":
                    self._dispatch(framework_id, call, outbox)
                elif problem := validation.batch_problem(len(call.batch.calls)):
                    self._reject(framework_id, call, "batch", problem, outbox)
                else:
                    for inner in call.batch.calls:
                        if outbox.closed:
                            return
                        self._dispatch(framework_id, inner, outbox)

            reader = _read_into(request_iterator, handle, outbox)
            batches = first.subscribe.batches
            try:
                async for event in _send_out(
                    outbox,
                    self._master,
                    _framework_event,
                    _framework_batch,
                    _subscribed,
                    batches,
                    self._leadership.is_leading,
                ):
                    yield event
            finally:
                reader.cancel()
                self._master.disconnect_framework(framework_id, outbox)
            if outbox.close_reason.startswith(_UNDECODABLE):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, outbox.close_reason)

    def _dispatch(
        self,
        framework_id: str,
        call: scheduler_pb2.Call,
        outbox: StreamWriter[msg.FrameworkMessage],
    ) -> None:
        master = self._master
        kind = call.WhichOneof("call")
        try:
            if kind == "accept":
                a = call.accept
                tasks = [convert.task_from_proto(t) for t in a.tasks]
                refuse = _refuse_seconds(a.filters if a.HasField("filters") else None)
                master.accept(framework_id, list(a.offer_ids), tasks, refuse)
            elif kind == "decline":
                d = call.decline
                refuse = _refuse_seconds(d.filters if d.HasField("filters") else None)
                master.decline(framework_id, list(d.offer_ids), refuse)
            elif kind == "kill":
                master.kill(framework_id, call.kill.task_id)
            elif kind == "acknowledge":
                ack = call.acknowledge
                master.acknowledge(framework_id, ack.agent_id, ack.task_id, ack.update_id)
            elif kind == "reconcile":
                master.reconcile(framework_id, list(call.reconcile.task_ids), call.call_id)
            elif kind == "revive":
                master.revive(framework_id)
            elif kind == "suppress":
                master.suppress(framework_id)
            elif kind == "teardown":
                master.teardown(framework_id)
            elif kind == "demand":
                master.declare_demand(
                    framework_id,
                    [
                        (convert.resources_from_proto(d.resources), d.count)
                        for d in call.demand.shapes
                    ],
                )
            elif kind == "subscribe":
                raise CallRejected("already subscribed on this stream")
            elif kind == "batch":
                raise CallRejected("a batch may not hold a batch")
            else:
                raise CallRejected("empty call")
        except (CallRejected, InvalidResources, ValueError) as e:
            self._reject(framework_id, call, kind, str(e), outbox)

    def _reject(
        self,
        framework_id: str,
        call: scheduler_pb2.Call,
        kind: str | None,
        why: str,
        outbox: StreamWriter[msg.FrameworkMessage],
    ) -> None:
        self._master.metrics.call_rejected(kind)
        reason = clip(why, _ERROR_TEXT_LIMIT)
        log.warning(
            "call rejected",
            framework_id=framework_id,
            call=kind,
            call_id=clip(call.call_id),
            reason=reason,
        )
        outbox.send(msg.Error(f"{kind}: {reason}", call.call_id))


def _refuse_seconds(filters: scheduler_pb2.Filters | None) -> float | None:
    if filters is None or not filters.HasField("refuse_seconds"):
        return None
    return filters.refuse_seconds


def _framework_event(message: msg.FrameworkMessage) -> scheduler_pb2.Event:
    E = scheduler_pb2.Event
    match message:
        case msg.Subscribed(framework_id, interval):
            return E(
                subscribed=E.Subscribed(
                    framework_id=framework_id, heartbeat_interval_seconds=interval, batches=True
                )
            )
        case msg.Offers(offers):
            return E(offers=E.Offers(offers=[convert.offer_to_proto(o) for o in offers]))
        case msg.Rescind(offer_id):
            return E(rescind=E.Rescind(offer_id=offer_id))
        case msg.Update(status):
            return E(update=E.Update(status=convert.status_to_proto(status)))
        case msg.AgentFailure(agent_id):
            return E(failure=E.Failure(agent_id=agent_id))
        case msg.Error(message_text, call_id):
            return E(error=E.Error(message=message_text, call_id=call_id))
        case msg.Heartbeat():
            return E(heartbeat=E.Heartbeat())
        case msg.Reconciled(call_id, tasks):
            return E(reconciled=E.Reconciled(call_id=call_id, tasks=tasks))
        case msg.Preemption(task_id, agent_id, grace, for_role):
            return E(
                preemption=E.Preemption(
                    task_id=task_id, agent_id=agent_id, grace_seconds=grace, for_role=for_role
                )
            )
    raise TypeError(f"not a framework message: {message!r}")


def _framework_batch(events: list[scheduler_pb2.Event]) -> scheduler_pb2.Event:
    return scheduler_pb2.Event(batch=scheduler_pb2.Event.Batch(events=events))


def _subscribed(event: scheduler_pb2.Event) -> bool:
    return event.WhichOneof("event") == "subscribed"


# Agents ----------------------------------------------------------------------


def peer_host(peer: str) -> str:
    """The IP address of a gRPC peer ("ipv4:10.0.0.5:41234", "ipv6:[::1]:41234", the
    brackets maybe %-encoded); "" for anything else (a Unix socket, say)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    try:
        ip = ipaddress.ip_address(rest.rpartition(":")[0].strip("[]"))
    except ValueError:
        return ""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class AgentGatewayService(agent_pb2_grpc.AgentGatewayServicer):
    def __init__(
        self,
        master: Master,
        authn: Authenticator | None = None,
        limits: GrpcStreamLimits | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self._master = master
        self._authn = authn or Authenticator(enabled=False)
        self._limits = limits or GrpcStreamLimits()
        self._leadership = leadership or SoleLeadership()

    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentCall],
        context: grpc.aio.ServicerContext[agent_pb2.AgentCall, agent_pb2.AgentEvent],
    ) -> AsyncIterator[agent_pb2.AgentEvent]:
        outbox: StreamWriter[msg.AgentMessage] = StreamWriter(OUTBOX_CAPACITY)
        async with _admitted(self._authn, self._limits, request_iterator, context, outbox) as (
            principal,
            first,
        ):
            if first is None:
                return
            if first.WhichOneof("call") != "register":
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "the first call must be REGISTER"
                )
            reg = first.register
            try:
                total = convert.resources_from_proto(reg.total)
                running = [convert.running_task_from_proto(t) for t in reg.tasks]
            except (InvalidResources, ValueError) as e:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"invalid registration: {clip(str(e), _ERROR_TEXT_LIMIT)}",
                )
                return
            try:
                agent_id = self._master.register_agent(
                    reg.agent_id,
                    reg.hostname,
                    reg.address,
                    total,
                    dict(reg.attributes),
                    running,
                    outbox,
                    principal=principal,
                    peer_host=peer_host(context.peer()),
                    isolation=reg.isolation,
                    task_user=reg.task_user,
                )
            except RegistrationRefused as e:
                log.warning(
                    "agent registration refused",
                    agent_id=clip(reg.agent_id),
                    reason=clip(str(e), _ERROR_TEXT_LIMIT),
                )
                await _refuse(context, e)
                return

            def handle(call: agent_pb2.AgentCall, nested: bool = False) -> None:
                if outbox.closed:
                    return
                kind = call.WhichOneof("call")
                if kind == "batch" and not nested:
                    calls = call.batch.calls
                    if problem := validation.batch_problem(len(calls)):
                        log.warning("batch refused", agent_id=agent_id, reason=problem)
                        return
                    for inner in calls:
                        handle(inner, nested=True)
                elif kind == "heartbeat":
                    try:
                        usage = [convert.usage_from_proto(u) for u in call.heartbeat.usage]
                    except ValueError as e:
                        log.warning("bad task usage", agent_id=agent_id, reason=clip(str(e)))
                        usage = []
                    self._master.agent_heartbeat(agent_id, usage)
                elif kind == "status_update":
                    update = call.status_update
                    try:
                        status = convert.status_from_proto(update.status)
                        latest = (
                            convert.task_state_from_proto(update.latest_state)
                            if update.latest_state
                            else None
                        )
                    except ValueError as e:
                        log.warning("bad status update", agent_id=agent_id, reason=clip(str(e)))
                        return
                    self._master.status_update(agent_id, status, latest)
                else:
                    log.warning("unexpected agent call", agent_id=agent_id, call=kind)

            reader = _read_into(request_iterator, handle, outbox)
            batches = reg.batches
            try:
                async for event in _send_out(
                    outbox,
                    self._master,
                    _agent_event,
                    _agent_batch,
                    _registered,
                    batches,
                    self._leadership.is_leading,
                ):
                    yield event
            finally:
                reader.cancel()
                self._master.disconnect_agent(agent_id, outbox)
            if outbox.close_reason.startswith(_UNDECODABLE):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, outbox.close_reason)
            if agent_id in self._master.removed_agents and await self._removal_stands():
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"agent {agent_id} was removed: {outbox.close_reason}",
                )

    async def _removal_stands(self) -> bool:
        """Whether an agent may be told it was removed (it then kills its tasks): only
        once the removal is stored, and only by a master that leads."""
        try:
            await self._master.registry.durable()
        except RegistryFenced:
            return False
        return self._leadership.is_leading()


def _agent_event(message: msg.AgentMessage) -> agent_pb2.AgentEvent:
    E = agent_pb2.AgentEvent
    match message:
        case msg.AgentRegistered(agent_id, interval):
            return E(
                registered=E.Registered(
                    agent_id=agent_id, heartbeat_interval_seconds=interval, batches=True
                )
            )
        case msg.LaunchTask(framework_id, task, user):
            return E(
                launch_task=E.LaunchTask(
                    framework_id=framework_id, task=convert.task_to_proto(task), user=user
                )
            )
        case msg.KillTask(framework_id, task_id):
            return E(kill_task=E.KillTask(framework_id=framework_id, task_id=task_id))
        case msg.AcknowledgeUpdate(framework_id, task_id, update_id):
            return E(
                acknowledge=E.Acknowledge(
                    framework_id=framework_id, task_id=task_id, update_id=update_id
                )
            )
    raise TypeError(f"not an agent message: {message!r}")


def _agent_batch(events: list[agent_pb2.AgentEvent]) -> agent_pb2.AgentEvent:
    return agent_pb2.AgentEvent(batch=agent_pb2.AgentEvent.Batch(events=events))


def _registered(event: agent_pb2.AgentEvent) -> bool:
    return event.WhichOneof("event") == "registered"
