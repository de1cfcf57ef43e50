"""A process's CPU time and resident memory, read from /proc (Linux)."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used so far, user and system (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes(pid: int) -> int:
    """The process's resident memory now."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def cpu_count() -> int:
    return os.cpu_count() or 1
