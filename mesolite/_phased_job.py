"""A job for the dynamic-sharing experiment: keeps the cluster busy with tasks whose size
changes from phase to phase.

Like `examples.batch.BatchFramework` with `tasks=0`, it launches one task per offer and
hands the remainder back with `refuse_seconds=0`, so the master re-offers it at once to
whichever job now has the lowest share: the task-by-task progressive filling of the DRF
paper. Unlike it, the task size follows a phase (`set_phase`) and each task sleeps a
random time drawn from a seeded generator, so runs are repeatable up to scheduling.

At a phase boundary only *new* tasks take the new size; running tasks end on their own
(they are short), as in the paper. The job also revives: refuse filters left by offers
too small for the old size must not hide offers that fit the new one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from framework_sdk import Framework, Offer, Resources, TaskSpec, TaskState, TaskStatus, new_task_id

_log = structlog.get_logger(__name__)

# How long an offer too small for a task is refused. A larger offer on the same agent
# (say, once one of its tasks ends) passes the filter at once, so this only saves the
# master from re-offering crumbs; a phase change clears it with revive().
DECLINE_SECONDS = 5.0


@dataclass(slots=True)
class JobStats:
    launched: int = 0
    finished: int = 0  # TASK_FINISHED
    failed: int = 0  # any other end (tasks killed at shutdown count here)
    rejected: int = 0  # launches the master refused
    declined: int = 0  # offers too small for a task


class PhasedJob(Framework):
    """Runs tasks of `demands[phase]` forever, one per offer, each sleeping a random
    `durations` (min, max) seconds."""

    def __init__(
        self,
        name: str,
        demands: Sequence[Resources],
        durations: tuple[float, float],
        seed: int,
    ) -> None:
        super().__init__(name=name)
        if not demands:
            raise ValueError("a job needs a demand for at least one phase")
        low, high = durations
        if not 0 < low <= high:
            raise ValueError(f"task durations must satisfy 0 < min <= max, got {durations}")
        self.demands = list(demands)
        self.durations = (low, high)
        self.phase = 0
        self.stats = JobStats()
        self._rng = random.Random(seed)
        self._subscribed = False

    @property
    def demand(self) -> Resources:
        return self.demands[self.phase]

    async def set_phase(self, phase: int) -> None:
        """From now on launch tasks of `demands[phase]`; running tasks are left alone."""
        self.phase = phase
        if self._subscribed:
            await self.revive()  # clear filters set against offers too small for the old size

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self._subscribed = True

    async def on_disconnected(self) -> None:
        self._subscribed = False

    async def on_offers(self, offers: list[Offer]) -> None:
        demand = self.demand
        for offer in offers:
            if not offer.resources.contains(demand):
                self.stats.declined += 1
                await self.decline(offer, refuse_seconds=DECLINE_SECONDS)
                continue
            seconds = self._rng.uniform(*self.durations)
            task = TaskSpec(
                task_id=new_task_id(self.name),
                command=f"sleep {seconds:.2f}",
                resources=demand,
                name=f"{self.name} phase {self.phase + 1}",
            )
            # refuse_seconds=0: the remainder goes straight back to the allocator.
            await self.launch(offer, [task], refuse_seconds=0)
            self.stats.launched += 1

    async def on_update(self, status: TaskStatus) -> None:
        if not status.state.is_terminal:
            return
        if status.state is TaskState.FINISHED:
            self.stats.finished += 1
        else:
            self.stats.failed += 1

    async def on_error(self, message: str, call_id: str) -> None:
        self.stats.rejected += 1
        _log.warning("call rejected", job=self.name, call_id=call_id, error=message)
