"""The master core's effects, behind small interfaces injected at construction.

The core (`master/core.py` and its handlers) decides; these carry its
decisions out: timers that call it back, peers it sends messages to, the
registry it writes before acknowledging, and the clocks it reads. The process
shell (`master/server.py`) injects the real ones; unit tests inject
`tests/support/fakes.py`'s, and drive the core with no network and no event
loop, in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from mesolite.master.registry import AgentEntry, FrameworkEntry, TaskEntry
from mesolite.model import TaskSpec
from mesolite.resources import Resources

T_contra = TypeVar("T_contra", contravariant=True)

Clock = Callable[[], float]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """Calls `callback(*args)` after `delay` seconds (of the core's monotonic clock)."""

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Cancellable: ...


class Peer(Protocol[T_contra]):
    """A connected agent or framework: messages queued for it, in order (in the process,
    the stream's `StreamWriter`, `mesolite/stream_writer.py`)."""

    def send(self, message: T_contra) -> None: ...

    def close(self, reason: str = "") -> None: ...


class RegistryStore(Protocol):
    """What the master must not forget across a restart: in SQLite (`master/registry.py`,
    the default) or in etcd (`master/etcd_registry.py`, for highly available masters).

    Changes are made synchronously by the core; `durable()` returns once every change
    made before it is stored, and what acknowledges a change is sent only after it."""

    write_observer: Callable[[float], None]  # told each write's duration (seconds)

    def add_framework(self, entry: FrameworkEntry) -> None: ...
    def mark_framework_removing(self, framework_id: str) -> None: ...
    def remove_framework(self, framework_id: str) -> None: ...
    def frameworks(self) -> list[FrameworkEntry]: ...
    def admit_agent(
        self,
        agent_id: str,
        hostname: str,
        total: Resources,
        now: float,
        principal: str | None = None,
    ) -> None: ...
    def remove_agent(self, agent_id: str, now: float) -> None: ...
    def forget_removed_agent(self, agent_id: str) -> None: ...
    def agents(self) -> list[AgentEntry]: ...
    def add_tasks(self, framework_id: str, agent_id: str, tasks: list[TaskSpec]) -> None: ...
    def remove_task(self, framework_id: str, task_id: str) -> None: ...
    def tasks(self) -> list[TaskEntry]: ...
    def flush(self) -> None:
        """Start committing every change made so far (SQLite: commits them at once)."""

    async def durable(self) -> None:
        """Return once every change made before the call is stored (raises if it cannot be)."""

    def defer_commits(self, schedule: Callable[[Callable[[], None]], object]) -> None:
        """Keep changes until `flush()`, which `schedule` is asked to run soon."""

    def close(self) -> None: ...


class AsyncioTimers:
    """Timers on an asyncio event loop (its clock is `time.monotonic`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Cancellable:
        return self._loop.call_later(delay, callback, *args)
