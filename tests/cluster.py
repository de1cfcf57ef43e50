"""A real local cluster for integration tests: master, agents and frameworks on 127.0.0.1.

Everything talks real gRPC over loopback on ports chosen by the kernel (port 0),
tasks are real subprocesses, and `LocalCluster` cleans up every process it
started, including the tasks of agents that were killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from agent import Agent, Backoff
from master.master import MasterConfig
from master.server import MasterServer
from mesolite.resources import Resources
from tests.waiting import wait_for_condition

FAST = MasterConfig(
    allocation_interval=0.2,
    offer_timeout=30.0,
    agent_heartbeat_interval=0.2,
    agent_timeout=2.0,
    framework_heartbeat_interval=1.0,
)


class AgentProcess:
    """An agent in its own OS process, so a test can kill it for real."""

    def __init__(self, process: asyncio.subprocess.Process, work_dir: Path) -> None:
        self.process = process
        self.work_dir = work_dir

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    def task_pids(self) -> list[int]:
        pids = []
        for checkpoint in self.work_dir.glob("sandboxes/*/*/task.json"):
            with contextlib.suppress(OSError, ValueError):
                pid = json.loads(checkpoint.read_text()).get("pid")
                if isinstance(pid, int):
                    pids.append(pid)
        return pids

    async def cleanup(self) -> None:
        self.kill()
        await self.process.wait()
        # Tasks run in their own sessions and outlive a SIGKILLed agent.
        for pid in self.task_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class LocalCluster:
    def __init__(self, work_dir: Path, config: MasterConfig = FAST) -> None:
        self.work_dir = work_dir
        self.config = config
        self.server = MasterServer(config, host="127.0.0.1", port=0, http_port=0)
        self.agents: list[Agent] = []
        self.agent_processes: list[AgentProcess] = []
        self._http: aiohttp.ClientSession | None = None

    @property
    def address(self) -> str:
        return self.server.grpc_address

    @property
    def master(self) -> Any:
        assert self.server.master is not None
        return self.server.master

    async def __aenter__(self) -> LocalCluster:
        await self.server.start()
        self._http = aiohttp.ClientSession()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for agent in self.agents:
            await agent.stop()
        for proc in self.agent_processes:
            await proc.cleanup()
        if self._http is not None:
            await self._http.close()
        await self.server.stop(grace=0.5)

    async def add_agent(self, resources: str, name: str | None = None) -> Agent:
        """Start an agent in this process and wait until the master has registered it."""
        name = name or f"agent{len(self.agents) + len(self.agent_processes) + 1}"
        agent = Agent(
            self.address,
            Resources.parse(resources),
            self.work_dir / name,
            hostname=name,
            kill_grace_period=1.0,
            reconnect_backoff=Backoff(initial=0.05, maximum=0.5),
            status_retry=Backoff(initial=0.2, maximum=1.0),
        )
        self.agents.append(agent)
        await agent.__aenter__()
        await asyncio.wait_for(agent.wait_registered(), 20)
        return agent

    async def spawn_agent(self, resources: str, name: str | None = None) -> AgentProcess:
        """Start `mesolite agent` as a subprocess and wait until the master lists it."""
        name = name or f"agent{len(self.agents) + len(self.agent_processes) + 1}"
        work_dir = self.work_dir / name
        work_dir.mkdir(parents=True, exist_ok=True)
        before = set(self.master.agents)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mesolite.cli",
            "agent",
            "--master",
            self.address,
            "--resources",
            resources,
            "--work-dir",
            str(work_dir),
            "--hostname",
            name,
            stdout=(work_dir / "agent.log").open("ab"),
            stderr=asyncio.subprocess.STDOUT,
        )
        proc = AgentProcess(process, work_dir)
        self.agent_processes.append(proc)
        await wait_for_condition(
            lambda: set(self.master.agents) - before != set(), what=f"agent {name} to register"
        )
        return proc

    async def state(self) -> dict[str, Any]:
        assert self._http is not None
        async with self._http.get(f"http://{self.server.http_address}/state") as response:
            response.raise_for_status()
            data: dict[str, Any] = await response.json()
            return data


def fast(**changes: Any) -> MasterConfig:
    return replace(FAST, **changes)
