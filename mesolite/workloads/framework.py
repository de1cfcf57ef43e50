"""`WorkloadFramework`: one workload run as an ordinary SDK framework.

The shell around `progress.py`: it turns offers into launches of the slots the
progress says to launch, status updates into progress, and writes every slot it
changes to the store before it acts on the change (a launch is on disk before it is
sent). It subscribes like any framework, over the master's gRPC port, as the built-in
principal (`workloads`): the master authenticates and authorizes it like any other.

**Nothing is launched before reconciliation.** After every (re)subscription the
framework asks the master about every task the store says may be live (explicit
reconciliation: a task the master does not know is answered TASK_LOST, once no agent
is still re-registering) and holds the offers it gets, unanswered, until every one of
those tasks has been answered. Only then does it launch. It asks again, with back-off,
for tasks still unanswered (the master defers answers while agents re-register). The
SDK itself holds offers until the master has reported every task it knows (its implicit
reconciliation after a re-subscription); this explicit one names the tasks the store
knows, so a launch the master never got is answered too (TASK_LOST).

Callbacks, the back-off timer and `request_stop` take one lock, so the progress and
the store are changed by one of them at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence

import structlog

from mesolite.backoff import Backoff
from mesolite.framework_sdk import (
    ConnectionConfig,
    Framework,
    NotConnected,
    Offer,
    TaskSpec,
    TaskStatus,
    TlsConfig,
)
from mesolite.workloads.progress import Progress, Slot, fit, slot_environment
from mesolite.workloads.store import WorkloadRecord, WorkloadStatus, WorkloadStore

__all__ = ["WorkloadFramework", "framework_name"]

log = structlog.get_logger(__name__)

# Offers left unused while the workload still wants more are refused this long; when it
# wants nothing, it suppresses offers until it does (then revives).
_REFUSE_WHILE_WANTING = 1.0
_RECONCILE_AGAIN = Backoff(initial=2.0, maximum=30.0)
_LAUNCH_CALLS_KEPT = 256


def framework_name(record: WorkloadRecord) -> str:
    """`job:sweep`, `service:web`: how a workload's framework shows in `mesolite frameworks`."""
    return f"{record.kind.value}:{record.name}"


class WorkloadFramework(Framework):
    def __init__(
        self,
        record: WorkloadRecord,
        progress: Progress,
        store: WorkloadStore,
        *,
        failover_timeout: float,
        connection: ConnectionConfig,
        tls: TlsConfig | None = None,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            framework_name(record),
            role=progress.spec.role,
            failover_timeout=failover_timeout,
            framework_id=record.framework_id or None,
            connection=connection,
            tls=tls,
            token=token,
        )
        self.record = record
        self.progress = progress
        self._store = store
        self._clock = clock
        self._lock = asyncio.Lock()
        # Task ids asked about and not yet answered; None once reconciled.
        self._unanswered: set[str] | None = set()
        self._asked_at = 0.0
        self._asks = 0
        self._suppressed = False
        self._launch_calls: OrderedDict[str, list[str]] = OrderedDict()  # call id: task ids
        self._tick = asyncio.Event()  # wakes the timer: a deadline may have moved
        self._log = log.bind(workload=record.name, kind=record.kind.value)

    @property
    def reconciled(self) -> bool:
        """Subscribed, and every task the store knew of has been answered for."""
        return self.connected and self._unanswered is None

    async def run_until_done(self, master: str) -> None:
        """`run(master)`, with the timer that ends back-offs and asks again about
        unanswered tasks."""
        timer = asyncio.create_task(self._timer(), name=f"workload-timer-{self.record.name}")
        try:
            await self.run(master)
        finally:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer

    async def request_stop(self) -> None:
        """Stop the workload for good: its framework torn down, its tasks killed. The
        record says STOPPED first, so a framework that is away tears down when back."""
        async with self._lock:
            if self.record.status is WorkloadStatus.ACTIVE:
                self._finish(WorkloadStatus.STOPPED, "stopped by request")
        # Not under the lock: teardown() waits for run() to end, which may be waiting
        # for the lock in a callback.
        with contextlib.suppress(NotConnected):
            if self.connected:
                await self.teardown()

    # -- callbacks ------------------------------------------------------------------------

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        async with self._lock:
            if self.record.framework_id != framework_id:
                self.record.framework_id = framework_id
                self.record.framework_gone = False
                self._store.save(self.record)
            self.record.message = ""
            self._suppressed = False  # the master revives a framework that re-subscribes
            self._launch_calls.clear()
            if self.record.status.finished:
                self._log.info(
                    "tearing down the framework of a finished workload",
                    framework_id=framework_id,
                    status=self.record.status.value,
                )
                await self.teardown()
                return
            live = self.progress.live_task_ids()
            self._log.info(
                "subscribed; reconciling before any launch",
                framework_id=framework_id,
                resubscribed=resubscribed,
                tasks=len(live),
            )
            self._unanswered = set(live)
            self._asks = 0
            if live:
                await self._ask(live)
            else:
                await self._reconciled()

    async def on_disconnected(self) -> None:
        async with self._lock:
            self._unanswered = set()  # learnt again after the next subscription

    async def on_offers(self, offers: list[Offer]) -> None:
        async with self._lock:
            if self.record.status.finished:
                await self.decline(offers)
            elif self._unanswered is None:
                await self._use(offers)
            # else: held, unanswered, until reconciliation completes (or rescinded).

    async def on_update(self, status: TaskStatus) -> None:
        async with self._lock:
            slot = self.progress.update(
                status.task_id, status.state, status.exit_code, self._clock()
            )
            if slot is not None:
                self._save(slot)
                self._log.info(
                    "task status",
                    framework_id=self.framework_id,
                    task_id=status.task_id,
                    slot=slot.index,
                    state=status.state.value,
                    exit_code=status.exit_code,
                    slot_state=slot.state.value,
                    failures=slot.failures,
                )
            if self._unanswered is not None and status.task_id in self._unanswered:
                self._unanswered.discard(status.task_id)
                if not self._unanswered:
                    await self._reconciled()
                    return
            if await self._ended_if_done():
                return
            if slot is not None and self._unanswered is None:
                await self._act()

    async def on_error(self, message: str, call_id: str) -> None:
        async with self._lock:
            task_ids = self._launch_calls.pop(call_id, None)
            if task_ids is None:
                self._log.warning("call refused by the master", call_id=call_id, error=message)
                return
            self._log.warning(
                "launch refused by the master", call_id=call_id, error=message, task_ids=task_ids
            )
            slots = [s for t in task_ids if (s := self.progress.not_launched(t)) is not None]
            self._save(*slots)
            if self._unanswered is None:
                await self._act()

    # -- internals ------------------------------------------------------------------------

    async def _reconciled(self) -> None:
        self._unanswered = None
        self._log.info(
            "reconciled", framework_id=self.framework_id, live=len(self.progress.live_task_ids())
        )
        if not await self._ended_if_done():
            await self._act()

    async def _ended_if_done(self) -> bool:
        """A job whose every index has ended is finished: its framework torn down."""
        if self.record.status is not WorkloadStatus.ACTIVE or not self.progress.finished:
            return False
        done = WorkloadStatus.COMPLETED if self.progress.succeeded else WorkloadStatus.FAILED
        self._finish(done, "")
        await self.teardown()
        return True

    async def _ask(self, task_ids: Sequence[str]) -> None:
        self._asked_at = time.monotonic()
        self._asks += 1
        await self.reconcile(list(task_ids))
        self._tick.set()

    async def _act(self) -> None:
        """Launch on the offers held, and ask for offers (or stop asking) as needed."""
        if not self.connected or self.record.status.finished:
            return
        held = list(self.outstanding_offers.values())
        if held:
            await self._use(held)
        elif self.progress.launchable(self._clock()):
            if self._suppressed:
                self._suppressed = False
                await self.revive()
        else:
            await self._quiet()
        self._tick.set()

    async def _use(self, offers: Sequence[Offer]) -> None:
        spec = self.progress.spec
        wanted = self.progress.launchable(self._clock())
        unused: list[Offer] = []
        for offer in offers:
            count = fit(offer.resources, spec.resources, len(wanted))
            if count == 0:
                unused.append(offer)
                continue
            chosen, wanted = wanted[:count], wanted[count:]
            tasks = [self._task(slot) for slot in chosen]
            self._save(*chosen)  # on disk before the launch leaves
            call_id = await self.launch(offer, tasks, refuse_seconds=_REFUSE_WHILE_WANTING)
            self._launch_calls[call_id] = [t.task_id for t in tasks]
            while len(self._launch_calls) > _LAUNCH_CALLS_KEPT:
                self._launch_calls.popitem(last=False)
            self._log.info(
                "launched",
                framework_id=self.framework_id,
                agent_id=offer.agent_id,
                slots=[s.index for s in chosen],
                task_ids=[t.task_id for t in tasks],
            )
        if unused:
            await self.decline(unused, refuse_seconds=_REFUSE_WHILE_WANTING if wanted else None)
        if not self.progress.launchable(self._clock()):
            await self._quiet()

    def _task(self, slot: Slot) -> TaskSpec:
        spec = self.progress.spec
        task_id = f"{spec.name}.{slot.index}.{slot.launches}-{uuid.uuid4().hex[:8]}"
        self.progress.launched(slot, task_id)
        return TaskSpec(
            task_id,
            spec.command,
            spec.resources,
            name=f"{spec.name}[{slot.index}]",
            environment=slot_environment(spec, slot),
        )

    async def _quiet(self) -> None:
        if not self._suppressed:
            self._suppressed = True
            await self.suppress()

    def _finish(self, status: WorkloadStatus, message: str) -> None:
        self.record.status = status
        self.record.finished_at = self._clock()
        self.record.message = message
        self._store.save(self.record)
        self._log.info("workload finished", status=status.value, framework_id=self.framework_id)

    def _save(self, *slots: Slot) -> None:
        self.record.counters = self.progress.counters()
        self._store.save(self.record, slots)

    async def _timer(self) -> None:
        """Ends back-offs (a service instance due for replacement) and asks again about
        tasks still unanswered."""
        while True:
            delay = self._next_deadline()
            self._tick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._tick.wait()
                continue  # woken: a deadline may have moved
            async with self._lock:
                if not self.connected or self.record.status.finished:
                    continue
                if self._unanswered:
                    self._log.info(
                        "asking again about unanswered tasks", tasks=len(self._unanswered)
                    )
                    with contextlib.suppress(NotConnected):
                        await self._ask(sorted(self._unanswered))
                elif self._unanswered is None:
                    with contextlib.suppress(NotConnected):
                        await self._act()

    def _next_deadline(self) -> float | None:
        """Seconds until the timer has something to do; None: nothing scheduled."""
        if not self.connected or self.record.status.finished:
            return None
        if self._unanswered:
            wait = _RECONCILE_AGAIN.delay(self._asks - 1, lambda: 0.0)
            return max(0.0, self._asked_at + wait - time.monotonic())
        if self._unanswered is None:
            now = self._clock()
            wakeup = self.progress.next_wakeup(now)
            if wakeup is not None:
                return max(0.0, wakeup - now)
        return None
