"""A generic batch framework: run N copies of one command, each with the same resources.

It launches at most `tasks_per_offer` tasks per offer (one by default) and hands the rest
of the offer back with `refuse_seconds=0`, so the master's DRF allocator re-offers it at
once to whichever framework now has the lowest dominant share: the task-by-task
progressive filling of the DRF paper, over real offers. An offer too small for a task is
declined with an ordinary refuse filter. With nothing left to launch the framework
suppresses offers, and revives them when a task has to run again.

In process::

    from examples.batch import BatchFramework, BatchSpec

    framework = BatchFramework(BatchSpec(name="cpu", cpus=2, mem=512, tasks=10))
    await framework.run("127.0.0.1:5050")  # returns when all ten have finished
    framework.stats.failed  # -> 0

`examples/batch_framework.py` runs it from the command line, `examples/cpu_heavy.py` and
`examples/memory_heavy.py` with other defaults. On a cluster with TLS each takes
`--tls-dir DIR` (the framework's bundle from `mesolite certs init`) or `MESOLITE_TLS_DIR`,
and `--token-file` for a bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from mesolite.framework_sdk import (
    Framework,
    MesoliteError,
    Offer,
    Resources,
    TaskSpec,
    TaskState,
    TaskStatus,
    new_task_id,
)
from mesolite.logs import configure
from mesolite.tls_options import PLAINTEXT, ClientAuth, add_client_options, client_auth

_log = structlog.get_logger(__name__)

# The task never ran to an end of its own: run it again rather than count it.
_RELAUNCH = frozenset({TaskState.LOST, TaskState.DROPPED, TaskState.GONE})


@dataclass(frozen=True, slots=True)
class BatchSpec:
    name: str = "batch"
    role: str = "*"
    cpus: float = 1.0
    mem: float = 128.0  # MB
    duration: float = 5.0  # seconds each task sleeps, unless `command` is given
    tasks: int = 10  # 0: keep the cluster busy until stopped
    command: str | None = None
    tasks_per_offer: int = 1  # 0: as many as fit
    decline_seconds: float = 5.0  # refuse filter for offers too small for a task
    failover_timeout: float = 0.0

    @property
    def task_resources(self) -> Resources:
        return Resources(cpus=self.cpus, mem=self.mem)

    @property
    def task_command(self) -> str:
        return self.command if self.command is not None else f"sleep {self.duration:g}"

    @property
    def forever(self) -> bool:
        return self.tasks == 0


DEFAULTS = BatchSpec()


@dataclass(slots=True)
class BatchStats:
    launched: int = 0
    finished: int = 0  # TASK_FINISHED
    failed: int = 0  # any other end: failed, killed, invalid
    relaunched: int = 0  # lost, dropped or rejected, and queued again


class BatchFramework(Framework):
    """Runs `spec.tasks` tasks (forever when 0) and tears itself down when all are done.

    `out` receives one line per launch, per finish and a summary (default: print).
    """

    def __init__(
        self,
        spec: BatchSpec,
        framework_id: str | None = None,
        out: Callable[[str], None] = print,
        auth: ClientAuth = PLAINTEXT,
    ) -> None:
        super().__init__(
            name=spec.name,
            role=spec.role,
            failover_timeout=spec.failover_timeout,
            framework_id=framework_id,
            tls=auth.tls,
            token=auth.token,
        )
        self.spec = spec
        self.stats = BatchStats()
        self._out = out
        self._pending = spec.tasks  # tasks still to launch; unused when forever
        self._running: dict[str, TaskSpec] = {}  # launched and not yet ended
        # Launches not yet confirmed by any status, which an ERROR event may still undo.
        self._launch_calls: dict[str, list[str]] = {}  # call id -> task ids
        self._launch_call_of: dict[str, str] = {}  # task id -> call id
        self._suppressed: bool | None = None  # None: unknown to the master after subscribing
        self._seq = 0
        self._tearing_down = False
        self._started = time.monotonic()

    @property
    def done(self) -> bool:
        """Every task has ended (never, when running forever)."""
        s = self.stats
        return not self.spec.forever and s.finished + s.failed >= self.spec.tasks

    @property
    def succeeded(self) -> bool:
        return self.stats.failed == 0 and (self.spec.forever or self.done)

    async def run(self, master: str) -> None:
        self._started = time.monotonic()
        await super().run(master)
        self._out(self.summary())

    def summary(self) -> str:
        s = self.stats
        return (
            f"summary {self.spec.name}: {s.launched} launched, {s.finished} finished, "
            f"{s.failed} failed, {s.relaunched} relaunched, "
            f"{time.monotonic() - self._started:.1f}s"
        )

    # -- callbacks -----------------------------------------------------------------------

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self._out(f"subscribed {self.spec.name} framework_id={framework_id}")
        self._suppressed = None
        await self._sync_offer_interest()

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            tasks = self._fit(offer)
            if not tasks:
                await self.decline(offer, refuse_seconds=self.spec.decline_seconds)
                continue
            # refuse_seconds=0: the remainder goes straight back to the allocator.
            call_id = await self.launch(offer, tasks, refuse_seconds=0)
            self._launch_calls[call_id] = [t.task_id for t in tasks]
            for task in tasks:
                self._launch_call_of[task.task_id] = call_id
                self._running[task.task_id] = dataclasses.replace(task, agent_id=offer.agent_id)
                self.stats.launched += 1
                self._out(
                    f"launch {task.task_id} agent={offer.agent_id} resources={task.resources}"
                )
        await self._sync_offer_interest()

    async def on_update(self, status: TaskStatus) -> None:
        task = self._running.get(status.task_id)
        if task is None:
            return  # an earlier incarnation's task, or a repeated terminal state
        self._heard_of(status.task_id)
        if not status.state.is_terminal:
            return
        del self._running[status.task_id]
        ok = status.state is TaskState.FINISHED
        self._out(
            f"finish {task.task_id} agent={status.agent_id or task.agent_id} "
            f"resources={task.resources} state={status.state.value} exit_code={status.exit_code}"
            # Why a task did not finish well is worth a line; "exited with 0" is not.
            + (f" message={status.message!r}" if status.message and not ok else "")
            + (" (relaunching)" if status.state in _RELAUNCH else "")
        )
        if ok:
            self.stats.finished += 1
        elif status.state in _RELAUNCH:
            self._requeue(1)
        else:
            self.stats.failed += 1
        await self._settle()

    async def on_error(self, message: str, call_id: str) -> None:
        task_ids = self._launch_calls.pop(call_id, None)
        if task_ids is None:
            _log.warning("call rejected", call_id=call_id, error=message)
            return
        # A rejected launch did nothing: its tasks never existed.
        for task_id in task_ids:
            self._running.pop(task_id, None)
            self._launch_call_of.pop(task_id, None)
        self._out(f"launch rejected ({message}): relaunching {len(task_ids)} task(s)")
        self._requeue(len(task_ids))
        await self._settle()

    # -- internals -----------------------------------------------------------------------

    def _fit(self, offer: Offer) -> list[TaskSpec]:
        spec, need = self.spec, self.spec.task_resources
        limit = spec.tasks_per_offer or sys.maxsize
        if not spec.forever:
            limit = min(limit, self._pending)
        tasks: list[TaskSpec] = []
        free = offer.resources
        while len(tasks) < limit and free.contains(need):
            free -= need
            self._seq += 1
            tasks.append(
                TaskSpec(
                    task_id=new_task_id(spec.name),
                    command=spec.task_command,
                    resources=need,
                    name=f"{spec.name} #{self._seq}",
                )
            )
        if not spec.forever:
            self._pending -= len(tasks)
        return tasks

    def _heard_of(self, task_id: str) -> None:
        # Any status means the launch was accepted, so no ERROR can come for its call.
        call_id = self._launch_call_of.pop(task_id, None)
        for other in self._launch_calls.pop(call_id, []) if call_id else []:
            self._launch_call_of.pop(other, None)

    def _requeue(self, count: int) -> None:
        self.stats.relaunched += count
        if not self.spec.forever:
            self._pending += count

    async def _settle(self) -> None:
        if self.done:
            if not self._tearing_down:
                self._tearing_down = True
                await self.teardown()  # nothing left to run: unregister and end run()
        else:
            await self._sync_offer_interest()

    async def _sync_offer_interest(self) -> None:
        wanted = self.spec.forever or self._pending > 0
        if wanted and self._suppressed is not False:
            await self.revive()
            self._suppressed = False
        elif not wanted and self._suppressed is not True:
            await self.suppress()
            self._suppressed = True


# -- command line ----------------------------------------------------------------------------


def parse_args(
    argv: Sequence[str] | None = None, defaults: BatchSpec = DEFAULTS
) -> argparse.Namespace:
    d = defaults
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--master", required=True, help="the master's HOST:PORT (HA masters: H1:P1,H2:P2,...)"
    )
    p.add_argument("--name", default=d.name, help="framework name, also the task id prefix")
    p.add_argument("--role", default=d.role, help="role whose share DRF weighs")
    p.add_argument("--cpus", type=float, default=d.cpus, help="CPUs per task")
    p.add_argument("--mem", type=float, default=d.mem, help="memory per task, MB")
    p.add_argument("--duration", type=float, default=d.duration, help="seconds per task")
    p.add_argument("--tasks", type=int, default=d.tasks, help="tasks to run; 0: forever")
    p.add_argument("--command", default=d.command, help="shell command; unset: sleep DURATION")
    p.add_argument(
        "--tasks-per-offer", type=int, default=d.tasks_per_offer, help="0: as many as fit"
    )
    p.add_argument(
        "--decline-seconds",
        type=float,
        default=d.decline_seconds,
        help="how long to refuse an offer too small for a task",
    )
    p.add_argument(
        "--failover-timeout",
        type=float,
        default=d.failover_timeout,
        help="seconds the master keeps the tasks when this process goes away",
    )
    p.add_argument("--framework-id", help="fail over an earlier run of this framework")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    add_client_options(p)  # --tls-dir etc., and MESOLITE_TLS_DIR
    args = p.parse_args(argv)
    if args.tasks < 0 or args.tasks_per_offer < 0:
        p.error("--tasks and --tasks-per-offer must not be negative")
    return args


def spec_from_args(args: argparse.Namespace) -> BatchSpec:
    return BatchSpec(
        name=args.name,
        role=args.role,
        cpus=args.cpus,
        mem=args.mem,
        duration=args.duration,
        tasks=args.tasks,
        command=args.command,
        tasks_per_offer=args.tasks_per_offer,
        decline_seconds=args.decline_seconds,
        failover_timeout=args.failover_timeout,
    )


def main(argv: Sequence[str] | None = None, defaults: BatchSpec = DEFAULTS) -> int:
    """Run from the command line; the exit status is 0 when no task failed."""
    args = parse_args(argv, defaults)
    configure(level=args.log_level)
    try:
        auth = client_auth(args)
    except MesoliteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    framework = BatchFramework(spec_from_args(args), framework_id=args.framework_id, auth=auth)
    try:
        asyncio.run(_run_until_signalled(framework, args.master))
    except MesoliteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if framework.succeeded else 1


async def _run_until_signalled(framework: BatchFramework, master: str) -> None:
    loop = asyncio.get_running_loop()
    stopping: set[asyncio.Task[None]] = set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # stop(), not teardown(): with a failover timeout the tasks outlive this process.
        loop.add_signal_handler(sig, lambda: stopping.add(asyncio.create_task(framework.stop())))
    await framework.run(master)
