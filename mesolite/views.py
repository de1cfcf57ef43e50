"""Operators' views of a master: rich tables built from the JSON of `GET /state`.

Every `render_*` function is pure: a `ClusterSnapshot` (mesolite/snapshot.py,
the types GET /state is written from) in, a rich renderable out (no I/O, no
clock but the snapshot's own `time`), so each view can be tested from a saved
state. `mesolite state|agents|frameworks|roles|tasks|jobs|services` (mesolite/cli/_views.py)
fetches the state, reads it with `ClusterSnapshot.from_json` and prints one of them;
`VIEWS` says which part of the JSON each command's `--json` prints, and which
views have a history that `--all` adds (the frameworks that ended, the tasks that
ended, as the master keeps them). The views
show the figures the master derived (health, shares, used, offered); they
compute none of their own.

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

from mesolite.model import TaskState
from mesolite.snapshot import AgentHealth, AgentSnapshot, ClusterSnapshot, FrameworkSnapshot

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


def fmt_weight(weight: float, resource_weights: Mapping[str, float] | None) -> str:
    """`3`, or a weight vector: `cpus:2 mem:1 others:1`."""
    if not resource_weights:
        return fmt_amount(weight)
    return f"{fmt_resources(resource_weights)} others:{fmt_amount(weight)}"


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


def _hint(table: Table, hint: str) -> None:
    table.caption = f"{table.caption}; {hint}" if table.caption else hint


# Views -----------------------------------------------------------------------


def render_header(state: ClusterSnapshot) -> Text:
    """Two lines: the master, its policy and uptime; then the counts."""
    c = state.cluster
    up = fmt_duration(state.time - state.started_at)
    text = Text()
    text.append(f"master {state.master_id}", style="bold")
    text.append(f"  policy {state.policy}  up {up}\n")
    if state.leader is not None:  # highly available masters
        standbys = ", ".join(m.grpc for m in state.standbys) or "none"
        text.append(f"leading at {state.leader.grpc}; standing by: {standbys}\n")
    text.append(
        f"{c.agents} agents, {c.frameworks} frameworks, {c.running_tasks} tasks, "
        f"{c.outstanding_offers} offers outstanding"
    )
    return text


def render_cluster(state: ClusterSnapshot) -> Table:
    """Per resource: the cluster's total, what is allocated (tasks and offers) and free."""
    c = state.cluster
    table = _table("cluster")
    table.add_column("resource")
    for header in ("total", "allocated", "free", "allocated %"):
        table.add_column(header, justify="right")
    names = _ordered([*c.total, *c.allocated])
    for name in names:
        t, a = c.total.get_amount(name), c.allocated.get_amount(name)
        table.add_row(
            name,
            fmt_amount(t),
            fmt_amount(a),
            fmt_amount(c.free.get_amount(name)),
            f"{100 * a / t:.0f}%" if t else "-",
        )
    return _when_empty(table, len(names), "no resources: no agent has registered")


def render_frameworks(state: ClusterSnapshot) -> Table:
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
    for f in state.frameworks:
        table.add_row(
            f.id,
            f.name,
            f.role,
            fmt_weight(f.weight, f.resource_weights),
            fmt_share(f.dominant_share),
            str(f.running_tasks),
            fmt_resources(f.used),
            fmt_resources(f.offered),
            _framework_status(f),
        )
    _when_empty(table, len(state.frameworks), "no frameworks registered")
    if state.completed_frameworks:
        _hint(table, f"{len(state.completed_frameworks)} completed: --all shows them")
    return table


def render_completed_frameworks(state: ClusterSnapshot) -> Table:
    """Frameworks that ended, newest first: when, why, and how their tasks ended."""
    table = _table("completed frameworks")
    table.add_column("id", no_wrap=True)
    table.add_column("name", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("ended", justify="right")
    table.add_column("tasks")
    table.add_column("why")
    for f in state.completed_frameworks:
        counts = sorted(f.tasks_by_state.items(), key=lambda kv: (-kv[1], kv[0]))
        tasks = ", ".join(f"{n} {name.removeprefix('TASK_').lower()}" for name, n in counts)
        table.add_row(f.id, f.name, f.role, _ago(state, f.ended_at), tasks or "-", f.reason)
    return _when_empty(table, len(state.completed_frameworks), "no framework has ended")


def _framework_status(f: FrameworkSnapshot) -> Text:
    if not f.connected:
        return Text("DISCONNECTED", style="red")
    return Text("connected, suppressed" if f.suppressed else "connected", style="green")


def render_agents(state: ClusterSnapshot) -> Table:
    """Per agent: health, and what its tasks use of each resource out of its total."""
    table = _table("agents")
    table.add_column("id", no_wrap=True)
    table.add_column("hostname", no_wrap=True)
    table.add_column("health")
    table.add_column("heartbeat", justify="right")
    table.add_column("tasks", justify="right")
    table.add_column("cpus used/total", justify="right")
    table.add_column("mem used/total", justify="right")
    agents = state.agents
    others = _ordered({n for a in agents for n in a.total if n not in ("cpus", "mem")})
    if others:
        table.add_column("other used/total")
    table.add_column("offered")
    for a in agents:
        row: list[RenderableType] = [
            a.id,
            a.hostname,
            _HEALTH[a.health],
            f"{a.seconds_since_heartbeat:.1f}s ago",
            str(a.running_tasks),
            _used_of(a, "cpus"),
            _used_of(a, "mem"),
        ]
        if others:
            row.append(" ".join(f"{n}:{_used_of(a, n)}" for n in others if n in a.total))
        row.append(fmt_resources(a.offered))
        table.add_row(*row)
    return _when_empty(table, len(agents), "no agents registered")


_HEALTH = {
    AgentHealth.DISCONNECTED: Text("disconnected", style="red"),
    AgentHealth.UNHEALTHY: Text("UNHEALTHY", style="yellow"),
    AgentHealth.HEALTHY: Text("healthy", style="green"),
}


def _used_of(agent: AgentSnapshot, name: str) -> str:
    """What the agent's tasks use of `name`, out of its total."""
    return f"{fmt_amount(agent.used.get_amount(name))}/{fmt_amount(agent.total.get_amount(name))}"


def render_roles(state: ClusterSnapshot) -> Table:
    """The role tree, one line per resource: allocation against guarantee, limit and fair shares.

    Roles are indented under their parent; a weight vector shows each resource's
    weight on that resource's line. `share` is the role's share under the
    master's policy divided by its weight (what the allocator orders by); the
    steady fair share divides the cluster among all roles, the instantaneous one
    among the active roles (a framework in or below them wants offers).
    """
    table = _table(f"roles (policy {state.policy})")
    table.add_column("role", no_wrap=True)
    table.add_column("weight", justify="right")
    table.add_column("active")
    table.add_column("share", justify="right")
    table.add_column("frameworks", justify="right")
    table.add_column("resource")
    for header in ("allocated", "guarantee", "limit", "steady fair", "instant. fair"):
        table.add_column(header, justify="right")
    cluster = state.cluster.total
    for r in state.roles:
        # The cluster's resources, and any other the role is guaranteed, limited or weighted in.
        named = [*r.guarantee, *(r.limit or {}), *(r.resource_weights or {})]
        names = _ordered([*cluster, *named]) or ["-"]
        columns: list[list[str]] = [[] for _ in range(6)]
        weights = []
        for name in names:
            weights.append(fmt_amount((r.resource_weights or {}).get(name, r.weight)))
            columns[0].append(name)
            columns[1].append(_cell(r.allocated, name))
            columns[2].append(_cell(r.guarantee, name))
            columns[3].append(_cell(r.limit, name))
            columns[4].append(_cell(r.steady_fair_share, name))
            columns[5].append(_cell(r.instantaneous_fair_share, name))
        table.add_row(
            _role_label(r.path),
            "\n".join(weights) if r.resource_weights else fmt_amount(r.weight),
            Text("active", style="green") if r.active else Text("idle", style="dim"),
            fmt_share(r.weighted_share),
            str(r.frameworks),
            *("\n".join(column) for column in columns),
            end_section=True,
        )
    return _when_empty(table, len(state.roles), "no roles")


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


def render_tasks(state: ClusterSnapshot) -> Table:
    """The running tasks; each agent by id and host name (two agents may share a host)."""
    table = _table("tasks")
    table.add_column("id", no_wrap=True)
    table.add_column("framework", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("host", no_wrap=True)
    table.add_column("state")
    table.add_column("resources")
    frameworks = state.framework_names()
    hosts = {a.id: a.hostname for a in state.agents}
    tasks = sorted(state.tasks, key=lambda t: (frameworks.get(t.framework_id, ""), t.id))
    for t in tasks:
        table.add_row(
            t.id,
            frameworks.get(t.framework_id, t.framework_id),
            t.agent_id,
            hosts.get(t.agent_id, "-"),
            _task_state(t.state),
            fmt_resources(t.resources),
        )
    _when_empty(table, len(tasks), "no running tasks")
    ended = sum(f.completed_tasks for f in state.frameworks)
    ended += sum(f.completed_tasks for f in state.completed_frameworks)
    if ended:
        _hint(table, f"{ended} ended: --all shows them")
    return table


def render_ended_tasks(state: ClusterSnapshot) -> Table:
    """Tasks that ended, newest first, of live and completed frameworks: how each ended
    (state, exit code, message, reason) and when."""
    table = _table("ended tasks")
    table.add_column("id", no_wrap=True)
    table.add_column("framework", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("host", no_wrap=True)
    table.add_column("state")
    table.add_column("exit", justify="right")
    table.add_column("ended", justify="right")
    table.add_column("how it ended")
    frameworks = state.framework_names()
    hosts = {a.id: a.hostname for a in state.agents}
    for t in state.completed_tasks:
        how = t.message + (f" ({t.reason})" if t.reason else "")
        table.add_row(
            t.id,
            frameworks.get(t.framework_id, t.framework_id),
            t.agent_id or "-",
            hosts.get(t.agent_id, "-"),
            _task_state(t.state),
            "-" if t.exit_code is None else str(t.exit_code),
            _ago(state, t.ended_at),
            how or "-",
        )
    return _when_empty(table, len(state.completed_tasks), "no task has ended")


def _ago(state: ClusterSnapshot, when: float | None) -> str:
    return "-" if when is None else f"{fmt_duration(state.time - when)} ago"


def _task_state(state: TaskState) -> Text:
    short = state.value.removeprefix("TASK_")
    return Text(short, style="green" if short == "RUNNING" else "yellow")


def render_jobs(state: ClusterSnapshot) -> Table:
    """Jobs submitted with `mesolite run`: indices done out of completions, running,
    failed, and retries used."""
    table = _table("jobs")
    table.add_column("name", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("status")
    table.add_column("done", justify="right")
    table.add_column("running", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("retries used", justify="right")
    table.add_column("parallelism", justify="right")
    table.add_column("task")
    table.add_column("age", justify="right")
    table.add_column("note")
    for j in state.jobs:
        note = j.message
        if j.failed_indices:
            note = f"failed indices {_indices(j.failed_indices)}" + (f"; {note}" if note else "")
        table.add_row(
            j.name,
            j.role,
            _workload_status(j.status),
            f"{j.succeeded}/{j.completions}",
            str(j.running),
            str(j.failed),
            f"{j.retried} (max {j.retries}/index)",
            str(j.parallelism),
            fmt_resources(j.resources),
            fmt_duration((j.finished_at or state.time) - j.submitted_at),
            note,
        )
    return _when_empty(table, len(state.jobs), "no jobs: submit one with `mesolite run FILE`")


def render_services(state: ClusterSnapshot) -> Table:
    """Services submitted with `mesolite run`: instances running out of those wanted."""
    table = _table("services")
    table.add_column("name", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("status")
    table.add_column("running", justify="right")
    table.add_column("starting", justify="right")
    table.add_column("waiting", justify="right")
    table.add_column("restarts", justify="right")
    table.add_column("restart")
    table.add_column("instance")
    table.add_column("age", justify="right")
    table.add_column("note")
    for s in state.services:
        table.add_row(
            s.name,
            s.role,
            _workload_status(s.status),
            f"{s.running}/{s.instances}",
            str(s.starting),
            str(s.waiting),
            str(s.restarts),
            s.restart_policy,
            fmt_resources(s.resources),
            fmt_duration((s.finished_at or state.time) - s.submitted_at),
            s.message,
        )
    return _when_empty(
        table, len(state.services), "no services: submit one with `mesolite run FILE`"
    )


def _workload_status(status: str) -> Text:
    style = {"active": "green", "completed": "green", "failed": "red", "stopped": "yellow"}
    return Text(status, style=style.get(status, ""))


def _indices(indices: Iterable[int]) -> str:
    shown = list(indices)
    return ", ".join(map(str, shown[:10])) + (" ..." if len(shown) > 10 else "")


def render_state(state: ClusterSnapshot) -> Group:
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
    render: Callable[[ClusterSnapshot], RenderableType]
    part: str | None  # the key of the GET /state document `--json` prints; None: all of it
    json: str  # ...described for --help
    help: str
    # With `--all`: the history shown after it, and its key in the document.
    history: Callable[[ClusterSnapshot], RenderableType] | None = None
    history_part: str | None = None

    def render_all(self, state: ClusterSnapshot, history: bool) -> RenderableType:
        """The view, and with `history` its history (`--all`) below it."""
        if not history or self.history is None:
            return self.render(state)
        return Group(self.render(state), Text(), self.history(state))

    def json_of(self, state: ClusterSnapshot, history: bool = False) -> Any:
        """What `--json` prints: this view's part of the GET /state document; with
        `history` (`--all`), an object of that part and its history's."""
        document = state.to_json()
        if self.part is None:
            return document
        if history and self.history_part is not None:
            return {self.part: document[self.part], self.history_part: document[self.history_part]}
        return document[self.part]


VIEWS: dict[str, View] = {
    "state": View(
        render_state,
        None,
        "GET /state",
        "overview of a master: cluster totals, frameworks, roles and agents",
    ),
    "agents": View(
        render_agents,
        "agents",
        "the agents in /state",
        "the agents: health, tasks, resources used and offered",
    ),
    "frameworks": View(
        render_frameworks,
        "frameworks",
        "the frameworks in /state",
        "the frameworks: role, weight, dominant share, tasks; --all: and those that ended",
        history=render_completed_frameworks,
        history_part="completed_frameworks",
    ),
    "roles": View(
        render_roles,
        "roles",
        "the roles in /state",
        "the role tree: weights, guarantees, limits, allocation and fair shares",
    ),
    "tasks": View(
        render_tasks,
        "tasks",
        "the tasks in /state",
        "the running tasks: framework, agent, state, resources; --all: and how those that "
        "ended did",
        history=render_ended_tasks,
        history_part="completed_tasks",
    ),
    "jobs": View(
        render_jobs,
        "jobs",
        "the jobs in /state",
        "the jobs `mesolite run` submitted: indices done, running, failed, retries used",
    ),
    "services": View(
        render_services,
        "services",
        "the services in /state",
        "the services `mesolite run` submitted: instances running of those wanted, restarts",
    ),
}
