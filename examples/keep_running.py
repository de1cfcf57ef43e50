"""A service: keep N instances of a command running, replacing any that end.

Usage: python examples/keep_running.py --master HOST:PORT --id-file FILE
           [--instances 3] [--command "sleep 3600"] [--cpus 0.1] [--mem 32]

The framework is written the obvious way: it counts the instances it knows to be alive
and launches on offers until there are N. That is safe across restarts because the SDK
reconciles after every subscription and holds offers until the master has told it about
every task it knows (docs/framework-guide.md, "Callback order"): a process restarted
with its id file (kill -9, a reboot, a master restart) hears of the instances that are
still running before it is offered anything, and launches none twice.

Stop it with Ctrl-C (its instances keep running, for the next start to take over) or
with SIGUSR1 to tear it down (its instances are killed).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

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
from mesolite.tls_options import add_client_options, client_auth


class KeepRunning(Framework):
    def __init__(
        self,
        name: str,
        instances: int,
        command: str,
        resources: Resources,
        id_file: Path,
        **options: Any,
    ) -> None:
        """`options`: the `Framework`'s (failover_timeout, connection, tls, token)."""
        # id_file without failover_timeout: the SDK's default for it (a week) applies,
        # so the master keeps the instances while this process is away.
        super().__init__(name, id_file=id_file, **options)
        self.instances = instances
        self.command = command
        self.resources = resources
        self.live: dict[str, TaskState] = {}  # every instance not ended: its last state
        # Launches the master may still refuse (until a task of theirs reports).
        self.launches: dict[str, list[str]] = {}  # call id -> task ids
        self.launched_by: dict[str, str] = {}  # task id -> call id
        self.steady = False  # said "N of N live" since the last change

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            tasks: list[TaskSpec] = []
            free = offer.resources
            while len(self.live) + len(tasks) < self.instances and free.contains(self.resources):
                tasks.append(TaskSpec(new_task_id(self.name), self.command, self.resources))
                free -= self.resources
            if not tasks:
                if len(self.live) == self.instances and not self.steady:
                    self.steady = True
                    print(f"steady: {len(self.live)} of {self.instances} live", flush=True)
                # Full (or too small): keep it from us for a while; revive() below
                # asks for offers again as soon as an instance ends.
                await self.decline(offer, refuse_seconds=30)
                continue
            call_id = await self.launch(offer, tasks)
            self.launches[call_id] = [t.task_id for t in tasks]
            for task in tasks:
                self.live[task.task_id] = TaskState.STAGING
                self.launched_by[task.task_id] = call_id
                print(f"launched {task.task_id} on {offer.hostname}", flush=True)

    async def on_error(self, message: str, call_id: str) -> None:
        # A refused launch started nothing: those instances are not live.
        for task_id in self.launches.pop(call_id, []):
            del self.launched_by[task_id]
            self.live.pop(task_id, None)
        print(f"refused: {message}", flush=True)
        await self.revive()

    async def on_update(self, status: TaskStatus) -> None:
        # A task reported: its launch was accepted, nothing of it can be refused now.
        for task_id in self.launches.pop(self.launched_by.get(status.task_id, ""), []):
            del self.launched_by[task_id]
        if not status.state.is_terminal:
            if self.live.get(status.task_id) != status.state:
                print(f"{status.task_id} {status.state.value}", flush=True)
            self.live[status.task_id] = status.state
        elif self.live.pop(status.task_id, None) is not None:
            self.steady = False
            print(
                f"{status.task_id} ended {status.state.value} (exit {status.exit_code}): "
                f"{len(self.live)} of {self.instances} live, replacing it",
                flush=True,
            )
            await self.revive()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--master", required=True, help="the master's HOST:PORT (HA masters: H1:P1,H2:P2,...)"
    )
    p.add_argument("--id-file", type=Path, required=True, help="keeps the framework id")
    p.add_argument("--name", default="service", help="framework name, also the task id prefix")
    p.add_argument("--instances", type=int, default=3, help="how many to keep running")
    p.add_argument("--command", default="sleep 3600", help="each instance's shell command")
    p.add_argument("--cpus", type=float, default=0.1, help="CPUs per instance")
    p.add_argument("--mem", type=float, default=32, help="memory per instance, MB")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    add_client_options(p)  # --tls-dir, --token-file
    args = p.parse_args(argv)
    configure(level=args.log_level)
    try:
        auth = client_auth(args)
        service = KeepRunning(
            args.name,
            args.instances,
            args.command,
            Resources(cpus=args.cpus, mem=args.mem),
            args.id_file,
            tls=auth.tls,
            token=auth.token,
        )
        asyncio.run(_run(service, args.master))
    except MesoliteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


async def _run(service: KeepRunning, master: str) -> None:
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[object]] = set()  # kept until done

    # Ctrl-C / SIGTERM: leave, the instances keep running; SIGUSR1: end the service.
    def on_signal(call: Callable[[], Coroutine[object, object, object]]) -> None:
        pending.add(loop.create_task(call()))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, service.stop)
    loop.add_signal_handler(signal.SIGUSR1, on_signal, service.teardown)
    await service.run(master)


if __name__ == "__main__":
    sys.exit(main())
