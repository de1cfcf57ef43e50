"""`mesolite bench` runs: a tiny throughput run and a tiny agents run, against this tree.

A smoke test of the load generator (it is a benchmark, not a timed test): every part
starts, tasks go through, the table is printed, nothing is left running.
"""

from __future__ import annotations

import re

import pytest

from mesolite.cli import main as cli_main
from mesolite.lab.bench import main
from mesolite.lab.bench._runner import offer_latencies

pytestmark = pytest.mark.integration


def test_throughput_runs_tasks_through_the_master(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["throughput", "--agents", "2", "--frameworks", "1", "--warmup", "0.5"]
    assert main([*args, "--duration", "2", "--task", "cpus:1;mem:32"]) == 0
    out = capsys.readouterr().out
    tasks = re.search(r"tasks/s\s+([\d,]+)", out)
    assert tasks is not None and int(tasks.group(1).replace(",", "")) > 0, out
    assert "master CPU" in out and "offer latency" in out


def test_agents_registers_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["agents", "--agents", "20", "--agent-procs", "2", "--settle", "0", "--idle", "1"]
    assert main([*args, "--state-requests", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"storm: refused or reset\s+0\b", out), out
    assert "GET /state" in out


def test_the_cli_hands_bench_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["bench", "--help"])
    assert done.value.code == 0
    assert "usage: mesolite bench" in capsys.readouterr().out


def test_an_offer_covers_the_ends_on_its_agent_since_the_last_one() -> None:
    freed = [("a", 1.0), ("a", 1.5), ("b", 2.0), ("a", 4.0)]
    offered = [("a", 3.0), ("b", 2.5), ("a", 3.5), ("a", 4.25), ("c", 5.0)]
    # a at 3.0: ends 1.0 and 1.5 (oldest 1.0); b at 2.5: 2.0; a at 3.5: nothing new;
    # a at 4.25: 4.0; c: never freed anything.
    assert offer_latencies(freed, offered) == [0.5, 2.0, 0.25]
