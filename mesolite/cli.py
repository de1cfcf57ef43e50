"""The `mesolite` command: run a master or an agent, a local demo, or read a master's state."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from master.policies import POLICIES
from mesolite import logs
from mesolite.resources import InvalidResources, Resources


def _parse_weights(text: str) -> dict[str, float]:
    """Mesos' --weights format: ``role1=2,role2=0.5``."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if not sep or not role or not weight > 0 or weight == float("inf"):
            raise argparse.ArgumentTypeError(
                f"expected ROLE=WEIGHT with a positive weight, got {part!r}"
            )
        weights[role] = weight
    return weights


def _parse_resources(text: str) -> Resources:
    try:
        resources = Resources.parse(text)
    except InvalidResources as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if resources.is_empty():
        raise argparse.ArgumentTypeError("no resources given")
    return resources


def _parse_agent_resources(text: str) -> tuple[Resources, set[str]]:
    """The resources given, and every name given (zero amounts included)."""
    resources = _parse_resources(text)
    named = {part.partition(":")[0].strip() for part in text.split(";") if part.strip()}
    return resources, named


def _parse_attributes(text: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = part.partition(":")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {part!r}")
        attributes[name.strip()] = value.strip()
    return attributes


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mesolite", description=__doc__)
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    sub = parser.add_subparsers(dest="command", required=True)

    m = sub.add_parser("master", help="run a master")
    m.add_argument("--host", default="127.0.0.1", help="address to listen on")
    m.add_argument("--port", type=int, default=5050, help="gRPC port (0: any free port)")
    m.add_argument("--http-port", type=int, default=5051, help="HTTP port for /state")
    m.add_argument("--work-dir", type=Path, default=Path("work-dirs/master"))
    m.add_argument("--allocation-interval", type=_positive, default=1.0, metavar="S")
    m.add_argument("--offer-timeout", type=_positive, default=30.0, metavar="S")
    m.add_argument(
        "--agent-timeout",
        type=_positive,
        default=10.0,
        metavar="S",
        help="remove an agent silent for this long",
    )
    m.add_argument(
        "--weights",
        type=_parse_weights,
        default={},
        metavar="ROLE=W,...",
        help="role weights, e.g. eng=2,ops=1",
    )
    m.add_argument(
        "--agent-reregister-timeout",
        type=_positive,
        default=60.0,
        metavar="S",
        help="after a restart, agents not back within this are removed and their tasks lost",
    )
    m.add_argument(
        "--check-invariants",
        action="store_true",
        help="verify the bookkeeping after every step (slow; for tests)",
    )
    m.add_argument(
        "--roles",
        type=Path,
        default=None,
        metavar="FILE",
        help="roles file (TOML): weights, guarantees and limits; reloaded on SIGHUP",
    )
    m.add_argument(
        "--policy",
        choices=POLICIES,
        default="drf",
        help="how shares are measured: dominant share, asset sum, or slots",
    )

    a = sub.add_parser("agent", help="run an agent")
    a.add_argument("--master", required=True, metavar="HOST:PORT")
    a.add_argument(
        "--resources",
        type=_parse_agent_resources,
        default=None,
        metavar='"cpus:4;mem:14336"',
        help="default: this machine's CPUs and memory",
    )
    a.add_argument("--attributes", type=_parse_attributes, default={}, metavar='"rack:r1"')
    a.add_argument("--work-dir", type=Path, default=Path("work-dirs/agent"))
    a.add_argument("--hostname", default=socket.gethostname())

    d = sub.add_parser("demo", help="run a local cluster with a CPU-heavy and a memory-heavy job")
    d.add_argument("--agents", type=int, default=3)
    d.add_argument(
        "--agent-resources", type=_parse_resources, default=Resources.parse("cpus:4;mem:8192")
    )
    d.add_argument(
        "--duration",
        type=_positive,
        default=60.0,
        metavar="S",
        help="how long to run before stopping",
    )
    d.add_argument("--task-seconds", type=_positive, default=3.0, metavar="S")
    d.add_argument("--work-dir", type=Path, default=Path("work-dirs/demo"))
    d.add_argument("--http-port", type=int, default=5051)

    s = sub.add_parser("state", help="print a master's state")
    s.add_argument("--master", default="127.0.0.1:5051", metavar="HOST:HTTP_PORT")
    s.add_argument("--json", action="store_true", help="print the raw JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "state":
        return _state(args)
    logs.configure(json=args.log_json, level=args.log_level)
    runners = {"master": _run_master, "agent": _run_agent, "demo": _run_demo}
    try:
        return asyncio.run(runners[args.command](args))
    except KeyboardInterrupt:
        return 130


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _run_master(args: argparse.Namespace) -> int:
    from master.master import MasterConfig
    from master.roles import RolesConfigError
    from master.server import MasterServer

    args.work_dir.mkdir(parents=True, exist_ok=True)
    config = MasterConfig(
        allocation_interval=args.allocation_interval,
        offer_timeout=args.offer_timeout,
        agent_timeout=args.agent_timeout,
        weights=args.weights,
        roles_file=args.roles,
        policy=args.policy,
        work_dir=args.work_dir,
        check_invariants=args.check_invariants,
        agent_reregister_timeout=args.agent_reregister_timeout,
    )
    server = MasterServer(config, args.host, args.port, args.http_port)
    try:
        await server.start()
    except (RolesConfigError, OSError) as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        await server.stop()
        return 2
    if server.master is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, server.master.reload_roles)
    try:
        print(
            f"mesolite master {server.master.master_id if server.master else ''} "
            f"is listening on {server.grpc_address} (HTTP {server.http_address})\n"
            f"  join an agent:       mesolite agent --master {server.grpc_address} "
            '--resources "cpus:4;mem:8192" --work-dir work-dirs/agent1\n'
            f"  run a framework:     python examples/batch_framework.py --master "
            f"{server.grpc_address} --name batch --cpus 1 --mem 512 --duration 5 --tasks 10\n"
            f"  look at the cluster: mesolite state --master {server.http_address}",
            flush=True,
        )
        await _until_signalled()
    finally:
        await server.stop()
    return 0


async def _run_agent(args: argparse.Namespace) -> int:
    from agent import Agent
    from agent.resources import detect_resources

    args.work_dir.mkdir(parents=True, exist_ok=True)
    given: Resources
    named: set[str]
    given, named = args.resources or (Resources(), set())
    detected = detect_resources(args.work_dir, given)
    # Only what the flag did not name is detected: `disk:0` means no disk.
    resources = Resources({n: a for n, a in detected.items() if n not in named or n in given})
    agent = Agent(
        args.master, resources, args.work_dir, hostname=args.hostname, attributes=args.attributes
    )
    runner = asyncio.create_task(agent.run())
    signalled = asyncio.create_task(_until_signalled())
    done, _ = await asyncio.wait({runner, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if signalled in done:
        await (
            agent.stop()
        )  # kills the agent's tasks and reports them, like `mesos-agent` on SIGTERM
    else:
        signalled.cancel()
    await runner  # re-raises a registration error
    return 0


async def _run_demo(args: argparse.Namespace) -> int:
    from mesolite.demo import run_demo

    return await run_demo(args)


def _fetch_state(address: str) -> dict[str, Any]:
    url = address if address.startswith("http") else f"http://{address}"
    with urllib.request.urlopen(f"{url}/state", timeout=10) as response:
        data: dict[str, Any] = json.load(response)
    return data


def _fmt(resources: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:.10g}" for k, v in resources.items()) or "-"


def _state(args: argparse.Namespace) -> int:
    try:
        state = _fetch_state(args.master)
    except (urllib.error.URLError, OSError) as e:
        print(f"cannot read state from {args.master}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(state, indent=2))
        return 0
    c = state["cluster"]
    print(
        f"master {state['master_id']}: {c['agents']} agents, {c['frameworks']} frameworks, "
        f"{c['running_tasks']} tasks, {c['outstanding_offers']} offers outstanding"
    )
    print(
        f"  total     {_fmt(c['total'])}\n  allocated {_fmt(c['allocated'])}\n"
        f"  free      {_fmt(c['free'])}"
    )
    print("\nframeworks:")
    for f in state["frameworks"]:
        print(
            f"  {f['id']}  {f['name']:<16} role={f['role']:<8} weight={f['weight']:g} "
            f"share={f['dominant_share']:.3f} tasks={f['running_tasks']:<4} "
            f"{'connected' if f['connected'] else 'DISCONNECTED'}  used {_fmt(f['used'])}"
        )
    if state.get("roles"):
        print(
            f"\nroles (policy {state.get('policy', 'drf')}; fair shares: steady / instantaneous):"
        )
        for r in state["roles"]:
            depth = 0 if r["path"] == "*" else r["path"].count("/")
            name = "  " * depth + r["path"].rsplit("/", 1)[-1]
            limit = _fmt(r["limit"]) if r["limit"] is not None else "-"
            print(
                f"  {name:<16} weight={r['weight']:<4g} share={r['weighted_share']:.3f} "
                f"{'active' if r['active'] else 'idle  '} allocated {_fmt(r['allocated'])}  "
                f"guarantee {_fmt(r['guarantee'])}  limit {limit}\n"
                f"  {'':<16} steady {_fmt(r['steady_fair_share'])}  "
                f"instantaneous {_fmt(r['instantaneous_fair_share'])}"
            )
    print("\nagents:")
    for a in state["agents"]:
        print(
            f"  {a['id']}  {a['hostname']:<16} {'healthy' if a['healthy'] else 'UNHEALTHY'} "
            f"tasks={a['running_tasks']:<4} total {_fmt(a['total'])}  "
            f"allocated {_fmt(a['allocated'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
