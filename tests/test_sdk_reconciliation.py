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
import grpc
import structlog.testing

from examples.keep_running import KeepRunning
from mesolite.framework_sdk import ConnectionConfig, Offer, Resources, TaskState
from mesolite.v1 import scheduler_pb2
from tests.cluster import AgentProcess, LocalCluster, MasterProcess, spawn_agent_process
from tests.tcp_proxy import TcpProxy
from tests.test_sdk_fake_master import FakeMaster, fake_master, running
from tests.test_sdk_framework import Recorder, offer, status
from tests.waiting import wait_for_condition

Event = scheduler_pb2.Event

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


# -- the SDK's half, against a fake master that answers when the test says ---------------


def reconcile_calls(master: FakeMaster) -> list[str]:
    """The call ids of the implicit reconciliations received, in order."""
    return [c.call_id for c in master.calls if c.HasField("reconcile") and not c.reconcile.task_ids]


async def reconciling(master: FakeMaster, count: int = 1) -> str:
    await wait_for_condition(lambda: len(reconcile_calls(master)) >= count, what="a reconcile")
    return reconcile_calls(master)[count - 1]


def kinds(framework: Recorder) -> list[str]:
    return [e[0] for e in framework.events]


async def test_offers_are_held_until_the_master_confirms_the_reconciliation() -> None:
    framework = Recorder(framework_id="fw-1")
    async with fake_master() as master:
        master.answer_reconciliations = False
        async with running(framework, master):
            call_id = await reconciling(master)
            # Offers overtake the answers (the master made them before the call came).
            master.send_offers(offer("o1"))
            master.send_offers(offer("o2", agent_id="a2"))
            master.send_update(status("t1", TaskState.RUNNING))
            await wait_for_condition(lambda: bool(framework.seen("update")), what="the answer")
            # Both offers were read before the answer, and held.
            assert framework.seen("offers") == [] and framework.outstanding_offers == {}
            master.reconciled(call_id, tasks=1)
            await wait_for_condition(lambda: bool(framework.seen("offers")), what="the offers")
            assert kinds(framework) == ["subscribed", "update", "offers"]
            [(offers,)] = framework.seen("offers")
            assert [o.offer_id for o in offers] == ["o1", "o2"]  # in one call, in order
            assert set(framework.outstanding_offers) == {"o1", "o2"}
            # From now on offers pass at once.
            master.send_offers(offer("o3"))
            await wait_for_condition(lambda: len(framework.seen("offers")) == 2, what="o3")


async def test_a_held_offer_taken_back_is_never_shown() -> None:
    framework = Recorder(framework_id="fw-1")
    async with fake_master() as master:
        master.answer_reconciliations = False
        async with running(framework, master):
            call_id = await reconciling(master)
            master.send_offers(offer("o1"), offer("o2"))
            master.send(Event(rescind=Event.Rescind(offer_id="o1")))
            master.reconciled(call_id)
            await wait_for_condition(lambda: bool(framework.seen("offers")), what="the offers")
            assert [o.offer_id for o in framework.seen("offers")[0][0]] == ["o2"]
            assert framework.seen("rescind") == []


async def test_a_connection_lost_mid_reconciliation_starts_it_again() -> None:
    """The master dies before it confirms: the held offers die with the stream, and
    the next subscription reconciles again; a confirmation of the old call is not
    taken for the new one."""
    framework = Recorder(framework_id="fw-1")
    async with fake_master() as master:
        master.answer_reconciliations = False
        async with running(framework, master):
            first = await reconciling(master)
            master.send_offers(offer("o1"))
            master.end_stream(grpc.StatusCode.UNAVAILABLE, "the master died")
            second = await reconciling(master, 2)
            assert second != first
            master.reconciled(first)  # late, from the old stream's call
            master.send_offers(offer("o2"))
            master.send_update(status("t1", TaskState.RUNNING))
            await wait_for_condition(lambda: bool(framework.seen("update")), what="the answer")
            assert framework.seen("offers") == []
            master.reconciled(second)
            await wait_for_condition(lambda: bool(framework.seen("offers")), what="the offers")
            assert [o.offer_id for o in framework.seen("offers")[0][0]] == ["o2"]
            assert kinds(framework) == [
                "subscribed",
                "disconnected",
                "subscribed",
                "update",
                "offers",
            ]


async def test_the_wait_is_bounded_and_its_end_logged() -> None:
    connection = ConnectionConfig(reconnect_initial=0.01, reconnect_max=0.05, reconcile_timeout=0.3)
    framework = Recorder(connection=connection, framework_id="fw-1")
    async with fake_master() as master:
        master.answer_reconciliations = False
        with structlog.testing.capture_logs() as logs:
            async with running(framework, master):
                await reconciling(master)
                master.send_offers(offer("o1"))
                await wait_for_condition(lambda: bool(framework.seen("offers")), what="offers")
        [expired] = [e for e in logs if e["event"].startswith("reconciliation not confirmed")]
        assert expired["log_level"] == "error"
        assert (expired["timeout"], expired["offers"]) == (0.3, 1)
        assert master.streams_opened == 1  # not taken for a broken connection


async def test_a_first_subscription_holds_nothing_and_a_reconcile_asked_for_changes_nothing() -> (
    None
):
    framework = Recorder()
    async with fake_master() as master:
        master.answer_reconciliations = False
        async with running(framework, master):
            master.send_offers(offer("o1"))
            await wait_for_condition(lambda: bool(framework.seen("offers")), what="o1")
            call_id = await framework.reconcile()
            master.reconciled(call_id)
            master.send_offers(offer("o2"))
            await wait_for_condition(lambda: len(framework.seen("offers")) == 2, what="o2")
            assert reconcile_calls(master) == [call_id]
