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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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
    _by_task: dict[str, Slot] = field(default_factory=dict, repr=False)
    version: int = 0  # counts changes, so readers can cache what they derive

    def __post_init__(self) -> None:
        self._by_task = {s.task_id: s for s in self.slots if s.state.live}

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
        return all(s.state.done for s in self.slots)

    @property
    def succeeded(self) -> bool:
        return self.finished and all(s.state is not SlotState.FAILED for s in self.slots)

    def live_task_ids(self) -> list[str]:
        return [s.task_id for s in self.slots if s.state.live]

    def counters(self) -> dict[str, int]:
        """What the progress keeps besides its slots, for the store."""
        return {}

    # What happened ---------------------------------------------------------------------

    def launched(self, slot: Slot, task_id: str) -> None:
        """A task for `slot` is about to be launched (record it before sending it)."""
        assert slot.state is SlotState.PENDING, slot
        self.version += 1
        self._by_task.pop(slot.task_id, None)
        slot.state = SlotState.LAUNCHING
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
        self.version += 1
        del self._by_task[task_id]
        slot.state = SlotState.PENDING
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
            self.version += 1
            slot.state = SlotState.RUNNING
            slot.started_at = now
            return slot
        self.version += 1
        del self._by_task[task_id]
        slot.last_end = state.value + ("" if exit_code is None else f" exit {exit_code}")
        self._ended(slot, state, now)
        return slot

    def lose_all(self) -> list[Slot]:
        """The framework is gone, and its tasks with it (the master forgot it): every live
        slot is pending again, no attempt used. Returns the slots changed."""
        self.version += 1
        changed = []
        for slot in self.slots:
            if slot.state.live:
                slot.state = SlotState.PENDING
                slot.last_end = "lost with the workload's framework"
                changed.append(slot)
        self._by_task.clear()
        return changed

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        raise NotImplementedError


@dataclass(slots=True)
class JobProgress(Progress):
    spec: JobSpec

    def launchable(self, now: float) -> list[Slot]:
        room = self.spec.parallelism - sum(s.state.live for s in self.slots)
        if room <= 0:
            return []
        return [s for s in self.slots if s.state is SlotState.PENDING][:room]

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        if state is TaskState.FINISHED:
            slot.state = SlotState.SUCCEEDED
            return
        never_ran = slot.state is SlotState.LAUNCHING and state in _NEVER_RAN
        if not never_ran:
            slot.failures += 1
        slot.state = SlotState.FAILED if slot.failures > self.spec.retries else SlotState.PENDING

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
        return [s for s in self.slots if s.state is SlotState.PENDING and s.not_before <= now]

    def next_wakeup(self, now: float) -> float | None:
        waiting = [
            s.not_before for s in self.slots if s.state is SlotState.PENDING and s.not_before > now
        ]
        return min(waiting, default=None)

    def counters(self) -> dict[str, int]:
        return {"restarts": self.restarts, "streak": self.streak}

    def _ended(self, slot: Slot, state: TaskState, now: float) -> None:
        restart = self.spec.restart
        if restart.policy is RestartPolicy.ON_FAILURE and state is TaskState.FINISHED:
            slot.state = SlotState.EXITED
            return
        if slot.started_at is not None and now - slot.started_at >= restart.max_backoff:
            self.streak = 0
        slot.state = SlotState.PENDING
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


def tally(slots: Iterable[Slot]) -> dict[SlotState, int]:
    """Slots per state (every state present, zeros included)."""
    counts = dict.fromkeys(SlotState, 0)
    for slot in slots:
        counts[slot.state] += 1
    return counts
