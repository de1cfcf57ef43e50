"""Profiling the master while the bench loads it: py-spy, summarised as top frames.

`Profiler` runs `py-spy record --format raw` on the master's pid for the measured
window (py-spy is not a dependency: give its path with `--py-spy`, or have it on PATH);
`summarise` reads the collapsed stacks it wrote and returns the frames where the
samples were (self) and the frames under which they were (total), each with its share.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path


class Profiler:
    def __init__(self, py_spy: str, pid: int, seconds: float, out: Path) -> None:
        self.out = out
        self._process = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait(self) -> None:
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _frame_name(frame: str) -> str:
    """`function (path/to/module.py:LINE)` -> `module.py:function` (lines merged)."""
    function, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{short}:{function}"


def summarise(path: Path, top: int = 15) -> list[str]:
    """Lines: the `top` frames by self samples and by total samples, with their shares."""
    if not path.exists():
        return [f"(no profile: py-spy wrote no {path})"]
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";")[1:]]  # [0] is the thread
        if not frames:
            continue
        samples += count
        self_counts[frames[-1]] += count
        for name in set(frames):
            total_counts[name] += count
    if not samples:
        return ["(no samples)"]
    lines = [f"{samples} samples; self (where the time is spent):"]
    lines += [f"  {n / samples:6.1%}  {name}" for name, n in self_counts.most_common(top)]
    lines.append("total (time under each frame):")
    lines += [f"  {n / samples:6.1%}  {name}" for name, n in total_counts.most_common(top)]
    return lines
