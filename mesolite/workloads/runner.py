"""`WorkloadRunner`: the built-in frameworks of a master, one per submitted workload.

`mesolite master` starts one beside its servers, in the same process (so there is no
framework process of the user's to keep alive), and it connects to the master's own
gRPC port as the principal `workloads`. It

- takes submissions (`submit`: the file's text, already authorized by the master's
  HTTP layer, `workloads/http.py`) and stops (`stop`);
- runs one `WorkloadFramework` per workload until the workload is finished and its
  framework torn down (a finished workload's framework is torn down, and the runner
  subscribes once more to see NOT_FOUND before it calls it gone);
- reads the store at start: every workload that was running runs again, failing over
  to its framework id (the failover timeout, a week by default, outlives a master
  restart), reconciling before it launches anything;
- shows every workload, running or finished, to the master's read model (`views`).

A framework the master no longer knows (`FrameworkGone`: its failover timeout passed
while the master was up without it, or an operator tore it down with `mesolite
teardown`) is subscribed anew; its slots' tasks are gone with it,
so they are pending again, without using a job's retries. A refused subscription
(PERMISSION_DENIED: the ACLs do not let `workloads` into the role) is retried with
back-off, and the reason is shown in `mesolite jobs|services`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from mesolite.backoff import Backoff
from mesolite.errors import MesoliteError
from mesolite.framework_sdk import (
    ConnectionConfig,
    FrameworkGone,
    FrameworkRejected,
    NotConnected,
    RpcError,
    TlsConfig,
)
from mesolite.snapshot import JobSnapshot, ServiceSnapshot, WorkloadViews
from mesolite.workloads.framework import WorkloadFramework
from mesolite.workloads.progress import Progress, Slot, new_progress
from mesolite.workloads.snapshots import snapshot_of
from mesolite.workloads.spec import WorkloadFileError, WorkloadSpec, parse_workload
from mesolite.workloads.store import WorkloadRecord, WorkloadStatus, WorkloadStore

__all__ = [
    "RunnerConfig",
    "SubmissionRefused",
    "Workload",
    "WorkloadRunner",
]

log = structlog.get_logger(__name__)

WEEK = 7 * 24 * 3600.0


class SubmissionRefused(MesoliteError):
    """A submission or a stop that cannot be done; `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    store: Path | None  # the workloads' SQLite file; None keeps it in memory (tests)
    tls: TlsConfig | None = None  # the `workloads` principal's bundle, with TLS
    token: str | None = None
    failover_timeout: float = WEEK  # Marathon's default
    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    max_active: int = 100  # the master's default frameworks per principal
    max_finished: int = 100  # finished workloads remembered, newest kept
    # After a refused subscription.
    retry: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=60.0))
    # When set, submissions are refused with this reason (say, TLS without a bundle).
    disabled: str = ""


@dataclass(slots=True)
class Workload:
    """A workload the runner knows: its record, progress, and framework when running."""

    record: WorkloadRecord
    progress: Progress | None  # None: its file no longer parses (a newer mesolite wrote it)
    framework: WorkloadFramework | None = None
    task: asyncio.Task[None] | None = None
    _shown: tuple[object, JobSnapshot | ServiceSnapshot] | None = None  # (key, snapshot)

    def snapshot(self) -> JobSnapshot | ServiceSnapshot:
        """As the read model shows it; made again only when something it shows changed."""
        r = self.record
        key = (
            self.progress.version if self.progress else -1,
            r.status,
            r.framework_id,
            r.message,
            r.finished_at,
            tuple(r.counters.items()),
        )
        if self._shown is None or self._shown[0] != key:
            self._shown = (key, snapshot_of(r, self.progress))
        return self._shown[1]

    @property
    def spec(self) -> WorkloadSpec | None:
        return self.progress.spec if self.progress is not None else None


class WorkloadRunner:
    def __init__(self, config: RunnerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._store = WorkloadStore(config.store)
        self.workloads: dict[str, Workload] = {}
        self._master: str | None = None
        self._closing = asyncio.Event()
        for record, slots in self._store.load():
            self.workloads[record.name] = self._restore(record, slots)

    def _restore(self, record: WorkloadRecord, slots: list[Slot]) -> Workload:
        try:
            spec = parse_workload(record.text, record.source)
            progress = new_progress(spec, slots, record.counters)
        except (WorkloadFileError, ValueError) as e:
            log.error("stored workload unreadable; not run", workload=record.name, error=str(e))
            record.message = f"cannot be read back: {e}"
            return Workload(record, None)
        return Workload(record, progress)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, master: str) -> None:
        """Run every unfinished workload's framework against `master` ("host:port")."""
        self._master = master
        for workload in self.workloads.values():
            self._drive(workload)
        log.info("workload runner started", master=master, workloads=len(self.workloads))

    async def close(self) -> None:
        """Stop every framework (not torn down: they fail over when the runner is back)."""
        self._closing.set()
        for workload in self.workloads.values():
            if workload.framework is not None:
                await workload.framework.stop()
        tasks = [w.task for w in self.workloads.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._store.close()

    # -- what users ask -----------------------------------------------------------------

    def check(self, text: str | bytes, source: str) -> WorkloadSpec:
        """The workload in a file, checked; raises `WorkloadFileError` (nothing changes)."""
        return parse_workload(text, source)

    def submit(self, text: str, source: str, owner: str | None) -> Workload:
        """Accept a workload and start running it. Raises `WorkloadFileError` for a bad
        file and `SubmissionRefused` (409: a workload of that name is running; 429:
        too many running; 503: workloads are off); nothing changes then."""
        if self.config.disabled:
            raise SubmissionRefused(503, self.config.disabled)
        spec = parse_workload(text, source)
        old = self.workloads.get(spec.name)
        if old is not None and not old.record.status.finished:
            raise SubmissionRefused(
                409,
                f"{old.record.kind.value} {spec.name!r} is running: stop it first "
                f"(mesolite stop {spec.name})",
            )
        if old is not None and not old.record.framework_gone:
            raise SubmissionRefused(
                409, f"{spec.name!r} was stopped; its framework is still being torn down"
            )
        active = sum(not w.record.status.finished for w in self.workloads.values())
        if active >= self.config.max_active:
            raise SubmissionRefused(
                429, f"{active} workloads are running, the most this master runs"
            )
        record = WorkloadRecord(
            name=spec.name,
            kind=spec.kind,
            source=source,
            text=text,
            owner=owner,
            submitted_at=self._clock(),
        )
        progress = new_progress(spec)
        self._store.add(record, progress.slots)
        workload = Workload(record, progress)
        self.workloads.pop(spec.name, None)
        self.workloads[spec.name] = workload
        log.info(
            "workload submitted",
            workload=spec.name,
            kind=spec.kind.value,
            role=spec.role,
            owner=owner,
            source=source,
        )
        self._forget_old()
        if self._master is not None:
            self._drive(workload)
        return workload

    async def stop(self, name: str) -> Workload:
        """Stop a running workload: its framework torn down, its tasks killed."""
        workload = self.workloads.get(name)
        if workload is None:
            raise SubmissionRefused(404, f"no workload named {name!r}")
        if workload.record.status.finished:
            return workload
        log.info("workload stop requested", workload=name)
        if workload.framework is not None:
            await workload.framework.request_stop()
        else:  # not running (never started, or unreadable)
            record = workload.record
            record.status = WorkloadStatus.STOPPED
            record.finished_at = self._clock()
            record.framework_gone = not record.framework_id
            self._store.save(record)
            if self._master is not None and not record.framework_gone:
                self._drive(workload)
        return workload

    def views(self) -> WorkloadViews:
        """Every workload the runner knows, as the master's snapshot shows them."""
        shown = [w.snapshot() for w in self.workloads.values()]
        return (
            tuple(s for s in shown if isinstance(s, JobSnapshot)),
            tuple(s for s in shown if isinstance(s, ServiceSnapshot)),
        )

    def owner_of(self, name: str) -> str | None:
        """The principal that submitted `name`; raises `SubmissionRefused` (404) if none."""
        workload = self.workloads.get(name)
        if workload is None:
            raise SubmissionRefused(404, f"no workload named {name!r}")
        return workload.record.owner

    # -- running ------------------------------------------------------------------------

    def _drive(self, workload: Workload) -> None:
        if workload.task is None or workload.task.done():
            workload.task = asyncio.create_task(
                self._run(workload), name=f"workload-{workload.record.name}"
            )

    async def _run(self, workload: Workload) -> None:
        """Keep the workload's framework subscribed until it is finished and torn down."""
        record, progress = workload.record, workload.progress
        assert self._master is not None
        if progress is None:
            return
        failures = 0
        while not self._closing.is_set():
            if record.status.finished and not record.framework_id:
                record.framework_gone = True
                self._store.save(record)
            if record.framework_gone:
                break
            framework = WorkloadFramework(
                record,
                progress,
                self._store,
                failover_timeout=self.config.failover_timeout,
                connection=self.config.connection,
                tls=self.config.tls,
                token=self.config.token,
                clock=self._clock,
            )
            workload.framework = framework
            try:
                await framework.run_until_done(self._master)
                failures = 0
                continue  # torn down or stopped: the loop looks again
            except NotConnected:
                # The stream closed under a call: subscribe again (what was sent is
                # reconciled then).
                continue
            except FrameworkGone:
                self._framework_gone(record, progress)
                failures = 0
                continue
            except FrameworkRejected as e:
                problem = f"the master refused the framework: {e}"
            except RpcError as e:
                problem = f"the master's gRPC service failed: {e}"
            except Exception as e:
                log.exception("workload framework failed", workload=record.name)
                problem = f"internal error: {e!r}"
            finally:
                workload.framework = None
            record.message = problem
            self._store.save(record)
            delay = self.config.retry.delay(failures)
            failures += 1
            log.warning(
                "workload framework will retry",
                workload=record.name,
                problem=problem,
                delay=round(delay, 2),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closing.wait()

    def _framework_gone(self, record: WorkloadRecord, progress: Progress) -> None:
        if record.status.finished:
            record.framework_gone = True
            self._store.save(record)
            log.info(
                "workload's framework is gone",
                workload=record.name,
                framework_id=record.framework_id,
            )
            return
        lost = progress.lose_all()
        log.warning(
            "the master no longer knows the workload's framework; subscribing anew",
            workload=record.name,
            framework_id=record.framework_id,
            slots_lost=[s.index for s in lost],
        )
        record.message = f"framework {record.framework_id} was gone from the master; started again"
        record.framework_id = ""
        record.counters = progress.counters()
        self._store.save(record, lost)

    def _forget_old(self) -> None:
        """Keep the newest `max_finished` finished workloads whose frameworks are gone."""
        finished = [
            w
            for w in self.workloads.values()
            if w.record.status.finished and w.record.framework_gone
        ]
        finished.sort(key=lambda w: w.record.finished_at or 0.0)
        for workload in finished[: max(0, len(finished) - self.config.max_finished)]:
            del self.workloads[workload.record.name]
            self._store.delete(workload.record.name)
            log.info("finished workload forgotten", workload=workload.record.name)
