"""Operators' views of a master: rich tables built from the JSON of `GET /state`.

Every `render_*` function is pure: a state dict in, a rich renderable out (no
I/O, no clock but the state's own `time`), so each view can be tested from a
saved state. `mesolite state|agents|frameworks|roles|tasks` (mesolite/cli.py)
fetches the state and prints one of them; `VIEWS` says which part of the JSON
each command's `--json` prints.

Amounts are shown in each resource's unit (cpus: cores; mem, disk: MB). Tables
use no colour when the output is not a terminal (rich decides).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

State = Mapping[str, Any]
Amounts = Mapping[str, float]

# Shown first, in this order; any other resource follows by name.
_KNOWN = ("cpus", "mem", "disk", "gpus")


# Formatting ------------------------------------------------------------------


def fmt_amount(value: float) -> str:
    return f"{value:.10g}"


def fmt_resources(amounts: Amounts | None) -> str:
    """`cpus:4 mem:8192`, as the `--resources` flags write them; `-` for none."""
    if not amounts:
        return "-"
    return " ".join(f"{name}:{fmt_amount(amounts[name])}" for name in _ordered(amounts))


def fmt_share(share: float) -> str:
    return f"{share:.3f}"


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {seconds}s"
    return f"{seconds}s"


def _ordered(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [n for n in _KNOWN if n in names] + sorted(names - set(_KNOWN))


def _table(title: str) -> Table:
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        caption_justify="left",
        pad_edge=False,
        show_edge=False,
    )


def _when_empty(table: Table, rows: int, message: str) -> Table:
    if rows == 0:
        table.caption = message
    return table


# Views -----------------------------------------------------------------------


def render_header(state: State) -> Text:
    """Two lines: the master, its policy and uptime; then the counts."""
    c = state["cluster"]
    up = fmt_duration(state.get("time", 0.0) - state.get("started_at", 0.0))
    text = Text()
    text.append(f"master {state['master_id']}", style="bold")
    text.append(f"  policy {state.get('policy', 'drf')}  up {up}\n")
    text.append(
        f"{c['agents']} agents, {c['frameworks']} frameworks, {c['running_tasks']} tasks, "
        f"{c['outstanding_offers']} offers outstanding"
    )
    return text


def render_cluster(state: State) -> Table:
    """Per resource: the cluster's total, what is allocated (tasks and offers) and free."""
    c = state["cluster"]
    table = _table("cluster")
    table.add_column("resource")
    for header in ("total", "allocated", "free", "allocated %"):
        table.add_column(header, justify="right")
    total: Amounts = c["total"]
    allocated: Amounts = c["allocated"]
    free: Amounts = c["free"]
    names = _ordered([*total, *allocated])
    for name in names:
        t, a = total.get(name, 0.0), allocated.get(name, 0.0)
        table.add_row(
            name,
            fmt_amount(t),
            fmt_amount(a),
            fmt_amount(free.get(name, 0.0)),
            f"{100 * a / t:.0f}%" if t else "-",
        )
    return _when_empty(table, len(names), "no resources: no agent has registered")


def render_frameworks(state: State) -> Table:
    table = _table("frameworks")
    table.add_column("id", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("weight", justify="right")
    table.add_column("dominant share", justify="right")
    table.add_column("tasks", justify="right")
    table.add_column("used")
    table.add_column("offered")
    table.add_column("status")
    frameworks = state["frameworks"]
    for f in frameworks:
        table.add_row(
            f["id"],
            f["name"],
            f["role"],
            fmt_amount(f["weight"]),
            fmt_share(f["dominant_share"]),
            str(f["running_tasks"]),
            fmt_resources(f["used"]),
            fmt_resources(f.get("offered")),
            _framework_status(f),
        )
    return _when_empty(table, len(frameworks), "no frameworks registered")


def _framework_status(f: Mapping[str, Any]) -> Text:
    if not f["connected"]:
        return Text("DISCONNECTED", style="red")
    return Text("connected, suppressed" if f.get("suppressed") else "connected", style="green")


def render_agents(state: State) -> Table:
    """Per agent: health, and what its tasks use of each resource out of its total."""
    table = _table("agents")
    table.add_column("id", no_wrap=True)
    table.add_column("hostname", no_wrap=True)
    table.add_column("health")
    table.add_column("heartbeat", justify="right")
    table.add_column("tasks", justify="right")
    table.add_column("cpus used/total", justify="right")
    table.add_column("mem used/total", justify="right")
    agents = state["agents"]
    others = _ordered(
        {n for a in agents for n in a["total"] if n not in ("cpus", "mem") and a["total"][n]}
    )
    if others:
        table.add_column("other used/total")
    table.add_column("offered")
    used = _task_usage(state)
    offered = _offered_by_agent(state)
    for a in agents:
        mine, total = used.get(a["id"], {}), a["total"]
        row: list[RenderableType] = [
            a["id"],
            a["hostname"],
            _agent_health(a),
            f"{a['seconds_since_heartbeat']:.1f}s ago",
            str(a["running_tasks"]),
            _used_of(mine, total, "cpus"),
            _used_of(mine, total, "mem"),
        ]
        if others:
            row.append(" ".join(f"{n}:{_used_of(mine, total, n)}" for n in others if n in total))
        row.append(fmt_resources(offered.get(a["id"])))
        table.add_row(*row)
    return _when_empty(table, len(agents), "no agents registered")


def _agent_health(a: Mapping[str, Any]) -> Text:
    if not a["connected"]:
        return Text("disconnected", style="red")
    if not a["healthy"]:
        return Text("UNHEALTHY", style="yellow")
    return Text("healthy", style="green")


def _used_of(used: Amounts, total: Amounts, name: str) -> str:
    return f"{fmt_amount(used.get(name, 0.0))}/{fmt_amount(total.get(name, 0.0))}"


def _task_usage(state: State) -> dict[str, dict[str, float]]:
    """What the running tasks on each agent use."""
    usage: dict[str, dict[str, float]] = {}
    for t in state["tasks"]:
        mine = usage.setdefault(t["agent_id"], {})
        for name, amount in t["resources"].items():
            mine[name] = mine.get(name, 0.0) + amount
    return usage


def _offered_by_agent(state: State) -> dict[str, dict[str, float]]:
    offered: dict[str, dict[str, float]] = {}
    for o in state.get("offers", []):
        mine = offered.setdefault(o["agent_id"], {})
        for name, amount in o["resources"].items():
            mine[name] = mine.get(name, 0.0) + amount
    return offered


def render_roles(state: State) -> Table:
    """The role tree, one line per resource: allocation against guarantee, limit and fair shares.

    Roles are indented under their parent. `share` is the role's share under the
    master's policy divided by its weight (what the allocator orders by); the
    steady fair share divides the cluster among all roles, the instantaneous one
    among the active roles (a framework in or below them wants offers).
    """
    table = _table(f"roles (policy {state.get('policy', 'drf')})")
    table.add_column("role", no_wrap=True)
    table.add_column("weight", justify="right")
    table.add_column("active")
    table.add_column("share", justify="right")
    table.add_column("frameworks", justify="right")
    table.add_column("resource")
    for header in ("allocated", "guarantee", "limit", "steady fair", "instant. fair"):
        table.add_column(header, justify="right")
    roles = state.get("roles", [])
    cluster: Amounts = state["cluster"]["total"]
    for r in roles:
        limit: Amounts | None = r["limit"]
        # The cluster's resources, and any other the role is guaranteed or limited in.
        names = _ordered([*cluster, *r["guarantee"], *(limit or {})]) or ["-"]
        columns: list[list[str]] = [[] for _ in range(6)]
        for name in names:
            columns[0].append(name)
            columns[1].append(_cell(r["allocated"], name))
            columns[2].append(_cell(r["guarantee"], name))
            columns[3].append(_cell(limit, name))
            columns[4].append(_cell(r["steady_fair_share"], name))
            columns[5].append(_cell(r["instantaneous_fair_share"], name))
        table.add_row(
            _role_label(r["path"]),
            fmt_amount(r["weight"]),
            Text("active", style="green") if r["active"] else Text("idle", style="dim"),
            fmt_share(r["weighted_share"]),
            str(r.get("frameworks", 0)),
            *("\n".join(column) for column in columns),
            end_section=True,
        )
    return _when_empty(table, len(roles), "no roles")


def _role_label(path: str) -> str:
    if path == "*":
        return "*"
    depth = path.count("/")
    return "  " * depth + path.rsplit("/", 1)[-1]


def _cell(amounts: Amounts | None, name: str) -> str:
    """The amount of `name`; `-` for none (nothing allocated, no guarantee, no limit).

    A limit of 0 is shown as 0: it means none at all, not no limit.
    """
    if amounts is None or name not in amounts:
        return "-"
    return fmt_amount(amounts[name])


def render_tasks(state: State) -> Table:
    table = _table("tasks")
    table.add_column("id", no_wrap=True)
    table.add_column("framework", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("state")
    table.add_column("resources")
    frameworks = {f["id"]: f["name"] for f in state["frameworks"]}
    hosts = {a["id"]: a["hostname"] for a in state["agents"]}
    tasks = sorted(state["tasks"], key=lambda t: (frameworks.get(t["framework_id"], ""), t["id"]))
    for t in tasks:
        table.add_row(
            t["id"],
            frameworks.get(t["framework_id"], t["framework_id"]),
            hosts.get(t["agent_id"], t["agent_id"]),
            _task_state(t["state"]),
            fmt_resources(t["resources"]),
        )
    return _when_empty(table, len(tasks), "no running tasks")


def _task_state(state: str) -> Text:
    short = state.removeprefix("TASK_")
    return Text(short, style="green" if short == "RUNNING" else "yellow")


def render_state(state: State) -> Group:
    """The overview: header, cluster totals, frameworks, roles and agents."""
    return Group(
        render_header(state),
        Text(),
        render_cluster(state),
        Text(),
        render_frameworks(state),
        Text(),
        render_roles(state),
        Text(),
        render_agents(state),
    )


# Commands --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class View:
    render: Callable[[State], RenderableType]
    part: Callable[[State], Any]  # what `--json` prints
    json: str  # ...described for --help
    help: str


VIEWS: dict[str, View] = {
    "state": View(
        render_state,
        lambda s: s,
        "GET /state",
        "overview of a master: cluster totals, frameworks, roles and agents",
    ),
    "agents": View(
        render_agents,
        lambda s: s["agents"],
        "the agents in /state",
        "the agents: health, tasks, resources used and offered",
    ),
    "frameworks": View(
        render_frameworks,
        lambda s: s["frameworks"],
        "the frameworks in /state",
        "the frameworks: role, weight, dominant share, tasks",
    ),
    "roles": View(
        render_roles,
        lambda s: s.get("roles", []),
        "the roles in /state",
        "the role tree: weights, guarantees, limits, allocation and fair shares",
    ),
    "tasks": View(
        render_tasks,
        lambda s: s["tasks"],
        "the tasks in /state",
        "the running tasks: framework, agent, state, resources",
    ),
}
