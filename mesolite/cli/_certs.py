"""`mesolite certs init|issue|token`: write a cluster's certificates (mesolite/certs.py),
say what was written and how to use it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mesolite import certs
from mesolite.errors import MesoliteError


def run_certs(args: argparse.Namespace) -> int:
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
    print(f"  ACLs         {directory}/acls.json (edit it: which principal may do what)")
    tokens = f" --credentials {credentials} --token-port 5052" if credentials else ""
    print(
        "then:\n"
        f"  mesolite master --tls-dir {bundles['master']}{tokens} --acls {directory}/acls.json\n"
        f"  mesolite agent --master 127.0.0.1:5050 --tls-dir {bundles['agent']}\n"
        f"  mesolite state --master 127.0.0.1:5051 --tls-dir {directory}/admin"
    )
