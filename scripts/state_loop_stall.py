"""How long GET /state holds the master's event loop on a large cluster.

    python scripts/state_loop_stall.py                       # 2,000 frameworks, 500 agents
    python scripts/state_loop_stall.py --frameworks 200 --agents 50 --concurrent 16

Builds the master's core with `tests/support`'s CoreHarness (no gRPC, virtual
time): F frameworks in R roles, A agents of `cpus:64;mem:262144;disk:1000000`
plus a few named scalars, and `--rounds` allocation cycles that each launch one
task from every offer (the last cycle's offers are left outstanding). Then it
serves the master's real HTTP app (`master.http.create_app`) on 127.0.0.1 in
this process's event loop and, while a ticker measures the loop's longest stall
(the largest gap between 1 ms sleeps, less the 1 ms), sends one GET /state, then
`--concurrent` at once, `--repeat` times each, from a client in a process of
its own (so the client's work is not on the loop measured). A benchmark, not a
test: it prints figures (median and worst of the rounds) and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web

from mesolite.logs import configure
from mesolite.master import messages as msg
from mesolite.master.http import create_app
from mesolite.master.read_model import build_snapshot
from tests.support.core import CONFIG, CoreHarness

AGENT = "cpus:64;mem:262144;disk:1000000;gpus:8;" + ";".join(f"license_{i}:100" for i in range(8))


def build_core(frameworks: int, agents: int, roles: int, rounds: int) -> CoreHarness:
    core = CoreHarness(dataclasses.replace(CONFIG, check_invariants=False))
    fws = [core.subscribe(f"framework-{i}", role=f"team{i % roles}") for i in range(frameworks)]
    for i in range(agents):
        core.add_agent(AGENT, hostname=f"host-{i}")
    task = 0
    for cycle in range(rounds + 1):
        core.master.allocate()
        if cycle == rounds:
            break  # the last cycle's offers stay outstanding
        for fw in fws:
            for offer in [o for batch in fw.peer.take(msg.Offers) for o in batch.offers]:
                task += 1
                core.launch(fw, offer, f"task-{task}", "cpus:1;mem:1024;license_0:1")
    return core


class Ticker:
    """The longest gap between 1 ms sleeps on this loop (a stall, less the 1 ms)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.001)
            now = loop.time()
            self.longest = max(self.longest, now - last - 0.001)
            last = now

    def start(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.longest


# The client: another process (its work is not on the loop measured), started once;
# for each line N on its stdin it sends N GET /state at once, and prints their sizes.
CLIENT = """
import sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url = sys.argv[1]
def get(_):
    with urllib.request.urlopen(url, timeout=120) as response:
        return len(response.read())
with ThreadPoolExecutor(64) as pool:
    for line in sys.stdin:
        print(*pool.map(get, range(int(line))), flush=True)
"""


async def measure(core: CoreHarness, path: str, concurrent: int, repeat: int) -> None:
    runner = web.AppRunner(create_app(core.master), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLIENT,
        f"http://127.0.0.1:{port}{path}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert client.stdin is not None and client.stdout is not None
    ticker = Ticker()
    try:
        for count in (1, concurrent):
            stalls, times = [], []
            for _ in range(repeat):
                gc.collect()
                ticker.start()
                started = time.perf_counter()
                client.stdin.write(f"{count}\n".encode())
                sizes = (await client.stdout.readline()).split()
                times.append(time.perf_counter() - started)
                stalls.append(await ticker.stop())
                assert len(sizes) == count, sizes
            print(
                f"  {count:>2} at once: longest loop stall "
                f"{_figures(stalls)}; all answered in {_figures(times)} "
                f"({int(sizes[0]) / 1e6:.1f} MB each)"
            )
    finally:
        client.stdin.close()
        await client.wait()
        await runner.cleanup()


def _figures(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return f"median {statistics.median(ms):6.1f} ms, max {ms[-1]:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--roles", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4, help="allocation cycles launching tasks")
    parser.add_argument("--path", default="/state", help="what to GET (/metrics, say)")
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5, help="rounds of each measurement")
    args = parser.parse_args()
    configure(level="warning")
    started = time.perf_counter()
    core = build_core(args.frameworks, args.agents, args.roles, args.rounds)
    master = core.master
    print(
        f"cluster: {len(master.frameworks)} frameworks, {len(master.agents)} agents, "
        f"{sum(1 for _ in master.tasks())} tasks, {len(master.offers)} offers "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    gc.collect()
    started = time.perf_counter()
    snapshot = build_snapshot(master)
    built = time.perf_counter() - started
    started = time.perf_counter()
    snapshot.to_json()
    as_json = time.perf_counter() - started
    print(f"build_snapshot {built * 1000:.1f} ms, to_json {as_json * 1000:.1f} ms (one run)")
    print(f"GET {args.path}")
    asyncio.run(measure(core, args.path, args.concurrent, args.repeat))


if __name__ == "__main__":
    main()
