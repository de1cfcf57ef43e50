"""The pymesos idle check's run, in a process of its own for the whole test session.

Issue 17 asks that one long task keep a pymesos scheduler's calls connection idle
for over 100 s without losing the subscription. Waiting 100 s inside its test
would add 100 s to every run of the suite, so `tests/conftest.py` starts this
run as soon as the test is collected (`start`), it goes on beside the other
tests, and the test (`tests/test_mesos_pymesos.py`) only reads its report. Real
parts as in the test module: a master and an agent on loopback (`LocalCluster`),
an unmodified pymesos scheduler in its own venv.

    python -m tests.support.pymesos_idle WORK_DIR

writes `WORK_DIR/report.json` when the task has ended and its end was
acknowledged (or when a wait timed out: `error` says which), then exits. It
also exits, tearing everything down, when its standard input closes (the test
session ended or died), so it never outlives the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IDLE_SECONDS = 105.0  # the long task's length: the calls connection idles that long
REPORT = "report.json"


def start(work_dir: Path) -> subprocess.Popen[bytes]:
    """Start the run (from the project root, with this Python)."""
    from tests.support.pymesos_runs import ROOT, pymesos_python

    pymesos_python()  # made here if missing, not inside the run's own time
    work_dir.mkdir(parents=True, exist_ok=True)
    log = (work_dir / "run.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.pymesos_idle", str(work_dir)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """End the run if it is still going (closing its stdin asks it to), and reap it."""
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _run(work_dir: Path) -> dict[str, Any]:
    from tests.cluster import LocalCluster
    from tests.support.pymesos_runs import Scheduler, pending
    from tests.waiting import wait_for_condition

    async with LocalCluster(work_dir / "cluster") as cluster:
        await cluster.add_agent("cpus:2;mem:256")
        scheduler = await Scheduler.start(
            cluster.server.http_address,
            "--name", "idle", "--tasks", "1", "--cpus", "1", "--mem", "64",
            "--command", f"sleep {IDLE_SECONDS:g}", "--refuse-seconds", "1000",
        )  # fmt: skip
        report: dict[str, Any] = {"error": None}
        try:
            try:
                await wait_for_condition(
                    lambda: "TASK_RUNNING" in scheduler.states("idle-1"), timeout=60
                )
                started = time.monotonic()
                await wait_for_condition(
                    lambda: "TASK_FINISHED" in scheduler.states("idle-1"),
                    timeout=IDLE_SECONDS + 60,
                    what="the long task's end",
                )
                report["idle_for"] = time.monotonic() - started
                # Acknowledged on the connection that had idled all along: pymesos would
                # have raised on a closed one, and the agent would still retry the update.
                await wait_for_condition(
                    lambda: pending(cluster.agents[0]) == 0, timeout=10, what="acknowledged"
                )
            except TimeoutError as e:
                report["error"] = str(e)
            report["heartbeat_interval"] = cluster.master.config.framework_heartbeat_interval
            report["events"] = list(scheduler.events)  # before the teardown's own
        finally:
            await scheduler.stop()
        return report


async def _main(work_dir: Path) -> None:
    run = asyncio.create_task(_run(work_dir))
    # Standard input closing (the session is over) ends the run early.
    stdin = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    closed = asyncio.create_task(stdin.read())
    await asyncio.wait({run, closed}, return_when=asyncio.FIRST_COMPLETED)
    closed.cancel()
    if not run.done():
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        return
    (work_dir / REPORT).write_text(json.dumps(run.result()))


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1])))
