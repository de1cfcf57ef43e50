"""Mesos scheduler calls (other than SUBSCRIBE) -> the master core's methods.

The endpoint has already answered for the call's shape and its caller (`endpoint.py`:
the framework is subscribed on this stream, by this principal); here each call does
what Mesos does with it, through the same core methods as the gRPC servicer. As in
Mesos, nothing here fails the HTTP call (it is answered 202 first): a call the core
refuses (an acknowledgement of an update it did not send, a decline of an offer
already rescinded) is logged, counted and dropped, since a Mesos ERROR event would
tell the framework to abort. ACCEPT answers per task (`Master.accept_each`), KILL of
a task that is not running reconciles it (`Master.kill_or_reconcile`). MESSAGE,
SHUTDOWN and REQUEST are dropped as Mesos drops them when there is no executor to
talk to and its allocator does not use requests; calls about inverse offers and
operations find none.
"""

from __future__ import annotations

import structlog

from mesolite.logs import clip
from mesolite.master.errors import CallRejected
from mesolite.master.master import Master
from mesolite.master.mesos_api import convert
from mesolite.master.offers import InvalidTask
from mesolite.model import TaskSpec
from mesolite.resources import InvalidResources
from mesolite.v1.mesos import scheduler_pb2

log = structlog.get_logger(__name__)

Call = scheduler_pb2.Call
_LAUNCH = convert.M.Offer.Operation.LAUNCH
_LAUNCH_GROUP = convert.M.Offer.Operation.LAUNCH_GROUP


def handle(master: Master, framework_id: str, call: scheduler_pb2.Call) -> None:
    """Carry out one call of a subscribed framework (never SUBSCRIBE)."""
    kind = Call.Type.Name(call.type)
    try:
        _dispatch(master, framework_id, call)
    except (CallRejected, InvalidResources, ValueError) as e:
        master.metrics.call_rejected(kind.lower())
        log.warning(
            "mesos call dropped", framework_id=framework_id, call=kind, reason=clip(str(e), 500)
        )


def _dispatch(master: Master, framework_id: str, call: scheduler_pb2.Call) -> None:
    t = call.type
    if t == Call.TEARDOWN:
        master.teardown(framework_id)
    elif t == Call.ACCEPT:
        _accept(master, framework_id, call.accept)
    elif t == Call.DECLINE:
        refuse = convert.refuse_seconds(
            call.decline.filters if call.decline.HasField("filters") else None
        )
        # One at a time: as Mesos, an offer that is no longer valid is skipped, the
        # others declined.
        for offer_id in dict.fromkeys(o.value for o in call.decline.offer_ids):
            try:
                master.decline(framework_id, [offer_id], refuse)
            except CallRejected as e:
                log.info("decline of an offer that is not outstanding", reason=clip(str(e)))
    elif t == Call.REVIVE:
        master.revive(framework_id)
    elif t == Call.SUPPRESS:
        master.suppress(framework_id)
    elif t == Call.KILL:
        master.kill_or_reconcile(framework_id, call.kill.task_id.value)
    elif t == Call.ACKNOWLEDGE:
        ack = call.acknowledge
        update_id = convert.update_id_of(ack.uuid)
        master.acknowledge(framework_id, ack.agent_id.value, ack.task_id.value, update_id)
    elif t == Call.RECONCILE:
        master.reconcile(framework_id, [t.task_id.value for t in call.reconcile.tasks])
    else:  # MESSAGE, SHUTDOWN, REQUEST, inverse offers, operations
        log.info(
            "mesos call without effect here: no executors, inverse offers or operations",
            framework_id=framework_id,
            call=Call.Type.Name(t),
        )


def _accept(master: Master, framework_id: str, accept: scheduler_pb2.Call.Accept) -> None:
    framework = master.frameworks[framework_id]
    user = framework.info.user
    tasks: list[TaskSpec | InvalidTask] = []
    for op in accept.operations:  # bounded by the wire (wire.MAX_OPERATIONS, tasks)
        if op.type == _LAUNCH:
            tasks.extend(convert.task_from_mesos(t, user) for t in op.launch.task_infos)
        elif op.type == _LAUNCH_GROUP:
            tasks.extend(
                InvalidTask(t.task_id.value, "LAUNCH_GROUP is not supported: use LAUNCH")
                for t in op.launch_group.task_group.tasks
            )
        else:
            log.info(
                "offer operation not supported; ignored",
                framework_id=framework_id,
                operation=convert.M.Offer.Operation.Type.Name(op.type),
            )
    offer_ids = [o.value for o in accept.offer_ids]
    refuse = convert.refuse_seconds(accept.filters if accept.HasField("filters") else None)
    if tasks:
        master.accept_each(framework_id, offer_ids, tasks, refuse)
    else:  # an ACCEPT that launches nothing declines the offers (as Mesos)
        master.decline(framework_id, offer_ids, refuse)
