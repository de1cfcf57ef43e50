"""How long the master's event loop stalls on Mesos scheduler calls, and how fast they go.

    python scripts/bench_mesos_api.py [--runs 7]

A master (in this process, its HTTP port on 127.0.0.1) with one agent that never
runs anything (a registered peer of the core), one Mesos framework subscribed over
HTTP; a client in another process posts, each `--runs` times, alternated:

  over-bound   an ACCEPT of 150,000 tiny tasks (4.0 MB of JSON): refused, 400
  accept-1000  an ACCEPT launching 1,000 tasks of one offer: 202
  revive x500  500 REVIVE calls on one keep-alive connection: calls per second

and this process records the loop's longest stall during each (a 1 ms ticker). Each
run is made twice, alternated: bodies past 16 KiB parsed in a worker thread (as
served), and every body parsed on the loop (`endpoint.THREAD_PARSE_BYTES` raised for
the run), so the two are measured under the same load. Prints the median and range
of each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from mesolite.master.master import Master, MasterConfig
from mesolite.master.mesos_api import endpoint, recordio
from mesolite.master.server import MasterServer
from mesolite.resources import Resources
from mesolite.stream_writer import StreamWriter

CLIENT = r"""
import http.client, json, sys, time
host, port, path, stream_id, body_file, repeat = sys.argv[1:7]
body = open(body_file, "rb").read()
conn = http.client.HTTPConnection(host, int(port), timeout=60)
headers = {"Content-Type": "application/json", "Mesos-Stream-Id": stream_id}
started = time.perf_counter()
statuses = set()
for _ in range(int(repeat)):
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    statuses.add(response.status)
print(json.dumps({"seconds": time.perf_counter() - started, "statuses": sorted(statuses)}))
"""


class Ticker:
    """The event loop's longest delay past a 1 ms sleep, since `reset`."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - before - 0.001)

    def reset(self) -> None:
        self.worst = 0.0


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    config = MasterConfig(allocation_interval=3600.0, offer_timeout=0)
    async with MasterServer(config, port=0, http_port=0) as server:
        master = server.master
        assert master is not None
        agent: StreamWriter[object] = StreamWriter(10**7)
        agent_id = master.register_agent(
            "", "bench", "", Resources.parse("cpus:100000;mem:10000000"), {}, (), agent
        )
        url = f"http://{server.http_address}/api/v1/scheduler"
        async with aiohttp.ClientSession() as session:
            body = {"type": "SUBSCRIBE", "subscribe": {"framework_info": {"user": "", "name": "b"}}}
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            response = await session.post(url, json=body, headers=headers)
            stream_id = response.headers["Mesos-Stream-Id"]
            decoder = recordio.Decoder()
            events: list[dict[str, object]] = []

            async def read() -> None:
                async for chunk in response.content.iter_any():
                    events.extend(json.loads(r) for r in decoder.feed(chunk))

            reader = asyncio.create_task(read())
            async with asyncio.timeout(10):
                while not events:  # noqa: ASYNC110 (a benchmark's setup)
                    await asyncio.sleep(0.01)
            framework_id = events[0]["subscribed"]["framework_id"]["value"]  # type: ignore[index]
            ticker = Ticker()
            served = endpoint.THREAD_PARSE_BYTES
            figures: dict[str, list[float]] = {}
            with tempfile.TemporaryDirectory() as tmp:
                for run, (mode, threshold) in enumerate(
                    [("thread", served), ("on loop", 1 << 40)] * args.runs
                ):
                    endpoint.THREAD_PARSE_BYTES = threshold
                    bodies = (
                        ("over-bound", over_bound(framework_id), 1),
                        ("accept-1000", accept(master, framework_id, agent_id, run), 1),
                        ("revive x500", revive(framework_id), 500),
                    )
                    for name, body_of_call, repeat in bodies:
                        path = Path(tmp) / "body.json"
                        path.write_bytes(json.dumps(body_of_call, separators=(",", ":")).encode())
                        ticker.reset()
                        out = await asyncio.to_thread(
                            subprocess.run,
                            [sys.executable, "-c", CLIENT, server.host, str(server.http_port),
                             "/api/v1/scheduler", stream_id, str(path), str(repeat)],
                            capture_output=True, text=True, check=True,
                        )  # fmt: skip
                        result = json.loads(out.stdout)
                        name = f"{name} ({mode})"
                        figures.setdefault(f"{name}: loop stall ms", []).append(ticker.worst * 1000)
                        figures.setdefault(f"{name}: wall ms", []).append(result["seconds"] * 1000)
                        if repeat > 1:
                            figures.setdefault(f"{name}: calls/s", []).append(
                                repeat / result["seconds"]
                            )
                        figures.setdefault(f"{name}: statuses", []).extend(result["statuses"])
            reader.cancel()
            response.close()
    for name, values in figures.items():
        if name.endswith("statuses"):
            print(f"{name:32} {sorted(set(values))}")
            continue
        print(
            f"{name:32} median {statistics.median(values):9.1f}   "
            f"range {min(values):9.1f} - {max(values):9.1f}"
        )
    return 0


def over_bound(framework_id: str) -> dict[str, object]:
    tasks = [{"task_id": {"value": "t"}}] * 150_000
    return {
        "type": "ACCEPT",
        "framework_id": {"value": framework_id},
        "accept": {"operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}]},
    }


def accept(master: Master, framework_id: str, agent_id: str, run: int) -> dict[str, object]:
    """1,000 tasks on a fresh offer of the agent (made here, through the core)."""
    master.allocate()
    offer_ids = [
        o.offer.offer_id for o in master.offers.values() if o.offer.framework_id == framework_id
    ]
    task = {
        "name": "t",
        "agent_id": {"value": agent_id},
        "resources": [
            {"name": "cpus", "type": "SCALAR", "scalar": {"value": 0.01}},
            {"name": "mem", "type": "SCALAR", "scalar": {"value": 1}},
        ],
        "command": {"value": "sleep 1000"},
    }
    tasks = [{**task, "task_id": {"value": f"r{run}-{i}"}} for i in range(1000)]
    return {
        "type": "ACCEPT",
        "framework_id": {"value": framework_id},
        "accept": {
            "offer_ids": [{"value": o} for o in offer_ids],
            "operations": [{"type": "LAUNCH", "launch": {"task_infos": tasks}}],
            "filters": {"refuse_seconds": 0},
        },
    }


def revive(framework_id: str) -> dict[str, object]:
    return {"type": "REVIVE", "framework_id": {"value": framework_id}}


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
