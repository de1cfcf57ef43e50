"""`mesolite teardown FRAMEWORK_ID` and `mesolite kill FRAMEWORK_ID TASK_ID`: the
master's operator API (`POST /api/v1/...`, master/operator_api.py), over the same
HTTP port, TLS and principal as the views.

Exit codes: 0 done; 1 the master refused (the message says why: no such framework,
already ended, not allowed by the ACLs, ...) or could not be reached; 2 bad options.
"""

from __future__ import annotations

import argparse
import json
import sys
from urllib.parse import quote

from mesolite import tls_options
from mesolite.cli._master_http import MasterRefused, MasterUnreachable, request_json
from mesolite.tls import TlsError


def _path(args: argparse.Namespace) -> str:
    framework = quote(args.framework_id, safe="")
    if args.command == "teardown":
        return f"/api/v1/frameworks/{framework}/teardown"
    return f"/api/v1/frameworks/{framework}/tasks/{quote(args.task_id, safe='')}/kill"


def run_operator(args: argparse.Namespace) -> int:
    """`mesolite teardown|kill`: ask the master; print what it did, or why it would not."""
    try:
        auth = tls_options.client_auth(args)
    except TlsError as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 2
    try:
        answer = request_json(args.master, _path(args), auth, method="POST", body={})
    except (MasterRefused, MasterUnreachable) as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(answer.get("message", "done") if isinstance(answer, dict) else "done")
    return 0


__all__ = ["run_operator"]
