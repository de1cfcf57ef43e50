"""A batch job: run a command for each index 0..N-1, at most P at a time, retrying
each index that fails up to R times; exit when every index has succeeded or one has
run out of retries.

Usage: python examples/retrying_batch.py --master HOST:PORT
           [--completions 20] [--parallelism 6] [--retries 2]
           [--command 'echo "index $TASK_INDEX"; sleep 1'] [--cpus 0.1] [--mem 32]

Each task gets its index and attempt (1, 2, ...) as `$TASK_INDEX` and `$TASK_ATTEMPT`,
beside the SDK's `$MESOLITE_TASK_ID` and `$MESOLITE_SANDBOX` (its working directory).
What counts as a failure to retry is any end but TASK_FINISHED: a non-zero exit, a
memory limit, a lost agent. The job tears itself down at the end (its framework is
gone from the master) and exits 0 if every index succeeded, 1 if not.

Kubernetes calls this an Indexed Job (`completions`, `parallelism`,
`backoffLimitPerIndex`); here it is 100 lines of framework.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mesolite.framework_sdk import (
    Framework,
    MesoliteError,
    Offer,
    Resources,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from mesolite.logs import configure
from mesolite.tls_options import add_client_options, client_auth


@dataclass(frozen=True, slots=True)
class Job:
    command: str
    resources: Resources
    completions: int = 20  # indexes 0..completions-1
    parallelism: int = 6  # tasks running at once, at most
    retries: int = 2  # further attempts per index after a failure


class RetryingBatch(Framework):
    def __init__(self, name: str, job: Job, **options: Any) -> None:
        """`options`: the `Framework`'s (role, connection, tls, token)."""
        super().__init__(name, **options)
        self.job = job
        self.waiting = list(range(job.completions))  # indexes to launch, in order
        self.attempts = dict.fromkeys(self.waiting, 0)  # index -> attempts launched
        self.running: dict[str, int] = {}  # task id -> index
        # Launches the master may still refuse (until a task of theirs reports).
        self.launches: dict[str, list[str]] = {}  # call id -> task ids
        self.launched_by: dict[str, str] = {}  # task id -> call id
        self.succeeded: set[int] = set()
        self.failed: set[int] = set()  # out of retries

    @property
    def done(self) -> bool:
        return len(self.succeeded) + len(self.failed) == self.job.completions

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            tasks: list[TaskSpec] = []
            free = offer.resources
            while (
                self.waiting
                and len(self.running) < self.job.parallelism
                and free.contains(self.job.resources)
            ):
                tasks.append(self._next_task())  # counted in self.running
                free -= self.job.resources
            if tasks:
                # refuse_seconds=0: what is left goes back to the allocator at once.
                call_id = await self.launch(offer, tasks, refuse_seconds=0)
                self.launches[call_id] = [t.task_id for t in tasks]
                self.launched_by.update((t.task_id, call_id) for t in tasks)
            else:
                await self.decline(offer, refuse_seconds=30)  # revive() when needed

    def _next_task(self) -> TaskSpec:
        index = self.waiting.pop(0)
        self.attempts[index] += 1
        attempt = self.attempts[index]
        task_id = f"{self.name}-{index:04d}-{attempt}"
        self.running[task_id] = index
        env = {"TASK_INDEX": str(index), "TASK_ATTEMPT": str(attempt)}
        return TaskSpec(task_id, self.job.command, self.job.resources, environment=env)

    async def on_error(self, message: str, call_id: str) -> None:
        # A refused launch (its offer expired, say) ran nothing: launch those again.
        for task_id in self.launches.pop(call_id, []):
            del self.launched_by[task_id]
            index = self.running.pop(task_id)
            self.attempts[index] -= 1
            self.waiting.insert(0, index)
        print(f"refused: {message}", flush=True)
        await self.revive()

    async def on_update(self, status: TaskStatus) -> None:
        # A task reported: its launch was accepted, nothing of it can be refused now.
        for task_id in self.launches.pop(self.launched_by.get(status.task_id, ""), []):
            del self.launched_by[task_id]
        index = self.running.get(status.task_id)
        if index is None or not status.state.is_terminal:
            return
        del self.running[status.task_id]
        attempt = self.attempts[index]
        if status.state is TaskState.FINISHED:
            self.succeeded.add(index)
            print(f"index {index} succeeded (attempt {attempt})", flush=True)
        elif attempt <= self.job.retries:
            self.waiting.append(index)
            print(
                f"index {index} attempt {attempt} ended {status.state.value} "
                f"(exit {status.exit_code}): {status.message}; retrying",
                flush=True,
            )
        else:
            self.failed.add(index)
            print(f"index {index} failed after {attempt} attempts", flush=True)
        if self.done:
            print(f"done: {len(self.succeeded)} succeeded, {len(self.failed)} failed", flush=True)
            await self.teardown()  # run() returns
        else:
            await self.revive()  # room for another task: offers again, at once


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--master", required=True, help="the master's HOST:PORT (HA masters: H1:P1,H2:P2,...)"
    )
    p.add_argument("--name", default="sweep", help="framework name, also the task id prefix")
    p.add_argument("--command", default='echo "index $TASK_INDEX"; sleep 1')
    p.add_argument("--completions", type=int, default=20, help="indexes 0..N-1")
    p.add_argument("--parallelism", type=int, default=6, help="tasks at once, at most")
    p.add_argument("--retries", type=int, default=2, help="attempts after a failure")
    p.add_argument("--cpus", type=float, default=0.1, help="CPUs per task")
    p.add_argument("--mem", type=float, default=32, help="memory per task, MB")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning"])
    add_client_options(p)  # --tls-dir, --token-file
    args = p.parse_args(argv)
    if min(args.completions, args.parallelism) < 1 or args.retries < 0:
        p.error("--completions and --parallelism must be at least 1, --retries at least 0")
    configure(level=args.log_level)
    job = Job(
        args.command,
        Resources(cpus=args.cpus, mem=args.mem),
        args.completions,
        args.parallelism,
        args.retries,
    )
    try:
        auth = client_auth(args)
        batch = RetryingBatch(args.name, job, tls=auth.tls, token=auth.token)
        asyncio.run(batch.run(args.master))
    except MesoliteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if batch.done and not batch.failed else 1


if __name__ == "__main__":
    sys.exit(main())
