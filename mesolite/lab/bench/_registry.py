"""`mesolite bench registry`: the registry's write latency, SQLite against etcd.

What the master waits for before it acknowledges anything: one change made and then
`durable()` (a framework subscribing), and one turn of the loop carrying a batch of
changes (an ACCEPT launching `batch` tasks). SQLite is a file in a scratch directory
(WAL, synchronous=NORMAL, as the master runs it); etcd is a 3-member cluster on this
machine (`mesolite/lab/etcd_cluster.py`) with a guarded transaction per write, as the
leader writes. The two alternate in blocks, `rounds` times, so load on a shared machine
falls on both alike; the figures are the medians and 99th percentiles of every write.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mesolite.lab.bench._control import percentiles
from mesolite.lab.etcd_cluster import EtcdCluster
from mesolite.master.effects import RegistryStore
from mesolite.master.election import Election
from mesolite.master.etcd_client import EtcdClient
from mesolite.master.etcd_registry import EtcdRegistry
from mesolite.master.leadership import MasterAddress
from mesolite.master.registry import FrameworkEntry, Registry
from mesolite.model import TaskSpec
from mesolite.resources import Resources


@dataclass(frozen=True)
class RegistryPlan:
    writes: int = 50  # per block
    batch: int = 100  # changes in one turn
    rounds: int = 5


async def _one_change(store: RegistryStore, i: int) -> float:
    started = time.perf_counter()
    store.add_framework(FrameworkEntry(f"F{i}", "bench", "*", 0.0, float(i)))
    await store.durable()
    return time.perf_counter() - started


async def _one_turn(store: RegistryStore, i: int, batch: int) -> float:
    task = Resources(cpus=1)
    started = time.perf_counter()
    for k in range(batch):
        store.add_tasks(f"F{i}", "S1", [TaskSpec(f"t{i}-{k}", "true", task)])
    await store.durable()
    return time.perf_counter() - started


async def _measure(
    stores: dict[str, RegistryStore], plan: RegistryPlan
) -> dict[str, dict[str, list[float]]]:
    found: dict[str, dict[str, list[float]]] = {n: {"one": [], "turn": []} for n in stores}
    i = 0
    for _ in range(plan.rounds):
        for name, store in stores.items():
            for _ in range(plan.writes):
                i += 1
                found[name]["one"].append(await _one_change(store, i))
            for _ in range(max(1, plan.writes // 10)):
                i += 1
                found[name]["turn"].append(await _one_turn(store, i, plan.batch))
    return found


async def _run(scratch: Path, plan: RegistryPlan, out: Callable[[str], None]) -> None:
    loop = asyncio.get_running_loop()
    sqlite = Registry(scratch / "registry.sqlite")
    sqlite.defer_commits(loop.call_soon)  # as the master runs it: one commit per turn
    async with EtcdCluster(scratch / "etcd") as etcd:
        client = EtcdClient(etcd.endpoints)
        election = Election(client, "/bench", MasterAddress("bench", "h:1", "http://h:2"), 10)
        try:
            fence = await election.campaign()
            stores: dict[str, RegistryStore] = {
                "sqlite": sqlite,
                "etcd": EtcdRegistry(client, "/bench", fence, on_fenced=election.lose),
            }
            found = await _measure(stores, plan)
        finally:
            await election.close()
            await client.close()
            sqlite.close()
    out(
        f"registry write latency: {plan.rounds} rounds of {plan.writes} single changes and "
        f"{max(1, plan.writes // 10)} turns of {plan.batch} changes per store, alternated"
    )
    out(f"{'store':8} {'one change p50':>15} {'p99':>8} {'turn p50':>10} {'p99':>8}  (ms)")
    for name, figures in found.items():
        one = percentiles(figures["one"], (0.5, 0.99))
        turn = percentiles(figures["turn"], (0.5, 0.99))
        out(
            f"{name:8} {one[0] * 1e3:15.2f} {one[1] * 1e3:8.2f} "
            f"{turn[0] * 1e3:10.2f} {turn[1] * 1e3:8.2f}"
        )
    ratio = statistics.median(found["etcd"]["one"]) / statistics.median(found["sqlite"]["one"])
    out(f"etcd / sqlite, one change, medians: {ratio:.1f}x")


def registry_latency(scratch: Path, plan: RegistryPlan, out: Callable[[str], None] = print) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    asyncio.run(_run(scratch, plan, out))
