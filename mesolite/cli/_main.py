"""`mesolite master|agent|demo|experiment`: run one, until Ctrl-C or SIGTERM; the view
commands are `mesolite/cli/_views.py`'s, `mesolite teardown|kill`
`mesolite/cli/_operator.py`'s, `mesolite certs` is `mesolite/cli/_certs.py`'s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mesolite import http_serving, logs, tls_options
from mesolite.cli._args import build_parser, gc_config, isolation_config
from mesolite.cli._certs import run_certs
from mesolite.cli._operator import run_operator
from mesolite.cli._paper import COMMANDS as PAPER_COMMANDS
from mesolite.cli._paper import run_paper_command
from mesolite.cli._views import show
from mesolite.cli._workloads import run_workload, stop_workload, workload_runner
from mesolite.errors import MesoliteError
from mesolite.resources import Resources
from mesolite.tls import TlsConfig, TlsError
from mesolite.views import VIEWS

if TYPE_CHECKING:
    from mesolite.master.etcd_registry import EtcdRegistry
    from mesolite.master.ha import HaMaster
    from mesolite.master.server import MasterServer

    http_serving.raise_descriptor_limit()  # HTTP connection caps are fitted to it


def main(argv: Sequence[str] | None = None) -> int:
    """The `mesolite` command. Ends quietly, as command-line tools do: on Ctrl-C with
    130 (128 + SIGINT), when its reader goes away (`mesolite tasks --json | head -1`)
    with 141 (128 + SIGPIPE), never with a traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, so a closed pipe is caught below, not at exit
        return code
    except KeyboardInterrupt:
        print(file=sys.stderr)  # the ^C the terminal echoed ends its line
        return 130
    except BrokenPipeError:
        # Nothing more can be written; Python would complain at exit while flushing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _main(argv: Sequence[str] | None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["bench"]:  # its own parser reads the rest (--help too)
        from mesolite.lab.bench import main as bench

        return bench(raw[1:])
    args = build_parser().parse_args(argv)
    if args.command in VIEWS:
        return show(args)
    if args.command in ("teardown", "kill"):
        return run_operator(args)
    if args.command == "certs":
        return run_certs(args)
    if args.command == "simulate":
        from mesolite.cli._simulate import run_simulate

        return run_simulate(args)
    if args.command in ("run", "stop"):
        return run_workload(args) if args.command == "run" else stop_workload(args)
    if args.command != "demo":  # the demo logs to files under its work dir
        logs.configure(json=args.log_json, level=args.log_level)
    runners = {
        "master": _run_master,
        "agent": _run_agent,
        "demo": _run_demo,
        "experiment": _run_experiment,
    }
    return asyncio.run(runners[args.command](args))


async def _until_signalled(lost: asyncio.Event | None = None) -> bool:
    """Until SIGINT or SIGTERM (False), or `lost` is set (True)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait())]
    if lost is not None:
        waits.append(asyncio.create_task(lost.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    return lost is not None and lost.is_set()


async def _run_master(args: argparse.Namespace) -> int:
    from mesolite.master.acl import AclError
    from mesolite.master.config import heartbeat_problem
    from mesolite.master.master import MasterConfig
    from mesolite.master.registry import RegistryError
    from mesolite.master.role_config import RolesConfigError
    from mesolite.master.server import MasterServer

    try:
        tls = _master_tls(args)
    except TlsError as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        return 2
    if problem := heartbeat_problem(args.agent_heartbeat_interval, args.agent_timeout):
        print(f"mesolite master: {problem}", file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    config = MasterConfig(
        allocation_interval=args.allocation_interval,
        offer_timeout=args.offer_timeout,
        agent_timeout=args.agent_timeout,
        agent_heartbeat_interval=args.agent_heartbeat_interval,
        weights=args.weights,
        roles_file=args.roles,
        acls_file=args.acls,
        policy=args.policy,
        preemption=args.preemption,
        preemption_grace=args.preemption_grace,
        packing=args.packing,
        reservations=args.reservations,
        work_dir=args.work_dir,
        max_completed_frameworks=args.max_completed_frameworks,
        max_completed_tasks_per_framework=args.max_completed_tasks_per_framework,
        check_invariants=args.check_invariants,
        agent_reregister_timeout=args.agent_reregister_timeout,
        http_allowed_hosts=args.http_allowed_hosts,
        event_streams=args.event_streams,
        event_streams_per_client=args.event_streams_per_client,
        tls=tls,
        credentials_file=args.credentials,
        insecure=args.insecure,
    )
    from mesolite.workloads import http as workloads_http

    try:
        runner = workload_runner(args, tls)  # the built-in jobs and services
    except (MesoliteError, OSError) as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        return 2
    ha = None
    registry = None
    port, http_port = args.port, args.http_port
    if args.registry is not None:
        try:
            ha = _ha_master(args, tls)
            await ha.start()
        except (ValueError, MesoliteError, OSError) as e:
            print(f"mesolite master: {e}", file=sys.stderr)
            if ha is not None:
                await ha.close()
            return 2
        print(
            f"standby master {ha.master_id}: gRPC {args.host}:{ha.port}, HTTP "
            f"{args.host}:{ha.http_port}; waiting to lead (registry {args.registry})",
            flush=True,
        )
        try:
            registry = await _until_leading_or_signalled(ha)
        except (RegistryError, MesoliteError) as e:
            print(f"mesolite master: {e}", file=sys.stderr)
            await ha.close()
            return 2
        if registry is None:
            await ha.close()
            return 0
        port, http_port = ha.port, ha.http_port
    server = MasterServer(
        config,
        args.host,
        port,
        http_port,
        token_port=args.token_port,
        routes=workloads_http.routes(lambda: runner),
        workloads=runner.views if runner is not None else None,
        registry=registry,
        leadership=ha.election if ha is not None else None,
        master_id=ha.master_id if ha is not None else None,
    )
    try:
        await server.start()
        if runner is not None:
            # Over the master's own gRPC port, as any framework (loopback if it listens
            # on every address).
            await runner.start(_loopback(server.grpc_address))
    except (RolesConfigError, AclError, RegistryError, MesoliteError, OSError) as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        if runner is not None:
            await runner.close()
        await server.stop()
        if ha is not None:
            await ha.close()
        return 2
    if server.master is not None:
        master = server.master

        def reload() -> None:
            master.reload_roles()
            master.reload_acls()
            server.authn.reload()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        if ha is not None and ha.election is not None:
            # Lost the lease or a guarded write refused: stop serving at once.
            ha.election.on_lost(lambda reason: server.step_down())
    lost = False
    try:
        print(_next_steps(server, args.tls_dir), flush=True)
        lost = await _until_signalled(ha.election.lost if ha and ha.election else None)
    finally:
        if runner is not None:
            await runner.close()  # its frameworks fail over when the master is back
        await server.stop(grace=0.0 if lost else 1.0)
        if ha is not None:
            await ha.close()
    if lost:
        print("mesolite master: leadership lost; exiting (restart to stand by)", file=sys.stderr)
        return 3
    return 0


def _ha_master(args: argparse.Namespace, tls: TlsConfig | None) -> HaMaster:
    from mesolite.http_hosts import AllowedHosts
    from mesolite.master.etcd_client import EtcdTls
    from mesolite.master.ha import HaMaster, RegistryUrl

    etcd_tls = None
    if args.etcd_ca is not None:
        etcd_tls = EtcdTls(args.etcd_ca, args.etcd_cert, args.etcd_key, args.etcd_server_name)
    elif args.etcd_cert is not None or args.etcd_key is not None:
        raise ValueError("--etcd-cert and --etcd-key need --etcd-ca")
    return HaMaster(
        RegistryUrl.parse(args.registry),
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        tls=tls,
        etcd_tls=etcd_tls,
        ttl=args.leader_ttl,
        advertise_host=args.advertise_host,
        allowed_hosts=AllowedHosts(args.http_allowed_hosts, args.host),
        compaction_interval=args.etcd_compaction_interval,
    )


async def _until_leading_or_signalled(ha: HaMaster) -> EtcdRegistry | None:
    """The registry once this master leads; None if it was told to stop first."""
    leading = asyncio.create_task(ha.until_leading())
    signalled = asyncio.create_task(_until_signalled())
    done, _ = await asyncio.wait({leading, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if leading in done:
        signalled.cancel()
        return leading.result()
    leading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leading
    return None


def _loopback(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "::", "[::]", "") else address


def _master_tls(args: argparse.Namespace) -> TlsConfig | None:
    """From the flags only: a shell's MESOLITE_TLS_DIR is a client's bundle."""
    tls = tls_options.tls_config(args)
    if tls is not None and not tls.has_certificate:
        raise TlsError("the master needs its certificate and key (tls.crt, tls.key)")
    return tls


def _next_steps(server: MasterServer, tls_dir: Path | None) -> str:
    """What to type next: the commands to join an agent, run a framework and look."""
    grpc, http = server.grpc_address, server.http_address
    agent_tls = framework_tls = admin_tls = ""
    if tls_dir is not None:
        # Bundles made by `certs init` sit beside the master's.
        agent_tls = f" --tls-dir {tls_dir.parent / 'agent'}"
        framework_tls = f" --tls-dir {tls_dir.parent / 'framework'}"
        admin_tls = f" --tls-dir {tls_dir.parent / 'admin'}"
    elif server.config.tls is not None:
        agent_tls = framework_tls = admin_tls = " --tls-dir DIR"
    master_id = server.master.master_id if server.master else ""
    if server.config.tls is None:
        security = "INSECURE: " if server.config.insecure else ""
        security += "no TLS, no authentication"
    else:
        security = "TLS, every call authenticated"
        if server.token_port:
            security += f"; bearer tokens on gRPC port {server.token_port}"
    return (
        f"mesolite master {master_id} is listening on {grpc} (HTTP {http}); {security}\n"
        f"  join an agent:       mesolite agent --master {grpc}{agent_tls} "
        '--resources "cpus:4;mem:8192" --work-dir work-dirs/agent1\n'
        f"  run a framework:     python examples/batch_framework.py --master "
        f"{grpc}{framework_tls} --name batch --cpus 1 --mem 512 --duration 5 --tasks 10\n"
        f"  look at the cluster: mesolite state --master {http}{admin_tls}\n"
        f"  run a job/service:   mesolite run examples/sweep.toml --master {http}{admin_tls}\n"
        f"  web UI:              {server.http_url}/"
    )


async def _run_agent(args: argparse.Namespace) -> int:
    from mesolite.agent import Agent, AgentConfig, AgentError
    from mesolite.agent.resources import detect_resources
    from mesolite.agent.sandbox_http import SandboxServer, host_towards

    http_serving.raise_descriptor_limit()

    try:
        auth = tls_options.client_auth(args)
    except TlsError as e:
        print(f"mesolite agent: {e}", file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    given: Resources
    named: set[str]
    given, named = args.resources or (Resources(), set())
    detected = detect_resources(args.work_dir, given)
    # Only what the flag did not name is detected: `disk:0` means no disk.
    resources = Resources({n: a for n, a in detected.items() if n not in named or n in given})
    # Task output for the master's web UI, read-only; the agent registers its address.
    towards_master = await asyncio.to_thread(host_towards, args.master)
    host = args.http_host or towards_master
    wildcard = host in ("0.0.0.0", "::")
    if auth.tls is not None and not auth.tls.has_certificate:
        # HTTPS needs a certificate: an agent with only a token serves no sandboxes.
        print(
            "mesolite agent: no certificate in the TLS bundle: task sandboxes are not served",
            file=sys.stderr,
        )
        sandboxes = None
    else:
        sandboxes = SandboxServer(
            args.work_dir,
            host,
            args.http_port,
            advertise_host=towards_master if wildcard else None,
            tls=auth.tls,
            allowed_hosts=args.http_allowed_hosts,
            readers=(args.master_principal,),
            insecure=args.insecure,
        )
        try:
            await sandboxes.start()
        except (OSError, MesoliteError) as e:
            print(f"mesolite agent: cannot serve task sandboxes on {host}: {e}", file=sys.stderr)
            return 2
    try:
        agent = Agent(  # decides how to contain tasks: AgentError if it cannot as asked
            AgentConfig(
                args.master,
                resources,
                args.work_dir,
                address=sandboxes.address if sandboxes else "",
                attributes=args.attributes,
                isolation=isolation_config(args),
                gc=gc_config(args),
                tls=auth.tls,
                token=auth.token,
                **({"hostname": args.hostname} if args.hostname else {}),
            )
        )
    except AgentError as e:
        if sandboxes is not None:
            await sandboxes.stop()
        print(f"mesolite agent: {e}", file=sys.stderr)
        return 2
    try:
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
    finally:
        if sandboxes is not None:
            await sandboxes.stop()
    return 0


async def _run_demo(args: argparse.Namespace) -> int:
    from mesolite.lab.demo import run_demo

    return await run_demo(args)


async def _run_experiment(args: argparse.Namespace) -> int:
    if args.experiment in PAPER_COMMANDS:
        return await asyncio.to_thread(run_paper_command, args)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            "mesolite experiment draws figures with matplotlib: pip install 'mesolite[lab]'",
            file=sys.stderr,
        )
        return 2
    from mesolite.lab import experiment

    # Every offer at info level would drown the progress lines: warning unless debugging.
    logs.configure(json=args.log_json, level="debug" if args.log_level == "debug" else "warning")
    return await experiment.run(args)
