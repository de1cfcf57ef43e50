"""A real local cluster for integration tests: master, agents and frameworks on 127.0.0.1.

Everything talks real gRPC over loopback on ports chosen by the kernel (port 0),
tasks are real subprocesses, and `LocalCluster` cleans up every process it
started, including the tasks of agents that were killed with SIGKILL.

`LocalCluster(..., certs=DIR)` runs it with TLS and authentication, from a
directory `mesolite.certs.init_cluster` wrote: the master, its agents (and their
sandbox servers) and `state()` use the bundles `master`, `agent` and `admin`.

`LocalCluster(..., workloads=True)` runs the master's built-in job and service
frameworks beside it, as `mesolite master` does (`cluster.runner`, store under the
master's work dir; the bundle `workloads` with TLS); `restart_workloads()` replaces
the runner with a new one that knows only what the store says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from mesolite.agent import Agent, AgentConfig, Backoff, GcConfig
from mesolite.agent._procs import is_alive
from mesolite.agent.isolation import Container, IsolationConfig
from mesolite.agent.sandbox_http import SandboxServer
from mesolite.framework_sdk import ConnectionConfig
from mesolite.master.master import MasterConfig
from mesolite.master.server import MasterServer
from mesolite.resources import Resources
from mesolite.tls import TlsConfig
from mesolite.workloads import RunnerConfig, WorkloadRunner
from mesolite.workloads import http as workloads_http
from mesolite.workloads.framework import WorkloadFramework
from tests.support.cgroups import TEST_CGROUPS_ROOT, TEST_ISOLATION
from tests.support.checkpoints import all_checkpoints
from tests.waiting import wait_for_condition

# Agents heartbeat every 0.2 s, and a master that hears nothing from one for
# 30 s removes it: far longer than a loaded machine ever stalls the test's event
# loop (where the master, and often the agent, run). A test that wants a silent
# agent removed skips the master's clock ahead (`LocalCluster.time_out_agents`)
# instead of waiting 30 s.
FAST = MasterConfig(
    allocation_interval=0.2,
    offer_timeout=30.0,
    agent_heartbeat_interval=0.2,
    agent_timeout=30.0,
    framework_heartbeat_interval=1.0,
    check_invariants=True,
)


# The built-in workload frameworks reconnect fast: tests restart masters and runners.
FAST_RECONNECT = ConnectionConfig(reconnect_initial=0.05, reconnect_max=0.5)


class AgentProcess:
    """An agent in its own OS process, so a test can kill it for real."""

    def __init__(self, process: asyncio.subprocess.Process, work_dir: Path) -> None:
        self.process = process
        self.work_dir = work_dir

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    def checkpoints(self) -> list[dict[str, Any]]:
        """The checkpoint of every task of this agent (its task log)."""
        with contextlib.suppress(OSError, ValueError):
            return all_checkpoints(self.work_dir)
        return []

    def task_pids(self) -> list[int]:
        """Task process groups still alive (checked by start time: pids get reused)."""
        pids = []
        for record in self.checkpoints():
            pid, started = record.get("pid"), record.get("pid_start_time")
            if isinstance(pid, int) and isinstance(started, int) and is_alive(pid, started):
                pids.append(pid)
        return pids

    async def cleanup(self) -> None:
        self.kill()
        await self.process.wait()
        # Tasks run in their own sessions and cgroups and outlive a SIGKILLed agent.
        for record in self.checkpoints():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                container = Container.from_record(record["container"])
                await asyncio.to_thread(container.kill, None)
                await asyncio.to_thread(container.clean_up)
        for pid in self.task_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class SkippingClock:
    """The master's clock in tests: monotonic time, plus the time a test skipped."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped


class LocalCluster:
    def __init__(
        self,
        work_dir: Path,
        config: MasterConfig = FAST,
        *,
        certs: Path | None = None,
        token_port: bool = False,
        workloads: bool = False,
    ) -> None:
        self.work_dir = work_dir
        if config.work_dir is None:  # the registry lives here, across master restarts
            config = replace(config, work_dir=work_dir / "master")
        self.certs = certs
        if certs is not None:
            credentials = certs / "credentials"
            config = replace(
                config,
                tls=self.bundle("master"),
                credentials_file=credentials if credentials.exists() else None,
            )
        self.config = config
        self.clock = SkippingClock()
        self.runner: WorkloadRunner | None = None
        self._workloads = workloads
        self.server = MasterServer(
            config,
            host="127.0.0.1",
            port=0,
            http_port=0,
            clock=self.clock,
            token_port=0 if token_port else None,
            routes=workloads_http.routes(lambda: self.runner),
            workloads=lambda: self.runner.views() if self.runner else ((), ()),
        )
        self.agents: list[Agent] = []
        self.agent_processes: list[AgentProcess] = []
        self.sandbox_servers: list[SandboxServer] = []  # one per in-process agent
        self._http: aiohttp.ClientSession | None = None

    @property
    def address(self) -> str:
        return self.server.grpc_address

    def bundle(self, name: str) -> TlsConfig:
        """The TLS bundle of principal `name` (a cluster made with `certs=`)."""
        assert self.certs is not None, "a cluster without TLS has no bundles"
        return TlsConfig.from_dir(self.certs / name)

    def _tls(self, name: str) -> TlsConfig | None:
        return self.bundle(name) if self.certs is not None else None

    @property
    def master(self) -> Any:
        assert self.server.master is not None
        return self.server.master

    async def __aenter__(self) -> LocalCluster:
        await self.server.start()
        self._http = aiohttp.ClientSession()
        if self._workloads:
            await self.start_workloads()
        return self

    async def start_workloads(self) -> WorkloadRunner:
        """The built-in job and service frameworks, from the store in the master's work
        dir, connected to the master as `mesolite master` connects them."""
        assert self.config.work_dir is not None
        self.runner = WorkloadRunner(
            RunnerConfig(
                store=self.config.work_dir / "workloads.sqlite",
                tls=self._tls("workloads"),
                connection=FAST_RECONNECT,
                retry=Backoff(initial=0.1, maximum=1.0),
            )
        )
        await self.runner.start(self.address)
        return self.runner

    async def restart_workloads(self) -> WorkloadRunner:
        """The built-in frameworks' process restarted: a new runner, from the store only."""
        assert self.runner is not None
        await self.runner.close()
        self.runner = None
        return await self.start_workloads()

    def workload_framework(self, name: str) -> WorkloadFramework | None:
        """The framework running the workload `name` now (None between subscriptions)."""
        assert self.runner is not None
        workload = self.runner.workloads.get(name)
        return workload.framework if workload is not None else None

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.runner is not None:
            await self.runner.close()
        for agent in self.agents:
            await agent.stop()
        for sandboxes in self.sandbox_servers:
            await sandboxes.stop()
        for proc in self.agent_processes:
            await proc.cleanup()
        if self._http is not None:
            await self._http.close()
        violations = self.server.master.invariant_violations if self.server.master else []
        await self.server.stop(grace=0.5)
        if e is None:
            assert violations == [], violations

    async def add_agent(
        self,
        resources: str,
        name: str | None = None,
        isolation: IsolationConfig = TEST_ISOLATION,
        gc: GcConfig | None = None,
    ) -> Agent:
        """Start an agent in this process and wait until the master has registered it."""
        name = name or f"agent{len(self.agents) + len(self.agent_processes) + 1}"
        # What the web UI reads task output from.
        sandboxes = SandboxServer(self.work_dir / name, tls=self._tls("agent"))
        await sandboxes.start()
        self.sandbox_servers.append(sandboxes)
        agent = Agent(
            AgentConfig(
                self.address,
                Resources.parse(resources),
                self.work_dir / name,
                hostname=name,
                address=sandboxes.address,
                kill_grace_period=1.0,
                reconnect_backoff=Backoff(initial=0.05, maximum=0.5),
                status_retry=Backoff(initial=0.2, maximum=1.0),
                isolation=isolation,
                gc=gc or GcConfig(),
                tls=self._tls("agent"),
            )
        )
        self.agents.append(agent)
        await agent.__aenter__()
        await asyncio.wait_for(agent.wait_registered(), 20)
        return agent

    async def spawn_agent(self, resources: str, name: str | None = None) -> AgentProcess:
        """Start `mesolite agent` as a subprocess and wait until the master lists it."""
        name = name or f"agent{len(self.agents) + len(self.agent_processes) + 1}"
        work_dir = self.work_dir / name
        before = set(self.master.agents)
        flags = ("--tls-dir", str(self.certs / "agent")) if self.certs else ()
        proc = await spawn_agent_process(self.address, work_dir, resources, name, *flags)
        self.agent_processes.append(proc)
        await wait_for_condition(
            lambda: set(self.master.agents) - before != set(), what=f"agent {name} to register"
        )
        return proc

    async def time_out_agents(self, *agent_ids: str) -> None:
        """Let the agent timeout pass for these silent agents now, not in real time.

        The master's clock skips half the timeout, waits until every other agent
        has heartbeated since, then skips the other half, and waits until the
        master has removed the given agents. Only an agent silent for half the
        timeout in real time (15 s) could be removed with them. The skip moves
        every timer of the master's clock: offers, filters, failover timeouts.
        """
        others = [a for a in self.master.agents if a not in agent_ids]
        half = self.config.agent_timeout / 2
        self.clock.skipped += half
        mark = self.clock()
        await wait_for_condition(
            lambda: all(
                a not in self.master.agents or self.master.agents[a].last_seen >= mark
                for a in others
            ),
            what="the other agents to heartbeat",
        )
        self.clock.skipped += half

        def removed() -> bool:
            return all(a not in self.master.agents for a in agent_ids)

        # A heartbeat a silent agent sent just before it fell silent can land after
        # the skip (on a busy machine): then its timeout starts there; skip it again.
        for _ in range(3):
            skipped_at = self.clock()
            await wait_for_condition(
                lambda at=skipped_at: (
                    removed()
                    or any(  # type: ignore[misc]
                        a in self.master.agents and self.master.agents[a].last_seen >= at
                        for a in agent_ids
                    )
                ),
                what=f"the master to remove {', '.join(agent_ids)}",
            )
            if removed():
                return
            self.clock.skipped += self.config.agent_timeout
        raise AssertionError(f"{', '.join(agent_ids)} kept heartbeating")

    async def state(self) -> dict[str, Any]:
        assert self._http is not None
        admin = self._tls("admin")
        async with self._http.get(
            f"{self.server.http_url}/state", ssl=admin.client_context() if admin else True
        ) as response:
            response.raise_for_status()
            data: dict[str, Any] = await response.json()
            return data


def fast(**changes: Any) -> MasterConfig:
    return replace(FAST, **changes)


def free_port() -> int:
    """A port that was free a moment ago: for a master that must come back on the same port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class MasterProcess:
    """`mesolite master` in its own process, so a test can SIGKILL and restart it."""

    def __init__(self, work_dir: Path, *flags: str) -> None:
        self.work_dir = work_dir
        self.flags = flags
        self.port = free_port()
        self.http_port = free_port()
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.banner = ""  # the first line the master printed
        self.ready = b"listening on"  # what that line says once the master is up

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    async def start(self) -> None:
        self.starts += 1
        log = (self.work_dir / f"master-{self.starts}.log").open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mesolite.cli",
            "master",
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--work-dir",
            str(self.work_dir / "master"),
            "--check-invariants",
            *self.flags,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        self.banner = line.decode()
        if self.ready not in line:
            raise AssertionError(f"master did not start: {line!r}")

    def violations(self) -> list[str]:
        """Invariant violations any run of this master logged."""
        return [
            line
            for log in sorted(self.work_dir.glob("master-*.log"))
            for line in log.read_text().splitlines()
            if "invariant violated" in line
        ]

    async def kill(self) -> None:
        """SIGKILL: no goodbye, no flush."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    async def state(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(f"http://{self.http_address}/state") as response:
            response.raise_for_status()
            data: dict[str, Any] = await response.json()
            return data

    async def wait_state(
        self,
        session: aiohttp.ClientSession,
        predicate: Callable[[dict[str, Any]], bool],
        what: str,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Poll /state until `predicate` holds (a master still starting is waited for)."""
        state: dict[str, Any] = {}

        async def check() -> bool:
            nonlocal state
            try:
                state = await self.state(session)
            except aiohttp.ClientError:
                return False
            return bool(predicate(state))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await check():
            if loop.time() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what}; state {state}"
                )
            await asyncio.sleep(0.1)
        return state


async def spawn_agent_process(
    master: str, work_dir: Path, resources: str, name: str, *flags: str
) -> AgentProcess:
    """`mesolite agent` as a subprocess (it registers on its own; callers wait for it)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesolite.cli",
        "agent",
        "--master",
        master,
        "--resources",
        resources,
        "--work-dir",
        str(work_dir),
        "--hostname",
        name,
        "--cgroups-root",
        TEST_CGROUPS_ROOT,
        *flags,
        stdout=(work_dir / "agent.log").open("ab"),
        stderr=asyncio.subprocess.STDOUT,
    )
    return AgentProcess(process, work_dir)
