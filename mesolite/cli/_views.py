"""`mesolite state|agents|frameworks|roles|tasks`: fetch a master's `GET /state` and
print one view of it (rendered by `mesolite/views.py`), once or again and again."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from mesolite import tls_options
from mesolite.cli._master_http import (
    NOT_A_MASTER,
    MasterRefused,
    MasterUnreachable,
    base_url,
    request_json,
)
from mesolite.snapshot import ClusterSnapshot, DocumentError
from mesolite.tls import TlsError
from mesolite.tls_options import PLAINTEXT, ClientAuth
from mesolite.views import VIEWS, View

# Output width when piped: wide enough that table rows are never wrapped.
_WIDE_OUTPUT = 250


def _fetch_state(
    address: str, auth: ClientAuth = PLAINTEXT, *, history: bool = True
) -> ClusterSnapshot:
    """The master's state; without `history`, no ended task (the master sends less)."""
    url = base_url(address, auth)
    try:
        data = request_json(address, "/state" if history else "/state?completed_tasks=0", auth)
    except MasterRefused as e:
        if e.status in (401, 403):
            raise MasterUnreachable(str(e)) from None
        raise MasterUnreachable(f"{url}/state answered {e.status}: {NOT_A_MASTER}") from None
    if not isinstance(data, dict) or "cluster" not in data:
        raise MasterUnreachable(f"{url}/state is not a master's state: {NOT_A_MASTER}")
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


def show(args: argparse.Namespace) -> int:
    """`mesolite state|agents|frameworks|roles|tasks`: fetch /state and print one view."""
    view = VIEWS[args.command]
    try:
        args.auth = tls_options.client_auth(args)
    except TlsError as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 2
    history = getattr(args, "all", False)
    # The ended tasks only when shown: with the history, or in all of /state's JSON.
    args.full_state = history or (args.json and view.part is None)
    if args.watch is not None:
        return _watch(view, args)
    try:
        with Console(stderr=True).status(f"reading the state of {args.master}"):
            state = _fetch_state(args.master, args.auth, history=args.full_state)
    except MasterUnreachable as e:
        print(f"mesolite {args.command}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(view.json_of(state, history), indent=2))
    else:
        _print(_console(), view.render_all(state, history))
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
    history = getattr(args, "all", False)
    # Started in the background by a shell, we may inherit SIGINT ignored; Ctrl-C
    # (and SIGTERM) must still stop the watch.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    def frame() -> RenderableType:
        try:
            state = _fetch_state(args.master, args.auth, history=args.full_state)
        except MasterUnreachable as e:
            return Text(f"{e}\ntrying again every {every:g}s; Ctrl-C to stop", style="red")
        footer = f"\n{time.strftime('%H:%M:%S')}  {args.master}, every {every:g}s; Ctrl-C to stop"
        return Group(view.render_all(state, history), Text(footer, style="dim"))

    try:
        if args.json:
            while True:
                try:
                    state = _fetch_state(args.master, args.auth, history=args.full_state)
                    print(json.dumps(view.json_of(state, history)), flush=True)
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
