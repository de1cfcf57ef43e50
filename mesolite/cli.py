"""The `mesolite` command: run a master or an agent, a local demo, or look at a master
(`mesolite state|agents|frameworks|roles|tasks`, rendered by mesolite/views.py); make a
cluster's certificates (`mesolite certs init DIR`, mesolite/certs.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from mesolite import logs, tls_options
from mesolite.errors import MesoliteError
from mesolite.lab.demo_scenario import AGENT_RESOURCES
from mesolite.master.config import MasterConfig
from mesolite.master.policies import POLICIES
from mesolite.resources import InvalidResources, Resources
from mesolite.snapshot import ClusterSnapshot, DocumentError
from mesolite.tls import TlsConfig, TlsError
from mesolite.tls_options import PLAINTEXT, ClientAuth
from mesolite.views import VIEWS, View

if TYPE_CHECKING:
    from mesolite.master.server import MasterServer

# Output width when piped: wide enough that table rows are never wrapped.
# Defaults come from the process's config object, never restated here.
MASTER = MasterConfig()
_WIDE_OUTPUT = 250


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
    m.add_argument(
        "--http-port", type=int, default=5051, help="HTTP port for /state and the web UI"
    )
    m.add_argument("--work-dir", type=Path, default=Path("work-dirs/master"))
    m.add_argument(
        "--allocation-interval", type=_positive, default=MASTER.allocation_interval, metavar="S"
    )
    m.add_argument("--offer-timeout", type=_positive, default=MASTER.offer_timeout, metavar="S")
    m.add_argument(
        "--agent-timeout",
        type=_positive,
        default=MASTER.agent_timeout,
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
        default=MASTER.agent_reregister_timeout,
        metavar="S",
        help="after a restart, agents not back within this are removed and their tasks lost "
        "(keep it above the agents' 10 s longest reconnect backoff); frameworks get this plus "
        "their failover timeout to re-subscribe",
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
        "--acls",
        type=Path,
        default=None,
        metavar="FILE",
        help="ACL file (JSON, as Mesos' --acls): who may register frameworks in which roles, "
        "register agents, view state, read sandboxes; reloaded on SIGHUP",
    )
    m.add_argument(
        "--policy",
        choices=POLICIES,
        default=MASTER.policy,
        help="how shares are measured: dominant share, asset sum, or slots",
    )
    t = m.add_argument_group(
        "TLS and authentication",
        "With TLS both ports are encrypted and every call must come from a principal: a "
        "client certificate from the CA (its CN), or a bearer token from --credentials.",
    )
    tls_options.add_file_options(
        t, "the master's bundle from `mesolite certs init` (ca.crt, tls.crt, tls.key)"
    )
    t.add_argument(
        "--credentials",
        type=Path,
        metavar="FILE",
        help="bearer tokens (principal and sha256 per line; certs init --token writes it); "
        "reloaded on SIGHUP",
    )
    t.add_argument(
        "--token-port",
        type=int,
        default=None,
        metavar="PORT",
        help="a second gRPC port for bearer-token clients (0: any free port); the main port "
        "requires certificates",
    )
    t.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without TLS (anyone who reaches it can act as anyone)",
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
    a.add_argument("--hostname", default=None, help="default: this machine's host name")
    a.add_argument(
        "--http-host",
        default=None,
        metavar="HOST",
        help="where to serve task sandboxes to the master's web UI "
        "(default: the address this machine reaches the master from)",
    )
    a.add_argument("--http-port", type=int, default=0, help="sandbox HTTP port (0: any free port)")
    tls_options.add_client_options(a)
    a.add_argument(
        "--master-principal",
        default="master",
        metavar="NAME",
        help="with TLS, the only principal the sandbox server answers (the master's CN)",
    )
    a.add_argument(
        "--insecure",
        action="store_true",
        help="allow serving sandboxes on a non-loopback address without TLS",
    )

    d = sub.add_parser(
        "demo",
        help="a local cluster and three jobs: watch DRF shift the shares as jobs come and go",
        description="One master, three agents and three jobs in this process. Two jobs "
        "share the cluster, a third joins a third of the way in, one finishes two thirds "
        "in; a live table shows each job's shares beside the split DRF should reach. "
        "Logs go to files under --work-dir.",
    )
    d.add_argument("--agents", type=int, default=3)
    d.add_argument(
        "--agent-resources",
        type=_parse_resources,
        default=AGENT_RESOURCES,
        metavar='"cpus:10;mem:30720"',
    )
    d.add_argument(
        "--duration",
        type=_positive,
        default=60.0,
        metavar="S",
        help="how long to run; each of the three phases is a third of it",
    )
    d.add_argument(
        "--task-seconds",
        type=_positive,
        default=None,
        metavar="S",
        help="average task length (default: duration/20, between 2 and 3)",
    )
    d.add_argument("--work-dir", type=Path, default=Path("work-dirs/demo"))
    d.add_argument(
        "--http-port", type=int, default=5051, help="the web UI's port (taken: any free port)"
    )

    c = sub.add_parser("certs", help="make a CA and certificates for a cluster")
    cs = c.add_subparsers(dest="certs", required=True)
    ci = cs.add_parser(
        "init",
        help="a new CA and bundles for the master, an agent, frameworks and users",
        description="Writes DIR/ca.crt and DIR/ca.key (keep it safe) and one bundle per "
        "principal, DIR/<name>/{ca.crt,tls.crt,tls.key}, for --tls-dir. A principal is its "
        "certificate's CN. Keys are 0600.",
    )
    ci.add_argument("dir", type=Path, metavar="DIR")
    ci.add_argument(
        "--principal",
        action="append",
        default=None,
        metavar="NAME",
        help="a framework or CLI user to make a certificate for (repeatable; "
        "default: framework and admin)",
    )
    ci.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name or address of the master (besides localhost, 127.0.0.1, ::1)",
    )
    ci.add_argument(
        "--agent-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name or address of the agent's sandbox server",
    )
    ci.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="NAME",
        help="a principal with a bearer token instead of a certificate (repeatable): "
        "DIR/NAME/token, and its hash in DIR/credentials for the master's --credentials",
    )
    ci.add_argument("--days", type=int, default=365, help="how long the certificates are valid")
    cn = cs.add_parser("issue", help="one more certificate from the CA in DIR")
    cn.add_argument("dir", type=Path, metavar="DIR")
    cn.add_argument("name", metavar="NAME")
    cn.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="make it a server certificate for this name (an agent on another machine)",
    )
    cn.add_argument("--days", type=int, default=365)
    ct = cs.add_parser("token", help="a bearer token for NAME, added to DIR/credentials")
    ct.add_argument("dir", type=Path, metavar="DIR")
    ct.add_argument("name", metavar="NAME")

    x = sub.add_parser("experiment", help="reproduce an experiment of the DRF paper")
    xs = x.add_subparsers(dest="experiment", required=True)
    e = xs.add_parser(
        "dynamic-sharing",
        help="two jobs whose task sizes change in three phases, on 48 agents (logs at warning)",
    )
    e.add_argument(
        "--policy",
        choices=(*POLICIES, "all"),
        default="drf",
        help="all: run every policy in turn and draw the comparison",
    )
    e.add_argument(
        "--minutes-per-phase",
        type=_positive,
        metavar="F",
        help="length of each phase (the paper's were 2; default 1/3: 20 s)",
    )
    e.add_argument("--out", type=Path, default=Path("docs/experiment"), metavar="DIR")
    e.add_argument("--agents", type=int, default=48)
    e.add_argument(
        "--task-seconds",
        type=_positive,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="each task sleeps between MIN and MAX seconds (default 4 8)",
    )
    e.add_argument(
        "--hold-seconds",
        type=float,
        metavar="S",
        help="how long a job keeps an offer too small for a task (default 2; 0: decline)",
    )
    e.add_argument("--seed", type=int, default=1)

    for name, view in VIEWS.items():
        s = sub.add_parser(name, help=view.help)
        s.add_argument(
            "--master",
            default="127.0.0.1:5051",
            metavar="HOST:HTTP_PORT",
            help="the master's HTTP address (its --http-port)",
        )
        s.add_argument("--json", action="store_true", help=f"print the raw JSON of {view.json}")
        s.add_argument(
            "--watch",
            nargs="?",
            const=2.0,
            type=_positive,
            metavar="SECONDS",
            help="show it again every SECONDS (default 2) until Ctrl-C",
        )
        tls_options.add_client_options(s)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in VIEWS:
        return _show(args)
    if args.command == "certs":
        return _certs(args)
    if args.command != "demo":  # the demo logs to files under its work dir
        logs.configure(json=args.log_json, level=args.log_level)
    runners = {
        "master": _run_master,
        "agent": _run_agent,
        "demo": _run_demo,
        "experiment": _run_experiment,
    }
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
    from mesolite.master.acl import AclError
    from mesolite.master.master import MasterConfig
    from mesolite.master.registry import RegistryError
    from mesolite.master.roles import RolesConfigError
    from mesolite.master.server import MasterServer

    try:
        tls = _master_tls(args)
    except TlsError as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        return 2
    args.work_dir.mkdir(parents=True, exist_ok=True)
    config = MasterConfig(
        allocation_interval=args.allocation_interval,
        offer_timeout=args.offer_timeout,
        agent_timeout=args.agent_timeout,
        weights=args.weights,
        roles_file=args.roles,
        acls_file=args.acls,
        policy=args.policy,
        work_dir=args.work_dir,
        check_invariants=args.check_invariants,
        agent_reregister_timeout=args.agent_reregister_timeout,
        tls=tls,
        credentials_file=args.credentials,
        insecure=args.insecure,
    )
    server = MasterServer(config, args.host, args.port, args.http_port, token_port=args.token_port)
    try:
        await server.start()
    except (RolesConfigError, AclError, RegistryError, MesoliteError, OSError) as e:
        print(f"mesolite master: {e}", file=sys.stderr)
        await server.stop()
        return 2
    if server.master is not None:
        master = server.master

        def reload() -> None:
            master.reload_roles()
            master.reload_acls()
            server.authn.reload()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    try:
        print(_next_steps(server, args.tls_dir), flush=True)
        await _until_signalled()
    finally:
        await server.stop()
    return 0


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
        f"  web UI:              {server.http_url}/"
    )


async def _run_agent(args: argparse.Namespace) -> int:
    from mesolite.agent import Agent, AgentConfig
    from mesolite.agent.resources import detect_resources
    from mesolite.agent.sandbox_http import SandboxServer, host_towards

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
            readers=(args.master_principal,),
            insecure=args.insecure,
        )
        try:
            await sandboxes.start()
        except (OSError, MesoliteError) as e:
            print(f"mesolite agent: cannot serve task sandboxes on {host}: {e}", file=sys.stderr)
            return 2
    try:
        agent = Agent(
            AgentConfig(
                args.master,
                resources,
                args.work_dir,
                address=sandboxes.address if sandboxes else "",
                attributes=args.attributes,
                tls=auth.tls,
                token=auth.token,
                **({"hostname": args.hostname} if args.hostname else {}),
            )
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
    finally:
        if sandboxes is not None:
            await sandboxes.stop()
    return 0


def _certs(args: argparse.Namespace) -> int:
    """`mesolite certs init|issue|token`: write certificates, say what was written and how
    to use it."""
    from mesolite import certs

    try:
        if args.certs == "init":
            issued = certs.init_cluster(
                args.dir,
                principals=args.principal or certs.DEFAULT_PRINCIPALS,
                hosts=args.host,
                agent_hosts=args.agent_host,
                tokens=args.token,
                days=args.days,
            )
            _print_bundles(args.dir, issued.bundles, issued.credentials)
        elif args.certs == "issue":
            bundle = certs.issue(args.dir, args.name, hosts=args.host, days=args.days)
            print(f"{bundle}: ca.crt, tls.crt, tls.key (principal {args.name!r})")
        else:
            written = certs.add_tokens(args.dir, [args.name])
            print(f"{args.dir / args.name}/token (principal {args.name!r}); its hash: {written}")
    except (MesoliteError, OSError) as e:
        print(f"mesolite certs: {e}", file=sys.stderr)
        return 2
    return 0


def _print_bundles(directory: Path, bundles: dict[str, Path], credentials: Path | None) -> None:
    print(f"CA: {directory}/ca.crt (its key {directory}/ca.key stays off the cluster)")
    for name, bundle in bundles.items():
        print(f"  {name:<12} {bundle}/   (principal {name!r})")
    if credentials is not None:
        print(f"  tokens       {credentials} (for the master), each in DIR/<name>/token")
    tokens = f" --credentials {credentials} --token-port 5052" if credentials else ""
    print(
        "then:\n"
        f"  mesolite master --tls-dir {bundles['master']}{tokens}\n"
        f"  mesolite agent --master 127.0.0.1:5050 --tls-dir {bundles['agent']}\n"
        f"  mesolite state --master 127.0.0.1:5051 --tls-dir {directory}/admin"
    )


async def _run_demo(args: argparse.Namespace) -> int:
    from mesolite.lab.demo import run_demo

    return await run_demo(args)


async def _run_experiment(args: argparse.Namespace) -> int:
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


class MasterUnreachable(MesoliteError):
    """The master's `GET /state` could not be read; the message says why and what to do."""


def _fetch_state(address: str, auth: ClientAuth = PLAINTEXT) -> ClusterSnapshot:
    scheme = "https" if auth.tls else "http"
    url = address if address.startswith(("http://", "https://")) else f"{scheme}://{address}"
    not_a_master = "is that a mesolite master's HTTP address (its --http-port)?"
    context: ssl.SSLContext | None = None
    request = urllib.request.Request(f"{url}/state")
    if auth.tls is not None:
        context = auth.tls.client_context()
    if auth.token is not None:
        request.add_header("Authorization", f"Bearer {auth.token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            data = json.load(response)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise MasterUnreachable(
                f"{url}/state answered 401: the master wants a principal. Give --tls-dir "
                "(a bundle from `mesolite certs init`), or a token with --token-file"
            ) from None
        raise MasterUnreachable(
            f"{url}/state answered {e.code} {e.reason}: {not_a_master}"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        tls_hint = "" if auth.tls else " If it uses TLS, give --tls-dir (or MESOLITE_TLS_DIR)."
        raise MasterUnreachable(
            f"cannot reach the master at {address}: {reason}. Is it running? "
            "Start one with `mesolite master`, or give its address with --master HOST:HTTP_PORT."
            + tls_hint
        ) from None
    except ValueError:  # not JSON, or not UTF-8
        raise MasterUnreachable(f"{url}/state did not answer JSON: {not_a_master}") from None
    if not isinstance(data, dict) or "cluster" not in data:
        raise MasterUnreachable(f"{url}/state is not a master's state: {not_a_master}")
    try:
        return ClusterSnapshot.from_json(data)
    except DocumentError as e:
        raise MasterUnreachable(f"{url}/state is not a state this mesolite reads: {e}") from None


def _console() -> Console:
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped or redirected: lines as long as the tables need, not wrapped at 80.
        console = Console(width=_WIDE_OUTPUT)
    return console


def _show(args: argparse.Namespace) -> int:
    """`mesolite state|agents|frameworks|roles|tasks`: fetch /state and print one view."""
    view = VIEWS[args.command]
    try:
        args.auth = tls_options.client_auth(args)
    except TlsError as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 2
    if args.watch is not None:
        return _watch(view, args)
    try:
        with Console(stderr=True).status(f"reading the state of {args.master}"):
            state = _fetch_state(args.master, args.auth)
    except MasterUnreachable as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(view.json_of(state), indent=2))
    else:
        _print(_console(), view.render(state))
    return 0


def _print(console: Console, renderable: RenderableType) -> None:
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:  # piped: no padding at the ends of lines
        console.print(renderable)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()), flush=True)


def _watch(view: View, args: argparse.Namespace) -> int:
    """Show the view again every `--watch` seconds until Ctrl-C: live on a terminal,
    one snapshot after another when piped, and one JSON document a line with --json."""
    console, every = _console(), args.watch
    # Started in the background by a shell, we may inherit SIGINT ignored; Ctrl-C
    # (and SIGTERM) must still stop the watch.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def frame() -> RenderableType:
        try:
            state = _fetch_state(args.master, args.auth)
        except MasterUnreachable as e:
            return Text(f"{e}\ntrying again every {every:g}s; Ctrl-C to stop", style="red")
        footer = f"\n{time.strftime('%H:%M:%S')}  {args.master}, every {every:g}s; Ctrl-C to stop"
        return Group(view.render(state), Text(footer, style="dim"))

    try:
        if args.json:
            while True:
                try:
                    state = _fetch_state(args.master, args.auth)
                    print(json.dumps(view.json_of(state)), flush=True)
                except MasterUnreachable as e:
                    print(f"mesolite {args.command}: {e}", file=sys.stderr, flush=True)
                time.sleep(every)
        elif console.is_terminal:
            waiting = Spinner("dots", f"reading the state of {args.master}")
            with Live(waiting, console=console, auto_refresh=True) as live:
                while True:
                    live.update(frame(), refresh=True)
                    time.sleep(every)
        else:
            while True:
                _print(console, Group(frame(), Text()))
                time.sleep(every)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
