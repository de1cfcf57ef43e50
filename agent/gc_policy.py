"""When the agent removes the sandboxes of ended tasks: the policy, pure.

As Mesos' agent garbage collection (`--gc_delay`, `--gc_disk_headroom`,
`--disk_watch_interval`): a task's sandbox (and the agent's records of it) is
kept for a while after the task ended, so its output can still be read, and
removed once it is older than the *allowed age*, which shrinks as the disk fills:

    allowed age = delay x max(0, (watermark - usage) / watermark)

where `usage` is the used fraction of the filesystem holding the agent's work
dir. On an empty disk the allowed age is `delay` (`--gc-delay`, default a week,
as Mesos); it falls linearly to 0 as usage reaches `watermark`
(`--disk-watermark-gc`, default 0.9), and from there every ended task's sandbox
is removed at the next pass. Mesos computes `delay x max(0, 1 - headroom - usage)`
(its `--gc_disk_headroom` is 1 - watermark), so there `--gc_delay` is never
reached; mesolite scales it to be the age on an empty disk.

A sandbox's age is counted from when it was last written as its task ended (the
modification time of the sandbox, which the agent sets as the task ends, or of its
records, read from the disk at every pass), so a
restarted agent goes on where it left off. A sandbox whose task is live (running,
or ended with its end not yet acknowledged, which a restarted agent reports from
its records) is never removed, whatever its age or the disk.

`plan` decides one pass: data in, decisions out, no I/O and no clock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

TaskKey = tuple[str, str]  # (framework id, task id)

WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class GcConfig:
    """`delay`: the allowed age on an empty disk (seconds); `disk_watermark`: the used
    fraction of the work dir's filesystem at which every ended sandbox goes;
    `interval`: the longest time between two passes (disk usage is read at each)."""

    delay: float = WEEK
    disk_watermark: float = 0.9
    interval: float = 60.0

    def __post_init__(self) -> None:
        if not self.delay >= 0:
            raise ValueError(f"the gc delay must be 0 or more seconds, got {self.delay!r}")
        if not 0 < self.disk_watermark <= 1:
            raise ValueError(
                f"the disk watermark must be a fraction in (0, 1], got {self.disk_watermark!r}"
            )
        if not self.interval > 0:
            raise ValueError(f"the gc interval must be positive, got {self.interval!r}")


@dataclass(frozen=True, slots=True)
class EndedSandbox:
    """A task's sandbox on disk, and when it was last written (wall-clock seconds)."""

    key: TaskKey
    written_at: float


@dataclass(frozen=True, slots=True)
class GcPlan:
    """One pass's decisions: what to remove (oldest first), the age allowed now, and
    how long until the next pass should run (seconds)."""

    remove: tuple[EndedSandbox, ...]
    allowed_age: float
    next_pass: float


def allowed_age(config: GcConfig, disk_usage: float) -> float:
    """How old an ended task's sandbox may grow at this disk usage (a fraction)."""
    usage = min(max(disk_usage, 0.0), 1.0)
    room = max(0.0, (config.disk_watermark - usage) / config.disk_watermark)
    return config.delay * room


def plan(
    sandboxes: Iterable[EndedSandbox],
    live: Set[TaskKey],
    now: float,
    disk_usage: float,
    config: GcConfig,
) -> GcPlan:
    """What one pass removes: every sandbox of a task that is not live and is at least
    as old as the allowed age; and when the next one comes due, at the latest after
    `config.interval`."""
    limit = allowed_age(config, disk_usage)
    remove: list[EndedSandbox] = []
    next_pass = config.interval
    for sandbox in sandboxes:
        if sandbox.key in live:
            continue
        age = max(now - sandbox.written_at, 0.0)  # written "in the future": the clock went back
        if age >= limit:
            remove.append(sandbox)
        else:
            next_pass = min(next_pass, limit - age)
    remove.sort(key=lambda s: s.written_at)
    return GcPlan(tuple(remove), limit, next_pass)


__all__ = ["WEEK", "EndedSandbox", "GcConfig", "GcPlan", "TaskKey", "allowed_age", "plan"]
