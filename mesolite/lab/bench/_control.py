"""How the bench's parent steers its worker processes: commands down a pipe, answers up.

A worker (simulated agents, simulated frameworks) runs an asyncio loop; `serve` reads
the parent's commands on that loop and answers each with what its handler returns:

    ("start",)   begin (every worker is told at once: a storm starts together)
    ("mark",)    start a measurement window (counters and samples from zero)
    ("report",)  the worker's figures since the mark (a dict)
    ("stop",)    close every stream and exit
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from mesolite.stream_writer import WritableCall

Handler = Callable[[str], Any]
M = TypeVar("M")


async def serve(conn: Connection, handle: Handler) -> None:
    """Answer the parent's commands with `handle(command)` until it says "stop"."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def readable() -> None:
        while conn.poll():
            try:
                (command,) = conn.recv()
            except EOFError:  # the parent is gone
                stopped.set()
                return
            conn.send(handle(command))
            if command == "stop":
                stopped.set()
                return

    loop.add_reader(conn.fileno(), readable)
    try:
        await stopped.wait()
    finally:
        loop.remove_reader(conn.fileno())


class WorkerGroup(abc.ABC):
    """What a worker process runs (its agents or its frameworks), steered by commands."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    @abc.abstractmethod
    def start(self) -> None:
        """Start every member (its tasks go in `self.tasks`)."""

    @abc.abstractmethod
    def mark(self) -> None:
        """Start counting from zero."""

    @abc.abstractmethod
    def report(self) -> dict[str, Any]:
        """What happened since the mark."""

    def handle(self, command: str) -> Any:
        if command == "start":
            self.start()
        elif command == "mark":
            self.mark()
        elif command == "report":
            return self.report()
        elif command == "stop":
            for task in self.tasks:
                task.cancel()
        else:
            raise ValueError(f"unknown command {command!r}")
        return True


def run_worker(conn: Connection, group: Callable[[], WorkerGroup]) -> None:
    """A worker process's body: make the group, then serve the parent's commands."""
    conn.send("ready")

    async def main() -> None:
        members = group()
        await serve(conn, members.handle)
        for task in members.tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*members.tasks, return_exceptions=True)

    asyncio.run(main())


class Outbox(Generic[M]):
    """One stream's messages, written by one writer; all that wait in one batch when
    the master reads batches (`wrap` makes the batch message)."""

    def __init__(self, wrap: Callable[[list[M]], M]) -> None:
        self._messages: list[M] = []
        self._wake = asyncio.Event()
        self._wrap = wrap
        self.batches = False

    def send(self, message: M) -> None:
        self._messages.append(message)
        self._wake.set()

    async def write(self, call: WritableCall[M]) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            messages, self._messages = self._messages, []
            if self.batches and len(messages) > 1:
                messages = [self._wrap(messages)]
            for message in messages:
                await call.write(message)


def percentiles(samples: list[float], points: tuple[float, ...] = (0.5, 0.95)) -> list[float]:
    """The samples' percentiles (nearest rank); NaN for none."""
    if not samples:
        return [float("nan")] * len(points)
    ordered = sorted(samples)
    return [ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in points]
