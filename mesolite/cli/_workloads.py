"""`mesolite run FILE` and `mesolite stop NAME`: the master's built-in jobs and services
(mesolite/workloads/), and the options of `mesolite master` that run them.

`run` checks the file here first (the same checks the master makes, so a typo is
reported without a round trip), then POSTs it to the master's HTTP port (through
`_master_http`, as `mesolite teardown` does), where it is authorized for the caller's
principal and handed to the built-in frameworks. `mesolite jobs` and `mesolite
services` (views, mesolite/views.py) show how they are doing.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import structlog

from mesolite import tls_options
from mesolite.certs import WORKLOADS
from mesolite.cli._master_http import MasterRefused, MasterUnreachable, request_json
from mesolite.tls import TlsConfig, TlsError
from mesolite.workloads import RunnerConfig, WorkloadFileError, WorkloadRunner, load_workload
from mesolite.workloads.spec import JobSpec

log = structlog.get_logger(__name__)

STORE_FILE = "workloads.sqlite"
_MASTER_HELP = "the master's HTTP address (its --http-port)"


def add_parsers(sub: Any) -> None:
    """`mesolite run` and `mesolite stop`."""
    r = sub.add_parser(
        "run",
        help="submit a job or a service (a TOML file) to the master's built-in frameworks",
        description="Submit a workload file: a [job] (a command run once per index, "
        "`parallelism` at a time, a failed index retried up to `retries` times) or a "
        "[service] (`instances` copies kept running). The master runs it; watch it with "
        "`mesolite jobs` or `mesolite services`, end it with `mesolite stop NAME`.",
    )
    r.add_argument(
        "file", type=Path, metavar="FILE", help="a workload file, e.g. examples/sweep.toml"
    )
    r.add_argument(
        "--master", default="127.0.0.1:5051", metavar="HOST:HTTP_PORT", help=_MASTER_HELP
    )
    tls_options.add_client_options(r)
    s = sub.add_parser("stop", help="stop a job or a service that `mesolite run` submitted")
    s.add_argument("name", metavar="NAME")
    s.add_argument(
        "--master", default="127.0.0.1:5051", metavar="HOST:HTTP_PORT", help=_MASTER_HELP
    )
    tls_options.add_client_options(s)


def add_master_options(m: argparse.ArgumentParser) -> None:
    g = m.add_argument_group(
        "built-in jobs and services",
        "The master runs the workloads `mesolite run` submits, as frameworks of its own "
        f"(state in WORK_DIR/{STORE_FILE}).",
    )
    g.add_argument(
        "--no-workloads", action="store_true", help="run no built-in job and service frameworks"
    )
    g.add_argument(
        "--workloads-tls-dir",
        type=Path,
        metavar="DIR",
        help=f"with TLS, the bundle the built-in frameworks connect with (default: the "
        f"'{WORKLOADS}' bundle beside --tls-dir)",
    )


def workload_runner(args: argparse.Namespace, tls: TlsConfig | None) -> WorkloadRunner | None:
    """The master's built-in workload runner, as its options say (None: --no-workloads)."""
    if args.no_workloads:
        return None
    disabled = ""
    bundle: TlsConfig | None = None
    if tls is not None:
        directory = args.workloads_tls_dir or (
            args.tls_dir.parent / WORKLOADS if args.tls_dir is not None else None
        )
        if directory is None or not (directory / "tls.crt").exists():
            disabled = (
                "this master has TLS but no certificate for its built-in workloads: make one "
                f"with `mesolite certs issue CERTS_DIR {WORKLOADS}` and give it to the master "
                "with --workloads-tls-dir"
            )
            log.warning("built-in workloads are off", reason=disabled)
        else:
            bundle = TlsConfig.from_dir(directory)
    return WorkloadRunner(
        RunnerConfig(store=args.work_dir / STORE_FILE, tls=bundle, disabled=disabled)
    )


def run_workload(args: argparse.Namespace) -> int:
    """`mesolite run FILE`."""
    try:
        spec = load_workload(args.file)
        auth = tls_options.client_auth(args)
    except (WorkloadFileError, TlsError) as e:
        print(f"mesolite run: {e}", file=sys.stderr)
        return 2
    body = {"source": str(args.file), "text": args.file.read_text(encoding="utf-8")}
    try:
        request_json(args.master, "/workloads", auth, method="POST", body=body)
    except (MasterRefused, MasterUnreachable) as e:
        print(f"mesolite run: {e}", file=sys.stderr)
        return 1
    what = (
        f"job {spec.name!r}: {spec.completions} indices, {spec.parallelism} at a time, "
        f"{spec.retries} retries per index"
        if isinstance(spec, JobSpec)
        else f"service {spec.name!r}: {spec.instances} instances, restart {spec.restart.policy}"
    )
    view = "jobs" if isinstance(spec, JobSpec) else "services"
    print(
        f"submitted {what}, role {spec.role!r}\n"
        f"  watch it: mesolite {view} --master {args.master} --watch\n"
        f"  stop it:  mesolite stop {spec.name} --master {args.master}",
        flush=True,
    )
    return 0


def stop_workload(args: argparse.Namespace) -> int:
    """`mesolite stop NAME`."""
    try:
        auth = tls_options.client_auth(args)
    except TlsError as e:
        print(f"mesolite stop: {e}", file=sys.stderr)
        return 2
    name = urllib.parse.quote(args.name, safe="")
    try:
        answer = request_json(args.master, f"/workloads/{name}/stop", auth, method="POST", body={})
    except (MasterRefused, MasterUnreachable) as e:
        print(f"mesolite stop: {e}", file=sys.stderr)
        return 1
    kind = answer.get("kind", "workload") if isinstance(answer, dict) else "workload"
    print(f"stopped {kind} {args.name!r}", flush=True)
    return 0
