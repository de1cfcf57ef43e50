"""The `mesolite` command line: its subcommands, their options, and the parsing of
option values. Defaults come from the processes' config objects, never restated here;
`--help` shows each one (`_HelpFormatter`, inherited by every subcommand's parser)."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

from mesolite import tls_options
from mesolite.agent.gc_policy import GcConfig
from mesolite.agent.isolation import MODES as ISOLATION_MODES
from mesolite.agent.isolation import IsolationConfig
from mesolite.cli import _simulate, _workloads
from mesolite.cli._paper import add_paper_commands
from mesolite.http_hosts import normal_host
from mesolite.lab.demo_scenario import AGENT_RESOURCES
from mesolite.master.config import MasterConfig
from mesolite.master.policies import POLICIES
from mesolite.resources import InvalidResources, Resources
from mesolite.views import VIEWS

MASTER = MasterConfig()
ISOLATION = IsolationConfig()
GC = GcConfig()


class _HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, "(default: X)", unless there is none to
    show (None, False, an empty value) or its help already speaks of it."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    if default is None or default is argparse.SUPPRESS or isinstance(default, bool):
        return False
    if isinstance(default, str | tuple | list | dict) and not default:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, "*")


class _Parser(argparse.ArgumentParser):
    """Every `mesolite` parser: subcommands' parsers are made of the same class, so
    they show their defaults too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


_DESCRIPTION = (
    "The `mesolite` command: run a master or an agent, a local demo, or look at a master\n"
    "(`mesolite state|agents|frameworks|roles|tasks|jobs|services`, rendered by\n"
    "mesolite/views.py); act on it as an operator (`mesolite teardown FRAMEWORK_ID`,\n"
    "`mesolite kill FRAMEWORK_ID TASK_ID`); run jobs and services (`mesolite run FILE`);\n"
    "make a cluster's certificates (`mesolite certs init DIR`)."
)


def _add_isolation_options(a: argparse.ArgumentParser) -> None:
    """How the agent contains its tasks (agent/isolation.py; README: Isolation)."""
    g = a.add_argument_group("isolation")
    g.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default=ISOLATION.mode,
        help="auto: a cgroup per task where the agent can create them, else the "
        "process-tree fallback (rlimits, kill by process tree), logged at start; "
        "cgroups: refuse to start without them; process-tree: the fallback",
    )
    g.add_argument(
        "--cgroups-root",
        default=ISOLATION.cgroups_root,
        metavar="NAME",
        help="the directory under each cgroup hierarchy for tasks' cgroups",
    )
    g.add_argument(
        "--cpu-hard-limit",
        action="store_true",
        help="hold each task to its cpus with a CFS quota, not only shares under "
        "contention (Mesos' --cgroups_enable_cfs)",
    )
    g.add_argument(
        "--pids-limit",
        type=int,
        default=ISOLATION.pids_limit,
        metavar="N",
        help="processes and threads per task (0: no limit)",
    )
    g.add_argument(
        "--task-user",
        default=ISOLATION.task_user,
        metavar="USER",
        help="who runs tasks when the agent runs as root (Mesos' --switch_user)",
    )
    g.add_argument(
        "--no-switch-user",
        action="store_true",
        help="run tasks as the agent's own user, root included",
    )
    g.add_argument(
        "--pass-env",
        type=lambda text: tuple(filter(None, (n.strip() for n in text.split(",")))),
        default=ISOLATION.pass_env,
        metavar="NAME,...",
        help="the agent's environment variables tasks get besides PATH, LANG, LC_*, TZ",
    )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> float:
    """Seconds, or a number with a unit: 30s, 10m, 12h, 2d, 1w."""
    text = text.strip()
    unit = _UNITS.get(text[-1:].lower()) if text else None
    number = text[:-1] if unit else text
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds or a duration like 30s, 10m, 12h, 2d, 1w; got {text!r}"
        ) from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _duration_text(seconds: float) -> str:
    for unit, size in sorted(_UNITS.items(), key=lambda u: -u[1]):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction above 0, at most 1; got {text!r}")
    return value


def _add_gc_options(a: argparse.ArgumentParser) -> None:
    """When the agent removes ended tasks' sandboxes (agent/gc_policy.py)."""
    g = a.add_argument_group(
        "sandbox garbage collection",
        "An ended task's sandbox (and the agent's records of it) is removed once older "
        "than --gc-delay scaled by the free disk: --gc-delay x (W - used) / W of the work "
        "dir's filesystem, with W the --disk-watermark-gc (as Mesos' --gc_delay and "
        "--gc_disk_headroom = 1 - W). A running task's, or one whose end is not yet "
        "acknowledged, is never removed.",
    )
    g.add_argument(
        "--gc-delay",
        type=_duration,
        default=_duration_text(GC.delay),
        metavar="DURATION",
        help="how long an ended task's sandbox is kept on an empty disk (30s, 10m, 12h, 2d, 1w)",
    )
    g.add_argument(
        "--disk-watermark-gc",
        type=_fraction,
        default=GC.disk_watermark,
        metavar="FRACTION",
        help="the used fraction of the work dir's filesystem at which every ended task's "
        "sandbox is removed; below it the allowed age shrinks as the disk fills",
    )
    g.add_argument(
        "--disk-watch-interval",
        type=_duration,
        default=_duration_text(GC.interval),
        metavar="DURATION",
        help="how often the disk is checked (a sandbox that comes due is removed on time)",
    )


def gc_config(args: argparse.Namespace) -> GcConfig:
    """The agent's `GcConfig` from its garbage collection options."""
    return GcConfig(
        delay=args.gc_delay,
        disk_watermark=args.disk_watermark_gc,
        interval=max(args.disk_watch_interval, 0.1),
    )


def isolation_config(args: argparse.Namespace) -> IsolationConfig:
    """The agent's `IsolationConfig` from its isolation options."""
    return IsolationConfig(
        mode=args.isolation,
        cgroups_root=args.cgroups_root,
        cpu_hard_limit=args.cpu_hard_limit,
        pids_limit=args.pids_limit or None,
        task_user=None if args.no_switch_user else args.task_user,
        pass_env=args.pass_env,
    )


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


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def _parse_hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    bad = [h for h in hosts if h != "*" and normal_host(h) is None]
    if bad:
        raise argparse.ArgumentTypeError(f"not a host name: {bad[0]!r}")
    return hosts


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mesolite", description=_DESCRIPTION)
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    sub = parser.add_subparsers(dest="command", required=True)

    m = sub.add_parser("master", help="run a master")
    m.add_argument("--host", default="127.0.0.1", help="address to listen on")
    m.add_argument("--port", type=int, default=5050, help="gRPC port (0: any free port)")
    m.add_argument(
        "--http-port", type=int, default=5051, help="HTTP port for /state and the web UI"
    )
    m.add_argument(
        "--work-dir",
        type=Path,
        default=Path("work-dirs/master"),
        help="where the registry (registry.sqlite) is kept across restarts",
    )
    m.add_argument(
        "--allocation-interval",
        type=_positive,
        default=MASTER.allocation_interval,
        metavar="S",
        help="seconds between allocation cycles (also run at once when resources are freed)",
    )
    m.add_argument(
        "--offer-timeout",
        type=_positive,
        default=MASTER.offer_timeout,
        metavar="S",
        help="rescind an offer not answered within this",
    )
    m.add_argument(
        "--agent-timeout",
        type=_positive,
        default=MASTER.agent_timeout,
        metavar="S",
        help="remove an agent silent for this long (Mesos: 5 missed pings)",
    )
    m.add_argument(
        "--agent-heartbeat-interval",
        type=_positive,
        default=MASTER.agent_heartbeat_interval,
        metavar="S",
        help="how often agents heartbeat (the master tells them when they register)",
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
        "--http-allowed-hosts",
        type=_parse_hosts,
        default=(),
        metavar="NAME,...",
        help="host names the HTTP server answers besides --host, localhost and this "
        "machine's name (a defence against DNS rebinding); '*' for any",
    )
    m.add_argument(
        "--event-streams",
        type=int,
        default=MASTER.event_streams,
        metavar="N",
        help="web UI event streams served at once (then 503)",
    )
    m.add_argument(
        "--event-streams-per-client",
        type=int,
        default=MASTER.event_streams_per_client,
        metavar="N",
        help="event streams one client (principal, else IP address) may hold (then 429)",
    )
    m.add_argument(
        "--max-completed-frameworks",
        type=_count,
        default=MASTER.max_completed_frameworks,
        metavar="N",
        help="frameworks that ended kept in /state, the CLI and the web UI, with their "
        "ended tasks (in memory: a restarted master starts with none)",
    )
    m.add_argument(
        "--max-completed-tasks-per-framework",
        type=_count,
        default=MASTER.max_completed_tasks_per_framework,
        metavar="N",
        help="ended tasks kept per framework, live or completed (exit codes, reasons, end times)",
    )
    m.add_argument(
        "--policy",
        choices=POLICIES,
        default=MASTER.policy,
        help="how shares are measured: dominant share, asset sum, or slots",
    )
    m.add_argument(
        "--no-preemption",
        dest="preemption",
        action="store_false",
        help="never take resources back for roles below their guarantee or fair share "
        "(by default a guaranteed role preempts after its min_share_timeout, 15 s)",
    )
    m.add_argument(
        "--preemption-grace",
        type=_duration,
        default=MASTER.preemption_grace,
        metavar="SECONDS",
        help="how long a framework is told before its task is preempted",
    )
    m.add_argument(
        "--packing",
        action="store_true",
        help="offer a framework that declared a demand one task at a time, on the agent "
        "where its shape fits best, to leave less room stranded (off by default)",
    )
    m.add_argument(
        "--no-reservations",
        dest="reservations",
        action="store_false",
        help="with --packing, never reserve an agent for a task shape that fits nowhere "
        "yet (by default the first framework in order may hold a few agents until it fits)",
    )
    _add_master_security(m)
    _add_master_ha(m)
    _workloads.add_master_options(m)

    a = sub.add_parser("agent", help="run an agent")
    a.add_argument(
        "--master",
        required=True,
        metavar="HOST:PORT",
        help="the master's gRPC address; highly available masters: H1:P1,H2:P2,... (the agent "
        "follows the leader a standby names)",
    )
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
    a.add_argument(
        "--http-allowed-hosts",
        type=_parse_hosts,
        default=(),
        metavar="NAME,...",
        help="host names the sandbox server answers besides the address it listens on, "
        "localhost and this machine's name; '*' for any",
    )
    _add_isolation_options(a)
    _add_gc_options(a)
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

    _add_certs(sub)

    bench = sub.add_parser(
        "bench",
        help="load a master with simulated agents and frameworks (mesolite bench --help)",
        add_help=False,  # its own parser, mesolite/lab/bench, reads everything after it
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)

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
    e.add_argument(
        "--packing",
        action="store_true",
        help="the jobs declare their demand and the master places it where it fits best "
        "(writes dynamic-sharing-POLICY-packing.*)",
    )
    add_paper_commands(xs)

    for name, view in VIEWS.items():
        s = sub.add_parser(name, help=view.help)
        _add_master_address(s)
        s.add_argument("--json", action="store_true", help=f"print the raw JSON of {view.json}")
        if view.history is not None:
            s.add_argument(
                "--all",
                action="store_true",
                help=f"also those that ended, as the master keeps them ({view.history_part})",
            )
        s.add_argument(
            "--watch",
            nargs="?",
            const=2.0,
            type=_positive,
            metavar="SECONDS",
            help="show it again every SECONDS (default 2) until Ctrl-C",
        )
        tls_options.add_client_options(s)
    _add_operator_commands(sub)
    _workloads.add_parsers(sub)
    _simulate.add_parser(sub)
    return parser


def _add_master_address(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--master",
        default="127.0.0.1:5051",
        metavar="HOST:HTTP_PORT",
        help="the master's HTTP address (its --http-port)",
    )


def _add_operator_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """`mesolite teardown|kill`: the master's operator API (master/operator_api.py),
    allowed by the ACLs' teardown_frameworks and kill_tasks."""
    t = sub.add_parser(
        "teardown",
        help="tear a framework down: its tasks killed, then it is removed (kept in the "
        "history: mesolite frameworks --all)",
        description="Tear a framework down, as if it had asked: its offers are taken "
        "back, its tasks killed, and it is removed once they have ended. Needs the ACLs' "
        "teardown_frameworks for the framework's principal.",
    )
    t.add_argument("framework_id", metavar="FRAMEWORK_ID")
    k = sub.add_parser(
        "kill",
        help="kill one task of a framework (the framework hears TASK_KILLED)",
        description="Kill one task, as if its framework had asked: its agent kills it and "
        "the framework is told how it ended. Needs the ACLs' kill_tasks for the "
        "framework's principal.",
    )
    k.add_argument("framework_id", metavar="FRAMEWORK_ID")
    k.add_argument("task_id", metavar="TASK_ID")
    for s in (t, k):
        _add_master_address(s)
        s.add_argument("--json", action="store_true", help="print the master's JSON answer")
        tls_options.add_client_options(s)


def _add_master_security(m: argparse.ArgumentParser) -> None:
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


def _add_certs(sub: argparse._SubParsersAction[Any]) -> None:
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


def _add_master_ha(m: argparse.ArgumentParser) -> None:
    g = m.add_argument_group(
        "highly available masters (README: Running highly available)",
        "With --registry etcd://..., several masters share one registry in etcd; one leads "
        "and the others stand by (refusing calls with the leader's address, HTTP 307 to it).",
    )
    g.add_argument(
        "--registry",
        default=None,
        metavar="URL",
        help="etcd://HOST:PORT,HOST:PORT,.../PREFIX: keep the registry in etcd and elect a "
        "leader there (default: SQLite in --work-dir, a single master)",
    )
    g.add_argument(
        "--leader-ttl",
        type=int,
        default=5,
        metavar="S",
        help="the leader's etcd lease: a standby takes over about this long after the "
        "leader dies; a leader cut off from etcd this long stops (default 5)",
    )
    g.add_argument(
        "--advertise-host",
        default=None,
        metavar="HOST",
        help="the address other masters and clients reach this one at (default: --host)",
    )
    g.add_argument(
        "--etcd-compaction-interval",
        type=float,
        default=300.0,
        metavar="S",
        help="the leader compacts etcd's history this often (0: never)",
    )
    g.add_argument("--etcd-ca", type=Path, default=None, help="CA to verify etcd's members with")
    g.add_argument("--etcd-cert", type=Path, default=None, help="client certificate for etcd")
    g.add_argument("--etcd-key", type=Path, default=None, help="key of --etcd-cert")
    g.add_argument(
        "--etcd-server-name",
        default=None,
        metavar="NAME",
        help="the name etcd's certificates hold (default: the first endpoint's host)",
    )
