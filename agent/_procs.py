"""Processes the agent did not necessarily start: naming them safely and waiting for them.

A pid alone does not name a process for long: once it is reaped, the kernel may
hand the number to another one. A restarted agent therefore checks a task
wrapper's pid together with its start time (field 22 of /proc/<pid>/stat, in
clock ticks since boot), which a reused pid cannot match.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_POLL_INTERVAL = 0.5  # only when pidfds are unavailable


def process_start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot; None if no live process has that pid.

    A zombie counts as gone: it has ended, only its exit status waits to be reaped.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces or ')'.
    fields = stat.rsplit(b")", 1)[1].split()
    state, start_time = fields[0], fields[19]  # fields 3 and 22
    if state in (b"Z", b"X"):
        return None
    return int(start_time)


def is_alive(pid: int, start_time: int) -> bool:
    """True while the very process that had `start_time` is running (not a zombie)."""
    return process_start_time(pid) == start_time


async def wait_for_exit(pid: int, start_time: int) -> None:
    """Return once the process (`pid`, `start_time`) has ended; it need not be our child.

    Uses a pidfd (Linux 5.3+), which becomes readable when the process exits;
    where pidfds are not available, polls /proc.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError as e:  # e.g. an older kernel or a seccomp filter
        log.info("pidfd_open unavailable; polling", pid=pid, error=str(e))
        # Nothing to wait on but time: no pidfd, and not our child.
        while is_alive(pid, start_time):  # noqa: ASYNC110
            await asyncio.sleep(_POLL_INTERVAL)
        return
    try:
        # Checked after opening: the pidfd then names this very process, or the
        # pid had already been reused and the start times differ.
        if not is_alive(pid, start_time):
            return
        await wait_readable(fd)
    finally:
        os.close(fd)


async def wait_readable(fd: int) -> None:
    """Wait on the event loop until `fd` is readable (data, end of file or, for a pidfd, exit)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await readable
    finally:
        loop.remove_reader(fd)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to process group `pgid`; a group that is gone already is fine."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        log.warning("not allowed to signal process group", pgid=pgid, signal=sig.name)


def find_process(argv_prefix: list[str]) -> int | None:
    """The pid of a live process whose command line starts with `argv_prefix`, if any.

    Reads every /proc/<pid>/cmdline: O(processes), for rare recovery paths only.
    """
    wanted = [a.encode() for a in argv_prefix]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if argv[: len(wanted)] == wanted:
            return int(entry.name)
    return None
