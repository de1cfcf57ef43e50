"""How the bench's parent steers its worker processes: commands down a pipe, answers up.

A worker (simulated agents, simulated frameworks) runs an asyncio loop; `serve` reads
the parent's commands on that loop and answers each with what its handler returns:

    ("start",)   begin (every worker is told at once: a storm starts together)
    ("mark",)    start a measurement window (counters and samples from zero)
    ("report",)  the worker's figures since the mark (a dict)
    ("stop",)    close every stream and exit
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

Handler = Callable[[str], Any]


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


def percentiles(samples: list[float], points: tuple[float, ...] = (0.5, 0.95)) -> list[float]:
    """The samples' percentiles (nearest rank); NaN for none."""
    if not samples:
        return [float("nan")] * len(points)
    ordered = sorted(samples)
    return [ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in points]
