"""`Framework`: subscribe to a master, turn its events into callbacks, send calls.

A framework subclasses `Framework`, overrides the callbacks it cares about and awaits
`run(master)`. The SDK keeps the subscription alive: when the stream breaks it reconnects
with jittered backoff, re-subscribes with the framework id (the master keeps the tasks
for the failover timeout), asks the master to reconcile every task and holds offers
until it has (`_reconciliation.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
import types
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import structlog

from mesolite import convert
from mesolite.framework_sdk._config import DEFAULT_FAILOVER_TIMEOUT, ConnectionConfig
from mesolite.framework_sdk._errors import (
    FrameworkGone,
    FrameworkRejected,
    InvalidCall,
    MesoliteError,
    NotConnected,
    RpcError,
)
from mesolite.framework_sdk._id_file import IdFile
from mesolite.framework_sdk._ids import RecentIds
from mesolite.framework_sdk._reconciliation import OfferGate
from mesolite.framework_sdk._stream import Stream, StreamLost
from mesolite.grpc_utils import create_channel
from mesolite.masters import QUICK_RETRY, MasterList, leader_hint, parse_masters
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


class Framework:
    """A framework's scheduler: subclass it, override the `on_*` callbacks you need, and
    `await framework.run("host:port")`.

    Callbacks run one at a time, in the order the master sent the events, on the task
    that runs `run()`; while one runs, no other does. They may call any of the call
    methods (`launch`, `decline`, `kill`, ...) and `stop()`. An exception escaping a
    callback ends `run()` with that exception. Each call method returns the id of the
    call it sent, which an ERROR event (`on_error`) echoes.

    Callback order, on every subscription:

    1. `on_subscribed(framework_id, resubscribed)`.
    2. When `resubscribed` (the SDK subscribed with a framework id: from `framework_id`,
       the id file, or an earlier subscription of this object), the SDK has already
       asked the master to reconcile every task. `on_update` is then called once for
       each task the master knows for this framework, with its latest state (updates
       with no `update_id`), among any other updates that arrive. After a master
       restart the master answers only once the agents that run the framework's tasks
       are back (or their time to come back is over: those tasks are reported
       `TASK_LOST`).
    3. Only then `on_offers`: offers that arrived meanwhile are held by the SDK and
       handed over in one call once the master has confirmed the reconciliation; an
       offer the master took back in between is dropped without `on_rescind`. If the
       confirmation does not come within `ConnectionConfig.reconcile_timeout`, the SDK
       logs an error ("reconciliation not confirmed") and hands the offers over anyway.

    A first subscription (no framework id) has no tasks: offers are handed over as
    they come. So a framework that counts its live tasks in `on_update` and launches on
    offers until it has N never launches twice, whether this process is new (restarted
    with its id file) or reconnecting. Tasks it launched itself are not reported unless
    the master knows them: a launch sent just before a connection broke may have been
    lost, which `reconcile([task_id])` finds out (`TASK_LOST` for a task the master
    does not know).

    When the stream breaks: `on_disconnected()`, then the SDK reconnects and the order
    above starts again. Outstanding offers die with the connection.
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
        failover_timeout: float | None = None,
        framework_id: str | None = None,
        id_file: str | os.PathLike[str] | None = None,
        *,
        connection: ConnectionConfig | None = None,
        tls: TlsConfig | None = None,
        token: str | None = None,
        user: str | None = None,
    ) -> None:
        """Describe the framework; nothing is sent before `run()`.

        `name` is shown to operators; `role` is the role whose share DRF weighs (and
        whose weight, guarantee and limit apply), `"*"` by default.

        `failover_timeout`: how many seconds the master keeps this framework and its
        tasks after its connection is lost, for a new subscription with its id to take
        them over; past it, the master kills the tasks and forgets the framework. The
        default is 0 (as in Mesos: tasks are killed as soon as the framework is gone,
        though a master restart still gives every framework time to come back), or
        `DEFAULT_FAILOVER_TIMEOUT` (a week, Marathon's default) when `id_file` is given.

        `id_file`, when given, keeps the framework id across restarts of this process:
        read at start (unless `framework_id` is given), written when the master
        assigns an id, removed on `teardown()`. A restarted process then fails over to
        its old self, tasks included. `failover_timeout=0` with an `id_file` is refused
        (`InvalidCall`): the master would end the framework the moment this process
        died, so the id kept could never be used. Beside it, `<id_file>.shown` lists
        the update ids already shown to `on_update`, so a restarted process does not
        see them again. If the master no longer knows the id (`FrameworkGone`), the file
        is renamed to `<id_file>.stale`, so the next start registers afresh.

        `framework_id`: fail over to this framework (overrides `id_file`'s).

        `connection` says how to keep the subscription alive: reconnection delays,
        timeouts (`ConnectionConfig`; None: its defaults, which suit a real cluster).

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
        self._id_file = IdFile(Path(id_file)) if id_file is not None else None
        if failover_timeout is None:
            failover_timeout = DEFAULT_FAILOVER_TIMEOUT if self._id_file else 0.0
        elif failover_timeout < 0:
            raise InvalidCall(f"failover_timeout must not be negative, got {failover_timeout}")
        elif failover_timeout == 0 and self._id_file is not None:
            raise InvalidCall(
                f"id_file={str(self._id_file.path)!r} with failover_timeout=0: the master "
                "kills the tasks and forgets the framework as soon as this process goes, "
                "so the id kept would never be accepted again. Give a failover_timeout "
                f"(leave it out for the default of {DEFAULT_FAILOVER_TIMEOUT:.0f} s), "
                "or no id_file"
            )
        self._tls = tls
        self._token = token
        self.name = name
        """The framework's name, as operators see it."""
        self.role = role
        """The role whose share DRF weighs."""
        self.failover_timeout: float = failover_timeout
        """Seconds the master keeps the framework and its tasks after a disconnection."""
        self.user = user
        """The Unix user the framework's tasks run as (None: each agent's `--task-user`)."""
        self.connection = connection or ConnectionConfig()
        """How the SDK keeps the subscription alive."""
        if framework_id is None and self._id_file is not None:
            framework_id = self._id_file.read()
        self.framework_id = framework_id
        """The framework's id: None until the master assigns one (SUBSCRIBED), unless
        given or read from the id file; a process subscribing with it fails over."""
        self._stream: Stream | None = None  # set only while subscribed
        self._leader_hint: str | None = None  # the leader the last master named (a standby)
        self._offers: dict[str, Offer] = {}
        self._gate = OfferGate()  # holds offers while reconciling
        self._acknowledged = RecentIds()
        if self._id_file is not None:
            for update_id in self._id_file.shown(self._acknowledged.capacity):
                self._acknowledged.add(update_id)
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
        """Offers handed to `on_offers` and not yet launched on, declined, rescinded or
        lost with the connection, by offer id (a read-only view)."""
        return types.MappingProxyType(self._offers)

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, master: str) -> None:
        """Subscribe to `master` ("host:port", or highly available masters
        "h1:5050,h2:5050,...") and dispatch its events until `stop()` or `teardown()`.
        Reconnects whenever the stream fails for a transient reason (the master
        restarting, the network): for ever, with backoff, until it succeeds. With several
        masters it goes to the leader a standby names, else to the next in the list, and
        backs off only once every one has failed.

        Raises `FrameworkGone` when the master no longer knows the framework id (its
        failover timeout passed, or it was torn down), `FrameworkRejected` when it
        refuses the subscription for another reason, and `RpcError` for any other
        non-transient gRPC status (one that no broken connection or master crash
        produces, such as UNIMPLEMENTED from something that is not a master).
        """
        if self._run_task is not None:
            raise MesoliteError("run() is already running")
        self._run_task = asyncio.current_task()
        backoff = self.connection.reconnect_backoff
        failures = 0  # since the last subscription
        masters = MasterList(parse_masters(master))
        try:
            while not self._stop.is_set():
                # A new channel for every attempt, so that our backoff alone decides when
                # to try again: a channel that failed to connect waits out gRPC's own
                # reconnect backoff (up to two minutes) and fails calls meanwhile. (It is
                # only fresh if channels do not share gRPC's global subchannel pool.)
                self._leader_hint = None
                async with create_channel(masters.current, self._tls, self._token) as channel:
                    was_subscribed = await self._connect_once(_stub(channel))
                if self._stop.is_set():
                    break
                if was_subscribed:
                    failures = 0
                    masters.connected()
                    await self.on_disconnected()
                if masters.failed(self._leader_hint):
                    delay = backoff.delay(failures)
                    failures += 1
                else:
                    delay = QUICK_RETRY
                self._log.info("reconnecting", master=masters.current, delay=round(delay, 3))
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
        its tasks for `failover_timeout` seconds, for a new `run()` (of this object, or
        of a new process with the same id) to resume.

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
        """Accept `offers` (all from one agent) and run `tasks` on them.

        What the tasks leave unused is refused for `refuse_seconds` (None: the master's
        default, 5 s); 0 lets the master offer the remainder again straight away.
        `launch(offer, [])` accepts nothing and is a decline.

        Raises `InvalidCall`, sending nothing, when the offers come from more than one
        agent, a task names another agent, or the tasks need more than the offers
        hold; `NotConnected` when not subscribed. The master checks the rest (task ids
        already in use, unknown or expired offers, bad commands): a refused launch
        launches nothing and comes back through `on_error`. Each task launched then
        reports `TASK_STARTING`, `TASK_RUNNING` and one terminal state through
        `on_update`; one that cannot start ends `TASK_FAILED` with a message saying
        why.
        """
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
        master's default, 5 s). A refusal covers those resources, or less, on that
        agent; more (a task there ended) is offered anyway. `revive()` ends every
        refusal at once."""
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
        """Ask the master to kill a running task of this framework.

        Its agent sends the task SIGTERM (to its process group), then, after its grace
        period, SIGKILL to everything in the task's cgroup. The end arrives through
        `on_update`, normally `TASK_KILLED` (or the state it reached first, say
        `TASK_FINISHED`). A task the master does not know as running, or whose agent is
        disconnected, is refused through `on_error`; ask `reconcile([task_id])` then.
        """
        return await self._send(Call(kill=Call.Kill(task_id=task_id)))

    async def reconcile(self, task_ids: Sequence[str] = ()) -> str:
        """Ask for the latest state of tasks; the answers arrive through `on_update`, as
        statuses without an `update_id` (nothing to acknowledge).

        With `task_ids` (explicit): each of them; a task the master does not know is
        answered `TASK_LOST`, except while agents are still re-registering after a
        master restart, when it is not answered yet (ask again later). Without
        (implicit): every task the master knows for this framework. The SDK runs an
        implicit reconciliation itself after every re-subscription (see the class
        docstring); a framework rarely needs this call but for explicit questions.
        """
        return await self._send(Call(reconcile=Call.Reconcile(task_ids=list(task_ids))))

    async def revive(self) -> str:
        """Receive offers again after `suppress()`, and clear every refusal filter set by
        `decline` or `launch`, so refused resources are offered at once."""
        return await self._send(Call(revive=Call.Revive()))

    async def suppress(self) -> str:
        """Stop receiving offers until `revive()`. (A master restart or a failover
        forgets it: a new subscription receives offers; suppress again in
        `on_subscribed` if need be.)"""
        return await self._send(Call(suppress=Call.Suppress()))

    async def declare_demand(self, shapes: Sequence[tuple[Resources, int]]) -> str:
        """Tell the master what this framework waits for: `count` tasks of each shape
        (an empty list: nothing). It replaces any earlier declaration; send it again
        as the need changes. The master then offers only agents where one of the
        shapes fits (no offers to decline), and caps the role's fair share at what it
        holds plus this. Without a declaration every offer comes, as in Mesos."""
        call = Call(
            demand=Call.Demand(
                shapes=[
                    Call.Demand.Shape(resources=convert.resources_to_proto(r), count=n)
                    for r, n in shapes
                ]
            )
        )
        return await self._send(call)

    async def teardown(self) -> str:
        """End the framework for good: the master kills its tasks and forgets it, the id
        file (and `.shown`) are removed, and `run()` returns. The tasks' ends are not
        reported to this framework."""
        call_id = await self._send(Call(teardown=Call.Teardown()))
        self._log.info("tearing down", call_id=call_id)
        if self._id_file is not None:
            self._id_file.remove()
        await self.stop()
        return call_id

    # -- callbacks: override these -------------------------------------------------------

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        """Subscribed, with this id. `resubscribed` when the SDK subscribed with a
        framework id (a failover or a reconnection): it has then already asked the
        master to reconcile every task, and the answers come next, before any offer."""

    async def on_offers(self, offers: list[Offer]) -> None:
        """New offers: answer each with `launch` or `decline` (or keep it, until the
        master's offer timeout rescinds it). The default declines them, so a
        framework that never launches anything does not sit on resources others
        could use."""
        await self.decline(offers)

    async def on_rescind(self, offer_id: str) -> None:
        """The master took the offer back (its offer timeout passed, its agent was lost
        or re-registered); it was dropped from `outstanding_offers` and launching on it
        is refused."""

    async def on_update(self, status: TaskStatus) -> None:
        """A task changed state, or an answer to a reconciliation. Each agent update (one
        with an `update_id`) is shown once, even across restarts with an id file, and
        acknowledged when this returns; an exception here leaves it unacknowledged
        (the agent sends it again). Updates of one task arrive in order."""

    async def on_preemption(
        self, task_id: str, agent_id: str, grace_seconds: float, for_role: str
    ) -> None:
        """The master will kill task `task_id` after `grace_seconds`, to give its
        resources to role `for_role` (below its guarantee or its fair share). Save
        what is worth saving, or end the task sooner with `kill`; its end arrives
        through `on_update`: TASK_KILLED, reason ``REASON_CONTAINER_PREEMPTED``."""

    async def on_agent_lost(self, agent_id: str) -> None:
        """An agent was removed (silent past the master's agent timeout, or not back
        after a master restart); its tasks are reported `TASK_LOST` separately through
        `on_update`."""

    async def on_error(self, message: str, call_id: str) -> None:
        """The master refused the call `call_id` (the id the call method returned);
        nothing it asked for was done. `message` says why, starting with the call's
        kind (e.g. ``"accept: ..."``)."""

    async def on_disconnected(self) -> None:
        """The subscription was lost; the SDK is about to reconnect. Outstanding offers
        are gone; tasks keep running for `failover_timeout`."""

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
            # Batches: the master may send several events in one message (unwrapped
            # in `_connect_once`), which costs it less than one message each.
            subscribe=Call.Subscribe(
                framework_info=convert.framework_info_to_proto(info), batches=True
            ),
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
                wake = self._gate.deadline if self._gate.closed else None
                event = await stream.next_event(silence, self._stop, wake_at=wake)
                if event is None:
                    if self._stop.is_set():
                        break
                    await self._reconciliation_expired()
                    continue
                if event.WhichOneof("event") == "subscribed":
                    subscribed = True
                    await self._handle_subscribed(event.subscribed, stream)
                elif subscribed and event.WhichOneof("event") == "batch":
                    for inner in event.batch.events:
                        await self._dispatch(inner)
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
            if code is grpc.StatusCode.NOT_FOUND and self.framework_id and not subscribed:
                raise self._gone(self.framework_id, details) from None
            if code in _REJECTED:
                raise FrameworkRejected(code.name, details) from None
            if code not in _TRANSIENT:
                raise RpcError(code.name, details) from None
            self._leader_hint = leader_hint(e.trailing_metadata())
            self._log.warning("connection to the master failed", code=code.name, details=details)
        finally:
            self._stream = None
            # Offers do not survive the connection: the master rescinds them.
            self._offers.clear()
            self._gate.clear()
            await stream.close(grace=self.connection.stop_grace if self._stop.is_set() else 0.0)
        return subscribed

    def _gone(self, framework_id: str, details: str) -> FrameworkGone:
        """The master does not know our id: move the id file aside, so the next start
        registers afresh, and say what happened."""
        stale = self._id_file.retire(framework_id) if self._id_file is not None else None
        self._log.error(
            "the master no longer knows this framework; its tasks were killed",
            framework_id=framework_id,
            details=details,
            id_file=str(self._id_file.path) if self._id_file else None,
            renamed_to=str(stale) if stale else None,
        )
        # A later run() of this object registers afresh, as a new process would.
        self.framework_id = None
        self._acknowledged = RecentIds()
        return FrameworkGone(framework_id, details, self.failover_timeout, stale)

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
            self._id_file.write(msg.framework_id)
        self._heartbeat_interval = msg.heartbeat_interval_seconds
        stream.batches = msg.batches
        self._stream = stream
        self._log = _log.bind(framework=self.name, framework_id=msg.framework_id)
        self._log.info("subscribed", resubscribed=resubscribed)
        if resubscribed:
            # Tasks may have finished, or been lost, while no one was listening; and a
            # new process knows none of them. Offers wait until the master has told.
            call_id = await self.reconcile()
            timeout = self.connection.reconcile_timeout
            self._gate.start(call_id, _now(), timeout)
            self._log.info(
                "reconciling: offers are held until the master has reported every task",
                call_id=call_id,
                timeout=timeout,
            )
        await self.on_subscribed(msg.framework_id, resubscribed)

    async def _dispatch(self, event: scheduler_pb2.Event) -> None:
        kind = event.WhichOneof("event")
        if kind == "offers":
            try:
                offers = [convert.offer_from_proto(o) for o in event.offers.offers]
            except ValueError as e:
                self._log.error("malformed offers from the master", error=str(e))
                return
            if self._gate.hold(offers):
                self._log.debug("offers held until reconciled", offers=len(offers))
                return
            await self._hand_over(offers)
        elif kind == "rescind":
            offer_id = event.rescind.offer_id
            if self._gate.rescind(offer_id):
                self._log.debug("held offer rescinded", offer_id=offer_id)
                return
            self._offers.pop(offer_id, None)
            self._log.debug("offer rescinded", offer_id=offer_id)
            await self.on_rescind(offer_id)
        elif kind == "update":
            try:
                status = convert.status_from_proto(event.update.status)
            except ValueError as e:
                self._log.error("malformed status update from the master", error=str(e))
                return
            self._gate.saw_update()
            await self._handle_update(status)
        elif kind == "reconciled":
            await self._handle_reconciled(event.reconciled)
        elif kind == "preemption":
            p = event.preemption
            self._log.info(
                "task to be preempted",
                task_id=p.task_id,
                agent_id=p.agent_id,
                grace_seconds=p.grace_seconds,
                for_role=p.for_role,
            )
            await self.on_preemption(p.task_id, p.agent_id, p.grace_seconds, p.for_role)
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

    async def _hand_over(self, offers: list[Offer]) -> None:
        if offers:
            self._offers.update((o.offer_id, o) for o in offers)
            await self.on_offers(offers)

    async def _handle_reconciled(self, msg: scheduler_pb2.Event.Reconciled) -> None:
        gate = self._gate
        started, updates = gate.started, gate.updates
        held = gate.finish(msg.call_id)
        if held is None:  # one the framework asked for itself
            self._log.debug("reconciliation answered", call_id=msg.call_id, tasks=msg.tasks)
            return
        self._log.info(
            "reconciled: handing over the offers held",
            call_id=msg.call_id,
            tasks=msg.tasks,
            updates=updates,
            offers=len(held),
            seconds=round(_now() - started, 3),
        )
        await self._hand_over(held)

    async def _reconciliation_expired(self) -> None:
        gate = self._gate
        call_id, updates = gate.call_id, gate.updates
        held = gate.expire(_now())
        if held is None:
            return
        self._log.error(
            "reconciliation not confirmed by the master in time: handing over the offers "
            "held anyway; a task this framework has not heard of may be launched twice",
            call_id=call_id,
            timeout=self.connection.reconcile_timeout,
            updates=updates,
            offers=len(held),
        )
        await self._hand_over(held)

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
                if self._id_file is not None:
                    self._id_file.remember_shown(update_id)
            await self._send(
                Call(
                    acknowledge=Call.Acknowledge(
                        agent_id=status.agent_id, task_id=status.task_id, update_id=update_id
                    )
                )
            )


def _now() -> float:
    return time.monotonic()


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
