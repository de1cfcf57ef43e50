"""Unmodified pymesos 0.3.15 schedulers (tests/support/pymesos_scheduler.py, run in the venv
of scripts/pymesos_venv.py), driven from tests: `Scheduler` starts one and records every
event it prints."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesolite.agent import Agent

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEDULER = ROOT / "tests" / "support" / "pymesos_scheduler.py"


def pymesos_python() -> Path:
    """The pymesos venv's Python (made on first use, as `make pymesos-venv` does)."""
    venv = Path(os.environ.get("MESOLITE_PYMESOS_VENV", ROOT / ".venv-pymesos"))
    python = venv / "bin" / "python"
    if not python.exists():
        script = ROOT / "scripts" / "pymesos_venv.py"
        subprocess.run([sys.executable, str(script), str(venv)], check=True)
    return python


def pending(agent: Agent) -> int:
    """Updates the agent still retries, unacknowledged."""
    return len(agent._reporter)


@dataclass
class Scheduler:
    """One pymesos scheduler process and everything it printed."""

    process: asyncio.subprocess.Process
    events: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, master: str, *args: str) -> Scheduler:
        process = await asyncio.create_subprocess_exec(
            str(pymesos_python()),
            str(SCHEDULER),
            "--master",
            master,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        scheduler = cls(process)
        scheduler.reader = asyncio.create_task(scheduler._read())
        return scheduler

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def states(self, task_id: str) -> list[str]:
        return [e["state"] for e in self.of("update") if e["task_id"] == task_id]

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def stop(self) -> int:
        """Tear down (pymesos' driver.stop() sends TEARDOWN) and wait for the exit."""
        if self.process.returncode is None:
            with_stdin = self.process.stdin is not None and not self.process.stdin.is_closing()
            if with_stdin:
                await self.send("stop")
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.reader is not None:
            await self.reader
        return self.process.returncode or 0
