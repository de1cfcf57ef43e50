"""What an agent offers when it is not told (`--resources`): Mesos' defaults.

* cpus: every CPU the OS reports (`os.cpu_count()`).
* mem: total memory in MB (/proc/meminfo, else sysconf) less what the OS keeps:
  1 GB when there are at least 2 GB, otherwise half of it.
* disk: total size in MB of the file system holding the work dir less 5 GB when
  it has at least 10 GB, otherwise half of it. Like Mesos, this counts the
  file system's size, not its free space.

Names given explicitly win; only the missing ones are detected.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mesolite.resources import Resources

_MB = 1024 * 1024
_GB = 1024 * _MB


def detect_resources(work_dir: str | os.PathLike[str], given: Resources | None = None) -> Resources:
    """`given` completed with detected cpus, mem and disk where it lacks them."""
    amounts = dict(given or {})
    if "cpus" not in amounts:
        amounts["cpus"] = float(os.cpu_count() or 1)
    if "mem" not in amounts:
        amounts["mem"] = usable_mb(total_memory_bytes(), reserve=_GB, threshold=2 * _GB)
    if "disk" not in amounts:
        total_disk = shutil.disk_usage(_existing_ancestor(Path(work_dir))).total
        amounts["disk"] = usable_mb(total_disk, reserve=5 * _GB, threshold=10 * _GB)
    return Resources(amounts)


def usable_mb(total_bytes: int, *, reserve: int, threshold: int) -> float:
    """Whole MB left after keeping `reserve` bytes back, or half when below `threshold`."""
    usable = total_bytes - reserve if total_bytes >= threshold else total_bytes // 2
    return float(usable // _MB)


def total_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _existing_ancestor(path: Path) -> Path:
    # The work dir may not exist before the agent's first start.
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
