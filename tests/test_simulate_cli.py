"""`mesolite simulate` as a user runs it: a subprocess, its table, its files."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

WORKLOAD = """
[cluster]
agents = [{ count = 1, resources = "cpus:4;mem:4096" }]

[[jobs]]
name = "a"
tasks = [{ resources = "cpus:1;mem:256", count = 6, duration = 4 }]

[[jobs]]
name = "b"
arrival = 1
tasks = [{ resources = "cpus:2;mem:256", count = 2, duration = 4 }]
"""


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesolite.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_writes_csv_and_figures(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD)
    out = tmp_path / "out"
    done = simulate("run", str(path), "--policy", "drf", "slots", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "vs slots" in done.stdout and "1-10" in done.stdout
    for name in (
        "drf-jobs.csv",
        "slots-samples.csv",
        "drf-shares.csv",
        "completion.png",
        "utilization.png",
        "shares.png",
    ):
        assert (out / name).stat().st_size > 0, name
    with (out / "drf-jobs.csv").open() as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert rows.keys() == {"a", "b"}
    assert all(math.isfinite(float(r["completion"])) for r in rows.values())


def test_a_bad_file_is_refused_with_its_line_and_nothing_written(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[cluster]\nagents = 3\n")
    out = tmp_path / "out"
    done = simulate("run", str(path), "--out", str(out))
    assert done.returncode == 2
    assert "w.toml:2" in done.stderr
    assert not out.exists()
