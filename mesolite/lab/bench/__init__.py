"""`mesolite bench`: a load generator for the master, with simulated agents and frameworks.

    mesolite bench throughput --agents 50 --frameworks 4 --duration 20
    mesolite bench agents --agents 10000 --agent-procs 4
    mesolite bench throughput --compare before=/path/to/old/clone --compare after=.
    mesolite bench throughput --registry sqlite --registry etcd --rounds 3
    mesolite bench registry --rounds 5

(`python scripts/bench_master.py ...` is the same.) The master runs in a process of its
own, from the source tree given with `--compare LABEL=DIR` (default: this one), so one
run can put two versions side by side on the same machine. Simulated agents
(`_sim_agents.py`: register, heartbeat, answer launches with STARTING, RUNNING,
FINISHED and wait for acknowledgements; no process is started) and greedy frameworks
(`_sim_frameworks.py`: launch on every offer, acknowledge every update) run in worker
processes of their own.

`throughput` measures tasks per second through the master, the master's CPU (from
/proc/PID/stat) and RSS, the load generator's CPU, the offer latency (on each agent,
from a task's end to the next launch there: the master frees, offers, the framework
accepts, the master launches) and each task's round trip (ACCEPT to its end's update).
`--registry etcd` runs the master on a registry in a 3-member etcd cluster the bench
starts (the master campaigns and leads, as `mesolite master --registry` does); `registry`
measures the two registries' write latency alone (`_registry.py`).
`agents` starts every agent at once (a registration storm: time until all are
registered, and the refusals and resets on the way), then measures the idle master's
CPU and RSS and the time of GET /state.

Simulated agents all connect from 127.0.0.1, and the master bounds gRPC streams per
client (one principal on one host, else one host: `master/stream_limits.py`), so the
bench raises those bounds (`grpc_streams`) to the number of agents and frameworks: as
many hosts would. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mesolite.lab.bench import _procstat
from mesolite.lab.bench._registry import RegistryPlan, registry_latency
from mesolite.lab.bench._runner import (
    AgentsPlan,
    MasterUnderTest,
    Row,
    ThroughputPlan,
    agents_at_scale,
    print_table,
    temp_dir,
    throughput,
)
from mesolite.lab.etcd_cluster import EtcdCluster
from mesolite.resources import Resources

__all__ = ["add_arguments", "main", "run"]

_THIS_SOURCE = Path(__file__).resolve().parents[3]  # the tree holding mesolite/


def _resources(text: str) -> dict[str, float]:
    try:
        return {k: v / 1000 for k, v in Resources.parse(text).to_dict().items()}
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _source(text: str) -> tuple[str, Path]:
    label, sep, directory = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR, got {text!r}")
    path = Path(directory).resolve()
    if not (path / "mesolite").is_dir():
        raise argparse.ArgumentTypeError(f"{path} holds no mesolite/ package")
    return label, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "scenario",
        choices=["throughput", "agents", "registry"],
        help="what to measure (see above)",
    )
    parser.add_argument(
        "--registry",
        choices=["sqlite", "etcd"],
        action="append",
        help="throughput: the master's registry (repeat to compare; etcd: a 3-member "
        "cluster the bench starts, the master leading on it; default sqlite)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the rows (alternated) this many times"
    )
    parser.add_argument(
        "--compare",
        type=_source,
        action="append",
        metavar="LABEL=DIR",
        help="run the master from this source tree (repeat to compare; default: this one)",
    )
    parser.add_argument("--agents", type=int, default=None, help="simulated agents")
    parser.add_argument(
        "--agent-resources", type=_resources, default=None, help='default "cpus:8;mem:65536"'
    )
    parser.add_argument("--agent-procs", type=int, default=None, help="processes for the agents")
    parser.add_argument("--frameworks", type=int, default=4)
    parser.add_argument("--framework-procs", type=int, default=1)
    parser.add_argument("--task", type=_resources, default=_resources("cpus:1;mem:128"))
    parser.add_argument(
        "--tasks-per-offer", type=int, default=0, help="at most this many (0: all that fit)"
    )
    parser.add_argument(
        "--task-seconds", type=float, default=0.0, help="how long each task runs (0: ends at once)"
    )
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=20.0, help="the measured window")
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=None,
        metavar="S",
        help="the master's agent heartbeat interval (default: the master's own default)",
    )
    parser.add_argument("--idle", type=float, default=20.0, help="agents: idle window measured")
    parser.add_argument("--settle", type=float, default=5.0, help="agents: wait before it")
    parser.add_argument("--state-requests", type=int, default=3)
    parser.add_argument("--storm-timeout", type=float, default=180.0)
    parser.add_argument(
        "--no-batches",
        dest="batches",
        action="store_false",
        help="simulated peers do not ask for batched messages",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.add_argument(
        "--event-loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the master's event loop (uvloop must be importable; it is not a dependency)",
    )
    parser.add_argument(
        "--py-spy",
        metavar="PATH",
        help="profile the master over the measured window with this py-spy binary",
    )


def run(args: argparse.Namespace) -> int:
    sources = args.compare or [("this", _THIS_SOURCE)]
    scratch = temp_dir()
    load = _procstat.load_average()
    if args.scenario == "registry":
        registry_latency(scratch, RegistryPlan(rounds=max(1, args.rounds)))
        end = _procstat.load_average()
        print(f"load average {load[0]:.2f} at the start, {end[0]:.2f} at the end")
        return 0
    rows: list[Row] = []
    registries = args.registry or ["sqlite"]
    etcd = None
    if "etcd" in registries:
        etcd = EtcdCluster(scratch / "etcd")
        asyncio.run(etcd.start())
    try:
        runs = [
            (f"{label}/{registry}" if args.registry else label, source, registry, n)
            for n in range(max(1, args.rounds))
            for label, source in sources
            for registry in registries
        ]
        for label, source, registry, n in runs:
            extra = {}
            if registry == "etcd" and etcd is not None:
                extra = {"registry": f"{etcd.url}/bench-{n}-{label.replace('/', '-')}"}
            rows.append(
                _one(args, label, source, scratch / f"{label.replace('/', '-')}-{n}", extra)
            )
    finally:
        if etcd is not None:
            etcd.stop()
    end_load = _procstat.load_average()
    print_table(
        rows,
        f"mesolite bench {args.scenario}; load average {load[0]:.2f} at the start, "
        f"{end_load[0]:.2f} at the end ({_procstat.cpu_count()} CPUs)",
    )
    return 0


def _one(
    args: argparse.Namespace, label: str, source: Path, log_dir: Path, extra: dict[str, Any]
) -> Row:
    """One row: the scenario against one master (`extra`: settings such as its registry)."""
    settings: dict[str, Any] = {"log_level": args.log_level, "event_loop": args.event_loop}
    settings.update(extra)
    if args.heartbeat is not None:
        settings["agent_heartbeat_interval"] = args.heartbeat
        settings["agent_timeout"] = max(10.0, 5 * args.heartbeat)
    master = MasterUnderTest(label, source, settings, log_dir, args.py_spy)
    if args.scenario == "throughput":
        agents = args.agents or 50
        settings["grpc_streams"] = _streams_for(agents + args.frameworks)
        row = throughput(
            master,
            ThroughputPlan(
                agents=agents,
                agent_resources=args.agent_resources or _resources("cpus:8;mem:65536"),
                frameworks=args.frameworks,
                task=args.task,
                tasks_per_offer=args.tasks_per_offer,
                task_seconds=args.task_seconds,
                warmup=args.warmup,
                duration=args.duration,
                agent_procs=args.agent_procs or 1,
                framework_procs=args.framework_procs,
                batches=args.batches,
            ),
        )
    else:
        agents = args.agents or 10_000
        settings["grpc_streams"] = _streams_for(agents)
        row = agents_at_scale(
            master,
            AgentsPlan(
                agents=agents,
                agent_resources=args.agent_resources or _resources("cpus:8;mem:65536"),
                agent_procs=args.agent_procs or 4,
                settle=args.settle,
                idle=args.idle,
                state_requests=args.state_requests,
                storm_timeout=args.storm_timeout,
                batches=args.batches,
            ),
        )
    print(f"[{label}: done; master log in {log_dir}]", file=sys.stderr, flush=True)
    return row


def _streams_for(clients: int) -> dict[str, float]:
    """Stream bounds for `clients` simulated peers on one host (as many hosts would be)."""
    return {"per_client": clients + 64, "waiting_per_client": clients + 64}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mesolite bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
