"""Highly available masters: real `mesolite master` processes on a real 3-member etcd
cluster (tests/etcd_cluster.py), a real agent and a framework that keeps launching.

The leader is SIGKILLed under load (a standby leads within TTL + 3 s, nothing
acknowledged is lost), SIGSTOPped (it cannot write once its lease is gone, and on
SIGCONT it does not act as leader), and an etcd member is killed (no leadership change).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio

from mesolite.framework_sdk import Offer, Resources, TaskSpec, TaskState, TaskStatus
from mesolite.master.etcd_client import EtcdClient, Guard, Put
from mesolite.masters import LEADER_METADATA
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.chaos_ha import HaMasterProcess
from tests.cluster import AgentProcess, spawn_agent_process
from tests.etcd_cluster import EtcdCluster
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition

TTL = 2
LONG = 3  # long-running tasks: they must outlive the takeover, same processes


class Launcher(RecordingFramework):
    """Keeps LONG tasks running and launches short ones into what is left, for ever."""

    def __init__(self) -> None:
        super().__init__("launcher", failover_timeout=60.0)
        self.launched: list[tuple[float, str]] = []
        self._n = 0

    async def on_offers(self, offers: list[Offer]) -> None:
        await super().on_offers(offers)
        for offer in offers:
            cpus = offer.resources.get("cpus") or 0
            tasks = []
            while cpus >= 1:
                self._n += 1
                long = sum(1 for _, t in self.launched if t.startswith("long")) < LONG
                task_id = f"long-{self._n}" if long else f"short-{self._n}"
                command = "sleep 600" if long else "sleep 0.2"
                tasks.append(TaskSpec(task_id, command, Resources(cpus=1, mem=8)))
                self.launched.append((time.monotonic(), task_id))
                cpus -= 1
            if tasks:
                await self.launch(offer, tasks, refuse_seconds=0)
            else:
                await self.decline(offer, refuse_seconds=0)

    def finished_after(self, moment: float) -> int:
        launched_after = {t for at, t in self.launched if at > moment}
        return sum(
            1 for u in self.updates if u.state == TaskState.FINISHED and u.task_id in launched_after
        )

    def running_ids(self) -> set[str]:
        latest: dict[str, TaskStatus] = {}
        for u in self.updates:
            latest[u.task_id] = u
        return {t for t, u in latest.items() if u.state == TaskState.RUNNING}


@contextlib.asynccontextmanager
async def ha_cluster(
    tmp_path: Path, ttl: int = TTL
) -> AsyncIterator[tuple[EtcdCluster, list[HaMasterProcess], aiohttp.ClientSession]]:
    async with EtcdCluster(tmp_path) as etcd, aiohttp.ClientSession() as http:
        registry = etcd.url + "/ha-test"
        flags = ("--allocation-interval", "0.2", "--agent-reregister-timeout", "15")
        masters = [
            HaMasterProcess(
                tmp_path / f"m{i}", "--registry", registry, "--leader-ttl", str(ttl), *flags
            )
            for i in range(2)
        ]
        try:
            await masters[0].start()  # its first line says it stands by: then it leads
            await wait_for_condition_async(lambda: masters[0].leads(http), 20, "m0 to lead")
            await masters[1].start()
            yield etcd, masters, http
        finally:
            for m in masters:
                await m.kill()


async def wait_for_condition_async(check: Any, timeout: float, what: str) -> float:
    """Poll an async predicate; returns the seconds it took."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def refused_with_leader(address: str) -> str | None:
    """What a master's gRPC port says to a subscription: the leader it names, if it
    refuses with UNAVAILABLE; None if it does not refuse."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        call = stub.Connect()
        try:
            await call.write(scheduler_pb2.Call())
            await asyncio.wait_for(call.read(), 5)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                return None
            return str(dict(e.trailing_metadata() or ()).get(LEADER_METADATA, ""))
        except TimeoutError:
            return None
        finally:
            call.cancel()
    return None


async def test_a_standby_takes_over_a_killed_leader_under_load_losing_nothing(
    tmp_path: Path,
) -> None:
    async with ha_cluster(tmp_path) as (_, (m0, m1), http):
        assert await wait_for_condition_async(
            lambda: _named(m1.address, m0.address), 20, "m1 to stand by naming m0"
        )
        agent: AgentProcess = await spawn_agent_process(
            f"{m1.address},{m0.address}", tmp_path / "agent", "cpus:6;mem:1024;disk:0", "a1"
        )
        try:
            framework = Launcher()
            async with running(framework, f"{m1.address},{m0.address}"):
                await wait_for_condition(
                    lambda: (
                        len(framework.running_ids() & _longs(framework)) == LONG
                        and framework.finished_after(0) >= 5
                    ),
                    30,
                    "the load to run on m0",
                )
                framework_id = framework.framework_id
                before = await m0.state(http)
                [agent_before] = before["agents"]
                pids = agent.task_pids()
                long_running = framework.running_ids() & _longs(framework)
                seen = len(framework.updates)
                killed_at = time.monotonic()
                await m0.kill()
                took = await wait_for_condition_async(lambda: m1.leads(http), TTL + 3, "m1 to lead")
                assert took <= TTL + 3
                # Frameworks keep their ids and running tasks, and go on launching.
                await wait_for_condition(
                    lambda: (
                        framework.subscriptions >= 2 and framework.finished_after(killed_at) >= 5
                    ),
                    30,
                    "the framework to go on launching on m1",
                )
                assert framework.framework_id == framework_id
                after = await m1.state(http)
                [agent_after] = after["agents"]
                assert agent_after["id"] == agent_before["id"] and agent_after["connected"]
                running_there = {t["id"] for t in after["tasks"] if t["state"] == "TASK_RUNNING"}
                assert long_running <= running_there
                assert set(pids) & set(agent.task_pids())  # the same processes
                # Nothing acknowledged was lost: no task the framework had an update for
                # is LOST. (A launch m0 took but had not stored when it died was never
                # acknowledged: m1 rightly answers its reconciliation with TASK_LOST.)
                acknowledged = {u.task_id for u in framework.updates[:seen]}
                lost = {u.task_id for u in framework.updates if u.state == TaskState.LOST}
                assert not lost & acknowledged
                assert "invariant violated" not in m1.log()
        finally:
            await agent.cleanup()


async def _named(address: str, leader: str) -> bool:
    return await refused_with_leader(address) == leader


def _longs(framework: Launcher) -> set[str]:
    return {t for _, t in framework.launched if t.startswith("long")}


async def test_a_frozen_leader_is_fenced_and_does_not_lead_when_it_wakes(
    tmp_path: Path,
) -> None:
    async with ha_cluster(tmp_path) as (etcd, (m0, m1), http):
        client = EtcdClient(etcd.endpoints)
        try:
            key = b"/ha-test/leader"
            old = await client.get(key)
            assert old is not None
            async with running(RecordingFramework(failover_timeout=30), m0.address):
                assert m0.process is not None
                m0.process.send_signal(signal.SIGSTOP)
                try:
                    await wait_for_condition_async(lambda: m1.leads(http), TTL + 3, "m1 to lead")
                    # Fencing: a write guarded on the frozen leader's term is refused.
                    guards = [Guard.created(key, old.create_revision), Guard.leased(key, old.lease)]
                    ok, _, current = await client.txn(
                        guards, [Put(b"/ha-test/registry/probe", b"x")], failure_get=key
                    )
                    assert not ok and current is not None and current.lease != old.lease
                finally:
                    m0.process.send_signal(signal.SIGCONT)
                # Awake, it refuses calls (UNAVAILABLE) or is gone; it ends its own term.
                assert await refused_with_leader(m0.address) is not None
                assert not await m0.leads(http)
                assert await asyncio.wait_for(m0.process.wait(), 10) == 3
                assert "leadership lost" in m0.log()
            assert await m1.leads(http)
            assert "invariant violated" not in m1.log()
        finally:
            await client.close()


async def test_an_etcd_member_killed_costs_no_leadership_change(tmp_path: Path) -> None:
    async with ha_cluster(tmp_path, ttl=5) as (etcd, (m0, m1), http):
        await wait_for_condition_async(lambda: _named(m1.address, m0.address), 20, "m1 standby")

        # The leader shows itself and the standby; the standby's HTTP points at the leader.
        async def shows_standby() -> bool:
            state = await m0.state(http)
            return [m["grpc"] for m in state["standbys"]] == [m1.address]

        await wait_for_condition_async(shows_standby, 10, "m0 to list m1 as standby")
        assert (await m0.state(http))["leader"]["grpc"] == m0.address
        standby_state = f"http://{m1.http_address}/state"
        async with http.get(standby_state, allow_redirects=False) as r:
            assert r.status == 307
            assert r.headers["Location"] == f"http://127.0.0.1:{m0.http_port}/state"
        async with http.get(f"http://127.0.0.1:{m0.http_port}/metrics") as r:
            metrics = await r.text()
        assert "mesolite_master_leading 1.0" in metrics
        assert "mesolite_master_leadership_terms_total 1.0" in metrics
        assert "mesolite_registry_write_seconds_count" in metrics
        etcd.kill(0)  # the member the masters' channels picked first
        # Writes resume: a new framework's subscription is acknowledged only once stored.
        async with running(RecordingFramework("after-kill"), f"{m0.address},{m1.address}") as f:
            assert f.framework_id
            state = await m0.state(http)
            assert [fw["id"] for fw in state["frameworks"]] == [f.framework_id]
            client = EtcdClient(etcd.endpoints[1:])
            try:
                stored = await client.get(f"/ha-test/registry/frameworks/{f.framework_id}".encode())
            finally:
                await client.close()
            assert stored is not None
        assert await m0.leads(http) and not await m1.leads(http)
        assert "leadership lost" not in m0.log()
