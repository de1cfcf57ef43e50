"""The SDK's promise after every (re)subscription: the framework hears of every task the
master knows for it before it is handed any offer (docs/framework-guide.md, "Callback
order"), so a framework written the obvious way, "launch on offers until N are live",
never launches twice: restarted with its id file (its process killed), and across a
master restart (both killed), it ends with exactly N live tasks.

The framework is `examples/keep_running.py`, as it is; its process dies as a crash
would (the run task cancelled: no stop(), no teardown, the stream just goes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from examples.keep_running import KeepRunning
from mesolite.framework_sdk import ConnectionConfig, Offer, Resources, TaskState
from tests.cluster import AgentProcess, LocalCluster, MasterProcess, spawn_agent_process
from tests.tcp_proxy import TcpProxy
from tests.waiting import wait_for_condition

N = 3
INSTANCE = Resources(cpus=0.1, mem=32)
FAST = ConnectionConfig(reconnect_initial=0.05, reconnect_max=0.5)


class Service(KeepRunning):
    """The example, counting what it did with each batch of offers."""

    def __init__(self, id_file: Path) -> None:
        # failover_timeout given, so that the same test runs on an SDK without its default.
        super().__init__(
            "service", N, "sleep 600", INSTANCE, id_file, failover_timeout=120, connection=FAST
        )
        self.offer_rounds = 0
        self.launched = 0  # tasks this process launched

    async def on_offers(self, offers: list[Offer]) -> None:
        before = len(self.live)
        await super().on_offers(offers)
        self.launched += len(self.live) - before
        self.offer_rounds += 1


def running_here(service: Service) -> list[str]:
    return sorted(t for t, s in service.live.items() if s is TaskState.RUNNING)


@contextlib.asynccontextmanager
async def started(service: Service, master: str) -> AsyncIterator[asyncio.Task[None]]:
    run = asyncio.create_task(service.run(master))
    try:
        yield run
    finally:
        await crash(run)


async def crash(run: asyncio.Task[None]) -> None:
    """As the process dying: no stop(), no teardown; the stream is cancelled."""
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await run


async def test_a_service_restarted_with_its_id_file_launches_no_duplicate(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:4;mem:1024")  # room for twice N
        id_file = tmp_path / "service.id"
        first = Service(id_file)
        async with started(first, cluster.address) as run:
            await wait_for_condition(lambda: len(running_here(first)) == N, what="N running")
            framework_id = first.framework_id
            assert framework_id is not None
            await crash(run)
        before = sorted(cluster.master.frameworks[framework_id].tasks)
        assert before == running_here(first)

        again = Service(id_file)
        async with started(again, cluster.address):
            await wait_for_condition(lambda: again.offer_rounds >= 1, what="an offer")
            # Its answer has reached the master: the offer is no longer outstanding.
            framework = cluster.master.frameworks[framework_id]
            await wait_for_condition(lambda: not framework.offers, what="the offer answered")
            assert again.launched == 0, f"launched {again.launched} duplicate(s)"
            assert sorted(framework.tasks) == before
            assert running_here(again) == before


@contextlib.asynccontextmanager
async def master_and_agent(
    tmp_path: Path,
) -> AsyncIterator[tuple[MasterProcess, AgentProcess, TcpProxy, aiohttp.ClientSession]]:
    master = MasterProcess(tmp_path, "--allocation-interval", "0.2")
    agent: AgentProcess | None = None
    try:
        async with aiohttp.ClientSession() as http:
            await master.start()
            async with TcpProxy(master.address) as link:
                agent = await spawn_agent_process(
                    link.address, tmp_path / "agent", "cpus:4;mem:1024;disk:0", "agent"
                )
                yield master, agent, link, http
    finally:
        if agent is not None:
            await agent.cleanup()
        await master.stop()


def master_logged(master: MasterProcess, text: str) -> bool:
    log = master.work_dir / f"master-{master.starts}.log"
    return log.exists() and text in log.read_text()


async def test_a_service_restarted_across_a_master_restart_launches_no_duplicate(
    tmp_path: Path,
) -> None:
    """Both the framework and the master die; the framework is back first, and asks
    while the agent that runs its tasks is still away (held back by a cut link)."""
    async with master_and_agent(tmp_path) as (master, agent, link, http):
        id_file = tmp_path / "service.id"
        first = Service(id_file)
        async with started(first, master.address) as run:
            await wait_for_condition(lambda: len(running_here(first)) == N, what="N running")
            await crash(run)
        pids = agent.task_pids()
        assert len(pids) == N

        await link.cut()
        await master.kill()
        await master.start()
        again = Service(id_file)
        async with started(again, master.address):
            await wait_for_condition(lambda: again.connected, what="the service back")
            # Its reconciliation has reached the master while the agent is away.
            await wait_for_condition(
                lambda: master_logged(master, "reconcil"), what="the reconciliation"
            )
            link.heal()
            await wait_for_condition(lambda: again.offer_rounds >= 1, what="an offer")

            def answered(state: dict[str, Any]) -> bool:
                return bool(state["frameworks"]) and not state["frameworks"][0]["offered"]

            state = await master.wait_state(http, answered, "the offer answered")
            assert again.launched == 0, f"launched {again.launched} duplicate(s)"
            assert len(state["tasks"]) == N
            assert sorted(agent.task_pids()) == sorted(pids)
            assert running_here(again) == running_here(first)
        assert master.violations() == []
