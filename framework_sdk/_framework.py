"""`Framework`: subscribe to a master, turn its events into callbacks, send calls.

A framework subclasses `Framework`, overrides the callbacks it cares about and awaits
`run(master)`. The SDK keeps the subscription alive: when the stream breaks it reconnects
with jittered backoff, re-subscribes with the framework id (the master keeps the tasks
for the failover timeout) and asks the master to reconcile every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import types
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import structlog

from mesolite import convert
from mesolite.files import write_atomically
from mesolite.framework_sdk._config import ConnectionConfig
from mesolite.framework_sdk._errors import (
    FrameworkRejected,
    InvalidCall,
    MesoliteError,
    NotConnected,
    RpcError,
)
from mesolite.framework_sdk._ids import RecentIds
from mesolite.framework_sdk._stream import Stream, StreamLost
from mesolite.grpc_utils import create_channel
from mesolite.model import DEFAULT_ROLE, FrameworkInfo, Offer, TaskSpec, TaskStatus
from mesolite.resources import Resources
from mesolite.tls import TlsConfig
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc

_log = structlog.get_logger(__name__)

# The master refused this framework: retrying the same subscription cannot succeed.
_REJECTED = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
# The master or the network is away for now. A master that shuts down cancels its
# streams, so CANCELLED seen from this side (never our own cancel) counts as transient.
# The master never ends a stream with INTERNAL or UNKNOWN on purpose, but gRPC reports a
# broken connection so: a call being written as the master dies fails inside gRPC core,
# which sets the stream's status to INTERNAL ("Internal error from Core") in place of
# UNAVAILABLE; some versions say UNKNOWN ("Stream removed", grpc/grpc#34076). Taken as
# fatal, one master crash ended a framework for good (fault injection, seed 178). Were
# the master ever to mean a rejection by them, the next subscription hears it again.
_TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
# Missing this many heartbeats in a row means the master is gone, even if TCP says not.
_MISSED_HEARTBEATS = 3

Call = scheduler_pb2.Call
_DEFAULT_CONNECTION = ConnectionConfig()


class Framework:
    """Subclass, override the `on_*` callbacks, then `await framework.run("host:port")`.

    Callbacks run one at a time, in the order the master sent the events, on the task that
    runs `run()`; they may call any of the call methods (`launch`, `decline`, ...) and
    `stop()`. An exception escaping a callback ends `run()` with that exception. Each call
    method returns the call id it sent, which an ERROR event (`on_error`) echoes.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # These were class attributes once; set on a subclass they would now do nothing.
        moved = sorted(set(vars(cls)) & {f.name for f in dataclasses.fields(ConnectionConfig)})
        if moved:
            raise TypeError(
                f"{cls.__name__} sets {', '.join(moved)}: pass "
                "connection=ConnectionConfig(...) to Framework.__init__ instead"
            )

    def __init__(
        self,
        name: str,
        role: str = DEFAULT_ROLE,
        failover_timeout: float = 0.0,
        framework_id: str | None = None,
        id_file: str | os.PathLike[str] | None = None,
        *,
        connection: ConnectionConfig = _DEFAULT_CONNECTION,
        tls: TlsConfig | None = None,
        token: str | None = None,
        user: str | None = None,
    ) -> None:
        """`id_file`, when given, keeps the framework id across restarts of this
        process: read at start (unless `framework_id` is given), written when the
        master assigns an id, removed on `teardown()`. A restarted process then
        fails over to its old self, tasks included, within `failover_timeout`.
        Beside it, `<id_file>.shown` lists the update ids already shown to
        `on_update`, so a restarted process does not see them again.

        `connection` says how to keep the subscription alive: reconnection delays,
        timeouts (`ConnectionConfig`; the defaults suit a real cluster).

        `tls` connects over TLS: the master is verified against `tls.ca`, and the
        framework's principal is the CN of `tls.cert` (`TlsConfig.from_dir("certs/framework")`
        reads a bundle `mesolite certs init` made). Without a certificate, `token` is sent
        as a bearer token instead (to the master's token port); never without TLS.

        `user` is the Unix user the framework's tasks run as on agents that switch users
        (run as root; Mesos' `FrameworkInfo.user`): it must exist on those agents (else
        its tasks fail) and the master's ACLs must let this framework's principal use it
        (`run_tasks`; root only where an entry names it). None: each agent's
        `--task-user`. It cannot change while the framework lives."""
        if token is not None and tls is None:
            raise InvalidCall("a bearer token is sent only over TLS: give tls=TlsConfig(ca=...)")
        self._tls = tls
        self._token = token
        self.name = name
        self.role = role
        self.failover_timeout = failover_timeout
        self.user = user
        self.connection = connection
        self._id_file = Path(id_file) if id_file is not None else None
        if framework_id is None and self._id_file is not None and self._id_file.exists():
            framework_id = self._id_file.read_text().strip() or None
        # Set by SUBSCRIBED. A new process passing the same id fails the framework over.
        self.framework_id = framework_id
        self._stream: Stream | None = None  # set only while subscribed
        self._offers: dict[str, Offer] = {}
        self._acknowledged = RecentIds()
        self._shown_file = _sibling(self._id_file, ".shown") if self._id_file else None
        if self._shown_file is not None and self._shown_file.exists():
            for line in self._shown_file.read_text().splitlines()[-self._acknowledged.capacity :]:
                self._acknowledged.add(line.strip())
        self._heartbeat_interval = 0.0
        self._stop = asyncio.Event()
        self._run_task: asyncio.Task[Any] | None = None
        self._log = _log.bind(framework=name)

    # -- state ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while subscribed: calls can be sent."""
        return self._stream is not None

    @property
    def outstanding_offers(self) -> Mapping[str, Offer]:
        """Offers received and not yet launched on, declined, rescinded or lost with the
        connection, by offer id."""
        return types.MappingProxyType(self._offers)

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, master: str) -> None:
        """Subscribe to `master` ("host:port") and dispatch its events until `stop()` or
        `teardown()`. Reconnects whenever the stream fails for a transient reason.

        Raises `FrameworkRejected` when the master refuses the subscription and `RpcError`
        for any other non-transient gRPC status (one that no broken connection or master
        crash produces, such as UNIMPLEMENTED from something that is not a master).
        """
        if self._run_task is not None:
            raise MesoliteError("run() is already running")
        self._run_task = asyncio.current_task()
        backoff = self.connection.reconnect_backoff
        failures = 0  # since the last subscription
        try:
            while not self._stop.is_set():
                # A new channel for every attempt, so that our backoff alone decides when
                # to try again: a channel that failed to connect waits out gRPC's own
                # reconnect backoff (up to two minutes) and fails calls meanwhile. (It is
                # only fresh if channels do not share gRPC's global subchannel pool.)
                async with create_channel(master, self._tls, self._token) as channel:
                    was_subscribed = await self._connect_once(_stub(channel))
                if self._stop.is_set():
                    break
                if was_subscribed:
                    failures = 0
                    await self.on_disconnected()
                delay = backoff.delay(failures)
                failures += 1
                self._log.info("reconnecting", master=master, delay=round(delay, 3))
                with contextlib.suppress(TimeoutError):
                    # Not wait_for: on Python 3.11 it can swallow a cancellation.
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
        finally:
            self._run_task = None
            # Cleared here, not on entry, so that a stop() racing a starting run() wins.
            self._stop.clear()

    async def stop(self) -> None:
        """Close the stream and make `run()` return. The master keeps the framework and
        its tasks for `failover_timeout` seconds, for a new `run()` to resume.

        From a callback this returns at once and `run()` ends after the callback;
        from anywhere else it returns once `run()` has ended. Called before `run()`
        starts, it makes `run()` return at once.
        """
        self._stop.set()
        running = self._run_task
        if running is not None and running is not asyncio.current_task():
            await asyncio.wait({running})

    # -- calls ---------------------------------------------------------------------------

    async def launch(
        self,
        offers: Offer | Sequence[Offer],
        tasks: Sequence[TaskSpec],
        refuse_seconds: float | None = None,
    ) -> str:
        """Accept `offers` (all from one agent) and run `tasks` on them. What the tasks
        leave unused is refused for `refuse_seconds` (None: the master's default, 5 s);
        0 lets the master offer the remainder again straight away."""
        offers = _as_list(offers)
        agent_id = _single_agent(offers)
        placed = [t if t.agent_id else dataclasses.replace(t, agent_id=agent_id) for t in tasks]
        for task in placed:
            if task.agent_id != agent_id:
                raise InvalidCall(
                    f"task {task.task_id} names agent {task.agent_id}, not {agent_id}"
                )
        offered = sum((o.resources for o in offers), Resources())
        wanted = sum((t.resources for t in placed), Resources())
        if not offered.contains(wanted):
            raise InvalidCall(f"tasks need {wanted}, the offers hold {offered}")
        call_id = await self._send(
            Call(
                accept=Call.Accept(
                    offer_ids=[o.offer_id for o in offers],
                    tasks=[convert.task_to_proto(t) for t in placed],
                    filters=_filters(refuse_seconds),
                )
            )
        )
        self._forget(offers)
        self._log.info(
            "launching",
            call_id=call_id,
            agent_id=agent_id,
            offer_ids=[o.offer_id for o in offers],
            task_ids=[t.task_id for t in placed],
        )
        return call_id

    async def decline(
        self, offers: Offer | Sequence[Offer], refuse_seconds: float | None = None
    ) -> str:
        """Give offers back, refused to this framework for `refuse_seconds` (None: the
        master's default, 5 s)."""
        offers = _as_list(offers)
        call_id = await self._send(
            Call(
                decline=Call.Decline(
                    offer_ids=[o.offer_id for o in offers], filters=_filters(refuse_seconds)
                )
            )
        )
        self._forget(offers)
        return call_id

    async def kill(self, task_id: str) -> str:
        return await self._send(Call(kill=Call.Kill(task_id=task_id)))

    async def reconcile(self, task_ids: Sequence[str] = ()) -> str:
        """Ask for the latest state of `task_ids` (all tasks when empty); the answers
        arrive through `on_update`."""
        return await self._send(Call(reconcile=Call.Reconcile(task_ids=list(task_ids))))

    async def revive(self) -> str:
        """Receive offers again after `suppress()`, and clear refuse filters."""
        return await self._send(Call(revive=Call.Revive()))

    async def suppress(self) -> str:
        """Stop receiving offers until `revive()`."""
        return await self._send(Call(suppress=Call.Suppress()))

    async def teardown(self) -> str:
        """End the framework for good: the master kills its tasks and forgets it, and
        `run()` returns."""
        call_id = await self._send(Call(teardown=Call.Teardown()))
        self._log.info("tearing down", call_id=call_id)
        if self._id_file is not None:
            self._id_file.unlink(missing_ok=True)
        if self._shown_file is not None:
            self._shown_file.unlink(missing_ok=True)
        await self.stop()
        return call_id

    # -- callbacks: override these -------------------------------------------------------

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        """Subscribed; `resubscribed` when this continues an earlier subscription (after a
        reconnection or a failover). The SDK has already asked to reconcile all tasks."""

    async def on_offers(self, offers: list[Offer]) -> None:
        """New offers. The default declines them, so a framework that never launches
        anything does not sit on resources others could use."""
        await self.decline(offers)

    async def on_rescind(self, offer_id: str) -> None:
        """The offer is no longer valid; it was dropped from `outstanding_offers`."""

    async def on_update(self, status: TaskStatus) -> None:
        """A task changed state, or a reconciliation answer. Each agent update (one with
        an update_id) is shown once and acknowledged when this returns."""

    async def on_agent_lost(self, agent_id: str) -> None:
        """An agent was removed; its tasks are reported separately through `on_update`."""

    async def on_error(self, message: str, call_id: str) -> None:
        """The master rejected the call `call_id`; nothing it asked for was done."""

    async def on_disconnected(self) -> None:
        """The subscription was lost; the SDK is about to reconnect."""

    # -- internals -----------------------------------------------------------------------

    async def _send(self, call: scheduler_pb2.Call) -> str:
        stream = self._stream
        if stream is None:
            raise NotConnected("not subscribed to a master")
        call.call_id = uuid.uuid4().hex
        await stream.send(call)
        return call.call_id

    def _forget(self, offers: Sequence[Offer]) -> None:
        for offer in offers:
            self._offers.pop(offer.offer_id, None)

    def _subscribe_call(self) -> scheduler_pb2.Call:
        info = FrameworkInfo(
            name=self.name,
            role=self.role,
            failover_timeout=self.failover_timeout,
            framework_id=self.framework_id or "",
            user=self.user or "",
        )
        return Call(
            call_id=uuid.uuid4().hex,
            subscribe=Call.Subscribe(framework_info=convert.framework_info_to_proto(info)),
        )

    async def _connect_once(self, stub: scheduler_pb2_grpc.SchedulerAsyncStub) -> bool:
        """One stream, from subscribing until it ends. Returns whether it got subscribed;
        raises only for errors that reconnecting cannot fix (and callback exceptions)."""
        stream = Stream(stub)
        subscribed = False
        try:
            await stream.send(self._subscribe_call())
            while True:
                silence = self._max_silence() if subscribed else self.connection.subscribe_timeout
                event = await stream.next_event(silence, self._stop)
                if event is None:
                    break
                if event.WhichOneof("event") == "subscribed":
                    subscribed = True
                    await self._handle_subscribed(event.subscribed, stream)
                elif subscribed:
                    await self._dispatch(event)
                else:
                    self._log.warning("event before SUBSCRIBED", kind=event.WhichOneof("event"))
                if self._stop.is_set():
                    break
        except StreamLost as e:
            self._log.warning("connection to the master lost", reason=str(e))
        except grpc.aio.AioRpcError as e:
            code, details = e.code(), e.details() or ""
            if code in _REJECTED:
                raise FrameworkRejected(code.name, details) from None
            if code not in _TRANSIENT:
                raise RpcError(code.name, details) from None
            self._log.warning("connection to the master failed", code=code.name, details=details)
        finally:
            self._stream = None
            # Offers do not survive the connection: the master rescinds them.
            self._offers.clear()
            await stream.close(grace=self.connection.stop_grace if self._stop.is_set() else 0.0)
        return subscribed

    def _max_silence(self) -> float | None:
        if self._heartbeat_interval <= 0:
            return None  # the master sends no heartbeats; gRPC keepalive still watches
        return _MISSED_HEARTBEATS * self._heartbeat_interval

    async def _handle_subscribed(self, msg: scheduler_pb2.Event.Subscribed, stream: Stream) -> None:
        resubscribed = bool(self.framework_id)
        if resubscribed and msg.framework_id != self.framework_id:
            self._log.warning(
                "the master assigned a new framework id",
                old_framework_id=self.framework_id,
                framework_id=msg.framework_id,
            )
        self.framework_id = msg.framework_id
        if self._id_file is not None:
            write_atomically(self._id_file, msg.framework_id.encode())
        self._heartbeat_interval = msg.heartbeat_interval_seconds
        self._stream = stream
        self._log = _log.bind(framework=self.name, framework_id=msg.framework_id)
        self._log.info("subscribed", resubscribed=resubscribed)
        if resubscribed:
            # Tasks may have finished, or been lost, while no one was listening.
            await self.reconcile()
        await self.on_subscribed(msg.framework_id, resubscribed)

    async def _dispatch(self, event: scheduler_pb2.Event) -> None:
        kind = event.WhichOneof("event")
        if kind == "offers":
            try:
                offers = [convert.offer_from_proto(o) for o in event.offers.offers]
            except ValueError as e:
                self._log.error("malformed offers from the master", error=str(e))
                return
            self._offers.update((o.offer_id, o) for o in offers)
            await self.on_offers(offers)
        elif kind == "rescind":
            offer_id = event.rescind.offer_id
            self._offers.pop(offer_id, None)
            self._log.debug("offer rescinded", offer_id=offer_id)
            await self.on_rescind(offer_id)
        elif kind == "update":
            try:
                status = convert.status_from_proto(event.update.status)
            except ValueError as e:
                self._log.error("malformed status update from the master", error=str(e))
                return
            await self._handle_update(status)
        elif kind == "failure":
            self._log.warning("agent lost", agent_id=event.failure.agent_id)
            await self.on_agent_lost(event.failure.agent_id)
        elif kind == "error":
            self._log.warning(
                "call rejected", call_id=event.error.call_id, error=event.error.message
            )
            await self.on_error(event.error.message, event.error.call_id)
        elif kind != "heartbeat":
            self._log.warning("unknown event", kind=kind)

    async def _handle_update(self, status: TaskStatus) -> None:
        update_id = status.update_id
        if update_id and update_id in self._acknowledged:
            # Our acknowledgement was lost and the master sent the update again.
            self._log.debug("duplicate update", task_id=status.task_id, update_id=update_id)
        else:
            await self.on_update(status)
        if update_id:
            if update_id not in self._acknowledged:
                self._acknowledged.add(update_id)
                self._remember_shown(update_id)
            await self._send(
                Call(
                    acknowledge=Call.Acknowledge(
                        agent_id=status.agent_id, task_id=status.task_id, update_id=update_id
                    )
                )
            )

    def _remember_shown(self, update_id: str) -> None:
        # Written before the acknowledgement leaves: if this process dies in
        # between, the next one knows the update was shown.
        if self._shown_file is not None:
            with self._shown_file.open("a") as f:
                f.write(update_id + "\n")


def _stub(channel: grpc.aio.Channel) -> scheduler_pb2_grpc.SchedulerAsyncStub:
    # grpc ships no type hints, so mypy cannot pick the stub's aio overload by itself.
    return cast("scheduler_pb2_grpc.SchedulerAsyncStub", scheduler_pb2_grpc.SchedulerStub(channel))


def _as_list(offers: Offer | Sequence[Offer]) -> list[Offer]:
    return [offers] if isinstance(offers, Offer) else list(offers)


def _single_agent(offers: Sequence[Offer]) -> str:
    agents = {o.agent_id for o in offers}
    if len(agents) != 1:
        raise InvalidCall(f"offers to launch on must come from one agent, got {sorted(agents)}")
    return agents.pop()


def _filters(refuse_seconds: float | None) -> scheduler_pb2.Filters:
    if refuse_seconds is None:
        return scheduler_pb2.Filters()
    return scheduler_pb2.Filters(refuse_seconds=refuse_seconds)


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
