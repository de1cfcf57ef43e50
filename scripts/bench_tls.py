"""What TLS and authentication cost: the same local cluster with TLS off and on, side by side.

    python scripts/bench_tls.py                      # 300 tasks x 3 runs, 40 subscriptions,
                                                     # 100 GET /state, each way
    python scripts/bench_tls.py --out docs/tls-overhead.md

One master, one agent (cpus:8) and its sandbox server, in this process on 127.0.0.1; with
TLS on, everything uses certificates from `mesolite.certs` (mutual TLS on gRPC, HTTPS
with a client certificate), as `mesolite certs init` makes them. Measured, each a median:

  - task throughput: a framework launches N `true` tasks of <0.1 CPU, 16 MB> (up to 80 at
    once) and waits until all have finished; tasks per second, first launch to last end;
  - subscription: a new channel, SUBSCRIBE, until SUBSCRIBED (a full TLS handshake);
  - GET /state: on a new connection each time (handshake included), and on one kept open.

A benchmark, not a test: it prints figures and asserts nothing. On a shared machine the
figures move between runs; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesolite import certs, grpc_utils, logs
from mesolite.agent import Agent, AgentConfig, Backoff
from mesolite.agent.sandbox_http import SandboxServer
from mesolite.framework_sdk import Framework, Offer, Resources, TaskSpec, TaskStatus, TlsConfig
from mesolite.master.master import MasterConfig
from mesolite.master.server import MasterServer
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc

TASK = Resources(cpus=0.1, mem=16)
CONFIG = MasterConfig(allocation_interval=0.05, agent_heartbeat_interval=0.5)


class Burst(Framework):
    """Launches `count` `true` tasks, as many per offer as fit; done when all have ended."""

    def __init__(self, count: int, tls: TlsConfig | None) -> None:
        super().__init__(name="burst", tls=tls)
        self.waiting, self.running = count, 0
        self.first_launch = self.last_end = 0.0
        self.done = asyncio.Event()

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            tasks, free = [], offer.resources
            while self.waiting and free.contains(TASK):
                tasks.append(TaskSpec(f"t{self.waiting}", "true", TASK))
                free, self.waiting = free - TASK, self.waiting - 1
            if tasks:
                self.first_launch = self.first_launch or time.perf_counter()
                self.running += len(tasks)
                await self.launch(offer, tasks, refuse_seconds=0)
            else:
                await self.decline(offer, refuse_seconds=0)

    async def on_update(self, status: TaskStatus) -> None:
        if status.state.is_terminal:
            self.running -= 1
            if not self.waiting and not self.running:
                self.last_end = time.perf_counter()
                self.done.set()


@dataclass(frozen=True)
class Figures:
    tasks_per_second: float
    subscribe_ms: float
    state_new_connection_ms: float
    state_kept_open_ms: float


@contextlib.asynccontextmanager
async def cluster(work: Path, bundles: Path | None) -> AsyncIterator[MasterServer]:
    def tls(name: str) -> TlsConfig | None:
        return TlsConfig.from_dir(bundles / name) if bundles else None

    config = dataclasses.replace(CONFIG, tls=tls("master"))
    async with (
        MasterServer(config, "127.0.0.1", 0, 0) as server,
        SandboxServer(work / "agent", tls=tls("agent")) as sandboxes,
    ):
        agent = Agent(
            AgentConfig(
                server.grpc_address,
                Resources.parse("cpus:8;mem:4096"),
                work / "agent",
                address=sandboxes.address,
                reconnect_backoff=Backoff(0.05, 0.5),
                tls=tls("agent"),
            )
        )
        async with agent:
            await asyncio.wait_for(agent.wait_registered(), 20)
            yield server


async def throughput(server: MasterServer, tasks: int, tls: TlsConfig | None) -> float:
    burst = Burst(tasks, tls)
    runner = asyncio.create_task(burst.run(server.grpc_address))
    await asyncio.wait_for(burst.done.wait(), 300)
    await burst.teardown()
    await asyncio.wait_for(runner, 30)
    return tasks / (burst.last_end - burst.first_launch)


async def subscribe_ms(server: MasterServer, tls: TlsConfig | None) -> float:
    info = scheduler_pb2.FrameworkInfo(name="probe", role="*")
    first = scheduler_pb2.Call(subscribe=scheduler_pb2.Call.Subscribe(framework_info=info))
    started = time.perf_counter()
    async with grpc_utils.create_channel(server.grpc_address, tls) as channel:
        call = scheduler_pb2_grpc.SchedulerStub(channel).Connect(iter([first]), timeout=10)
        async for event in call:
            assert event.WhichOneof("event") == "subscribed", event
            break
        elapsed = time.perf_counter() - started
        call.cancel()
    return elapsed * 1000


async def state_ms(server: MasterServer, tls: TlsConfig | None, count: int) -> tuple[float, float]:
    url = f"{server.http_url}/state"
    context = tls.client_context() if tls else True
    fresh, kept = [], []
    for _ in range(count):
        async with aiohttp.ClientSession() as http:
            started = time.perf_counter()
            async with http.get(url, ssl=context) as response:
                await response.read()
            fresh.append(time.perf_counter() - started)
    async with aiohttp.ClientSession() as http:
        for _ in range(count):
            started = time.perf_counter()
            async with http.get(url, ssl=context) as response:
                await response.read()
            kept.append(time.perf_counter() - started)
    return statistics.median(fresh) * 1000, statistics.median(kept) * 1000


async def measure(
    work: Path, bundles: Path | None, args: argparse.Namespace
) -> tuple[Figures, list[float]]:
    framework = TlsConfig.from_dir(bundles / "framework") if bundles else None
    admin = TlsConfig.from_dir(bundles / "admin") if bundles else None
    async with cluster(work, bundles) as server:
        rates = [await throughput(server, args.tasks, framework) for _ in range(args.repeat)]
        subscriptions = [await subscribe_ms(server, framework) for _ in range(args.subscriptions)]
        fresh, kept = await state_ms(server, admin, args.requests)
    figures = Figures(statistics.median(rates), statistics.median(subscriptions), fresh, kept)
    return figures, rates


def table(off: Figures, on: Figures, args: argparse.Namespace) -> str:
    rows = [
        (f"task throughput ({args.tasks} `true` tasks), tasks/s", "tasks_per_second", "{:.1f}"),
        ("subscription: new channel to SUBSCRIBED, ms", "subscribe_ms", "{:.2f}"),
        ("GET /state, new connection, ms", "state_new_connection_ms", "{:.2f}"),
        ("GET /state, connection kept open, ms", "state_kept_open_ms", "{:.2f}"),
    ]
    lines = ["| median of | TLS off | TLS on | on / off |", "| --- | ---: | ---: | ---: |"]
    for label, name, form in rows:
        a, b = getattr(off, name), getattr(on, name)
        lines.append(f"| {label} | {form.format(a)} | {form.format(b)} | {b / a:.2f} |")
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs each way")
    parser.add_argument("--subscriptions", type=int, default=40)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    logs.configure(level="warning")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundles = work / "certs"
        certs.init_cluster(bundles)
        off, off_rates = await measure(work / "off", None, args)
        on, on_rates = await measure(work / "on", bundles, args)
    text = table(off, on, args)
    runs = (
        f"throughput runs, tasks/s: off {', '.join(f'{r:.1f}' for r in off_rates)}; "
        f"on {', '.join(f'{r:.1f}' for r in on_rates)}"
    )
    print(text)
    print(runs)
    if args.out:
        args.out.write_text(f"{text}\n\n{runs}\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
