"""How far a workload has got, and what to launch next: a pure state machine.

A workload is a fixed row of **slots**: a job's indices (0 to completions - 1), a
service's instances (0 to instances - 1). Each slot runs at most one task at a time:

    PENDING ──launched──▶ LAUNCHING ──live status──▶ RUNNING
       ▲                      │                         │
       └──── its task ended (and the slot is not done) ─┘
    job:      FINISHED ─▶ SUCCEEDED;  failed more than `retries` times ─▶ FAILED
    service:  on-failure and exit 0 ─▶ EXITED;  else PENDING after a back-off

What counts as a failed attempt of a job index: every end but TASK_FINISHED, except a
task that was lost before it was ever seen alive (TASK_LOST, TASK_DROPPED, TASK_GONE
while LAUNCHING: its launch never reached an agent, or the master restarted without
it); such an index runs again without using a retry. So a command that always fails
runs exactly `retries + 1` times, and a job never retries forever.

A service replaces an instance after `Restart.delay(streak)`: the n-th end in a row
waits backoff x factor^(n-1), at most `max_backoff`; an instance that ran for
`max_backoff` seconds or longer resets the streak.

Pure: no I/O, no clock (callers pass `now`, wall-clock seconds, since slots are
persisted across restarts), no randomness (callers choose task ids). The shell
(`workloads/framework.py`) persists every slot this changes before acting on it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedSet

from mesolite.model import TaskState
from mesolite.resources import Resources
from mesolite.workloads.spec import JobSpec, RestartPolicy, ServiceSpec, WorkloadSpec

__all__ = [
    "JobProgress",
    "Progress",
    "ServiceProgress",
    "Slot",
    "SlotState",
    "fit",
    "new_progress",
    "slot_environment",
]

# Ends that say nothing about the command when the task was never seen alive.
_NEVER_RAN = frozenset({TaskState.LOST, TaskState.DROPPED, TaskState.GONE})


class SlotState(enum.StrEnum):
    PENDING = "pending"  # to be launched (a service's: not before `not_before`)
    LAUNCHING = "launching"  # its task was launched; no status seen yet
    RUNNING = "running"  # its task reported a live state
    SUCCEEDED = "succeeded"  # a job index that finished
    FAILED = "failed"  # a job index that failed retries + 1 times
    EXITED = "exited"  # a service instance that exited 0 under on-failure

    @property
    def live(self) -> bool:
        """A task may be running for the slot."""
        return self in (SlotState.LAUNCHING, SlotState.RUNNING)

    @property
    def done(self) -> bool:
        return self in (SlotState.SUCCEEDED, SlotState.FAILED, SlotState.EXITED)


@dataclass(slots=True)
class Slot:
    index: int
    state: SlotState = SlotState.PENDING
    task_id: str = ""  # the current (live) or last task
    failures: int = 0  # counted failed attempts (a job's retries used, plus the last)
    launches: int = 0  # every task launched for it
    started_at: float | None = None  # when its current task was first seen alive
    not_before: float = 0.0  # a pending service instance waits until then (back-off)
    last_end: str = ""  # how its last task ended, e.g. "TASK_FAILED exit 1"


@dataclass(slots=True)
class Progress:
    """The slots of one workload and the rules that move them (see the module docstring)."""

    spec: WorkloadSpec
    slots: list[Slot]
    version: int = 0  # counts changes, so readers can cache what they derive
    # Kept as slots move (`_move`), so that no step costs O(slots): a job may have 10,000.
    _by_task: dict[str, Slot] = field(default_factory=dict, repr=False)  # the live ones
    _pending: SortedSet = field(default_factory=SortedSet, repr=False)  # their indices
    _count: Counter[SlotState] = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        self._by_task = {s.task_id: s for s in self.slots if s.state.live}
        self._pending = SortedSet(s.index for s in self.slots if s.state is SlotState.PENDING)
        self._count = Counter(s.state for s in self.slots)

    def _move(self, slot: Slot, state: SlotState) -> None:
        self.version += 1
        self._count[slot.state] -= 1
        self._count[state] += 1
        if slot.state is SlotState.PENDING:
            self._pending.discard(slot.index)
        if state is SlotState.PENDING:
            self._pending.add(slot.index)
        slot.state = state

    def _first_pending(self, count: int) -> list[Slot]:
        return [self.slots[i] for i in self._pending.islice(0, max(count, 0))]

    def count(self, state: SlotState) -> int:
        """How many slots are in `state`."""
        return self._count[state]

    # What to do ------------------------------------------------------------------------

    def launchable(self, now: float) -> list[Slot]:
        """The slots to launch now, in index order."""
        raise NotImplementedError

    def next_wakeup(self, now: float) -> float | None:
        """When a slot that cannot be launched now may be launched (a back-off ending)."""
        return None

    @property
    def finished(self) -> bool:
        """Nothing will ever run again."""
        return sum(self._count[s] for s in SlotState if s.done) == len(self.slots)

    @property
    def succeeded(self) -> bool:
        return self.finished and self._count[SlotState.FAILED] == 0

    def live_task_ids(self) -> list[str]:
        """The tasks that may be running, by slot."""
        return [s.task_id for s in sorted(self._by_task.values(), key=lambda s: s.index)]

    def counters(self) -> dict[str, int]:
        """What the progress keeps besides its slots, for the store."""
        return {}

    # What happened ---------------------------------------------------------------------

    def launched(self, slot: Slot, task_id: str) -> None:
        """A task for `slot` is about to be launched (record it before sending it)."""
        assert slot.state is SlotState.PENDING, slot
        self._move(slot, SlotState.LAUNCHING)
        slot.task_id = task_id
        slot.launches += 1
        slot.started_at = None
        self._by_task[task_id] = slot

    def not_launched(self, task_id: str) -> Slot | None:
        """The master refused the launch of `task_id`: its slot is pending again, no
        attempt used. None if the task is not a live one of this workload."""
        slot = self._by_task.get(task_id)
        if slot is None or slot.state is not SlotState.LAUNCHING:
            return None
        del self._by_task[task_id]
        self._move(slot, SlotState.PENDING)
        slot.last_end = "launch refused by the master"
        return slot

    def update(
        self, task_id: str, state: TaskState, exit_code: int | None, now: float
    ) -> Slot | None:
        """A status of `task_id` (an update or a reconciliation answer). Returns the slot
        it changed; None for a task that is not live here (a repeat, an old task)."""
        slot = self._by_task.get(task_id)
        if slot is None:
            return None
        if not state.is_terminal:
            if state is TaskState.STAGING or slot.state is SlotState.RUNNING:
                return None  # STAGING: on its way to an agent, not yet seen alive
            self._move(slot, SlotState.RUNNING)
            slot.started_at = now
            return slot
        del self._by_task[task_id]
        slot.last_end = state.value + ("" if exit_code is None else f" exit {exit_code}")
        self._ended(slot, state, now)
        return slot

    def lose_all(self) -> list[Slot]:
        """The framework is gone, and its tasks with it (the master forgot it): every live
        slot is pending again, no attempt used. Returns the slots changed."""
        changed = sorted(self._by_task.values(), key=lambda s: s.index)
        for slot in changed:
            self._move(slot, SlotState.PENDING)
            slot.last_end = "lost with the workload's framework"
        self._by_task.clear()
        return changed

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        raise NotImplementedError


@dataclass(slots=True)
class JobProgress(Progress):
    spec: JobSpec

    def launchable(self, now: float) -> list[Slot]:
        return self._first_pending(self.spec.parallelism - len(self._by_task))

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        if state is TaskState.FINISHED:
            self._move(slot, SlotState.SUCCEEDED)
            return
        never_ran = slot.state is SlotState.LAUNCHING and state in _NEVER_RAN
        if not never_ran:
            slot.failures += 1
        failed = slot.failures > self.spec.retries
        self._move(slot, SlotState.FAILED if failed else SlotState.PENDING)

    @property
    def attempts_retried(self) -> int:
        """Retries used so far, over all indices."""
        return sum(min(s.failures, self.spec.retries) for s in self.slots)


@dataclass(slots=True)
class ServiceProgress(Progress):
    spec: ServiceSpec
    restarts: int = 0  # instances replaced, ever
    streak: int = 0  # instance ends in a row (back-off)

    def launchable(self, now: float) -> list[Slot]:
        pending = self._first_pending(len(self._pending))
        return [s for s in pending if s.not_before <= now]

    def next_wakeup(self, now: float) -> float | None:
        pending = self._first_pending(len(self._pending))
        return min((s.not_before for s in pending if s.not_before > now), default=None)

    def counters(self) -> dict[str, int]:
        return {"restarts": self.restarts, "streak": self.streak}

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        restart = self.spec.restart
        if restart.policy is RestartPolicy.ON_FAILURE and state is TaskState.FINISHED:
            self._move(slot, SlotState.EXITED)
            return
        if slot.started_at is not None and now - slot.started_at >= restart.max_backoff:
            self.streak = 0
        self._move(slot, SlotState.PENDING)
        slot.not_before = now + restart.delay(self.streak)
        self.streak += 1
        self.restarts += 1


def new_progress(
    spec: WorkloadSpec,
    slots: Sequence[Slot] | None = None,
    counters: Mapping[str, int] | None = None,
) -> Progress:
    """The progress of `spec`: from scratch, or from stored `slots` and `counters`."""
    size = spec.completions if isinstance(spec, JobSpec) else spec.instances
    rows = list(slots) if slots is not None else [Slot(i) for i in range(size)]
    if [s.index for s in rows] != list(range(size)):
        raise ValueError(f"{spec.name}: expected slots 0 to {size - 1}")
    if isinstance(spec, JobSpec):
        return JobProgress(spec, rows)
    counters = counters or {}
    return ServiceProgress(
        spec, rows, restarts=counters.get("restarts", 0), streak=counters.get("streak", 0)
    )


def slot_environment(spec: WorkloadSpec, slot: Slot) -> dict[str, str]:
    """The variables a slot's task gets: the file's `env`, then mesolite's own."""
    env = dict(spec.env)
    env["MESOLITE_WORKLOAD"] = spec.name
    if isinstance(spec, JobSpec):
        env["MESOLITE_JOB_INDEX"] = str(slot.index)
        env["MESOLITE_JOB_ATTEMPT"] = str(slot.failures)
        env["MESOLITE_JOB_COMPLETIONS"] = str(spec.completions)
    else:
        env["MESOLITE_SERVICE_INSTANCE"] = str(slot.index)
    return env


def fit(free: Resources, each: Resources, wanted: int) -> int:
    """How many tasks of `each` fit in `free`, up to `wanted`."""
    count = 0
    while count < wanted and free.contains(each):
        free = free - each
        count += 1
    return count
