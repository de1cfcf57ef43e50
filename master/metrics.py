"""The master's Prometheus metrics, served at `GET /metrics`.

Two kinds, kept apart so the hot paths stay cheap:

- **Events** (offers sent, accepted, declined, rescinded; status updates
  forwarded and retried; calls rejected; the allocation cycle's duration and
  offer count) are counters and histograms that `Master` bumps as things
  happen, each with a one-line call into `MasterMetrics`. Labelled children
  are resolved once, here, so a hook is a dict lookup and an increment.
- **State** (tasks by state, shares, role allocations and fair shares, agents
  by health, cluster totals, frameworks) is read when Prometheus scrapes, from
  one `ClusterSnapshot` (master/read_model.py) per scrape, taken on the event
  loop; `exposition(snapshot)` then renders everything in a worker thread
  (master/snapshot_document.py). Nothing is kept up to date on the way, and the
  figures are the ones `GET /state` shows, derived in the same place.

Every master has its own `CollectorRegistry` (tests run many masters in one
process). Beside the mesolite_* series it exports the standard process_* and
python_* ones. Amounts of resources are in each resource's own unit (cpus: cores,
mem and disk: MB), named by the `resource` label.

Label values are ids (framework ids, role paths, resource names: each validated and
bounded where it enters the master) or members of fixed enums, never free text a
client chose: a framework's name is on GET /state, not here (a 30 MB name made a
90 MB /metrics when it was a label). `LABELS` lists every label name in use.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from mesolite.master.leadership import Leadership
from mesolite.master.reservations import OUTCOMES
from mesolite.model import TaskState
from mesolite.resources import Resources
from mesolite.snapshot import AgentHealth, ClusterSnapshot

# No `*_created` series: one start time per counter and label set would double
# the output, and the text format's consumers do not use them. (Process-wide;
# nothing else in a master exports metrics.)
disable_created_metrics()  # type: ignore[no-untyped-call]

RescindReason = Literal["timeout", "agent_lost", "framework_gone"]
# How a reservation of an agent ended (master/reservations.py), or "made".
RESERVATION_OUTCOMES = ("made", *OUTCOMES)
RESCIND_REASONS: tuple[RescindReason, ...] = ("timeout", "agent_lost", "framework_gone")

# Every label name of the mesolite_* series: ids, or values from a fixed set.
LABELS = frozenset(
    {
        "framework_id",
        "task_id",
        "agent_id",
        "role",
        "resource",
        "state",
        "health",
        "reason",
        "call",
        "isolation",
        "kind",  # of preemption: min_share or fair_share
        "outcome",  # of a reservation: RESERVATION_OUTCOMES
    }
)
# How agents contain tasks (`mesolite_agents_by_isolation`); any other value an
# agent reports is counted as "other", so the label stays within a fixed set.
ISOLATION_MODES = ("cgroups-v2", "cgroups-v1", "process-tree", "other")

# Scheduler calls a framework can make (the `call` oneof of mesolite.v1.Call),
# "none" for a call with nothing set, and the operator API's calls
# (master/operator_api.py).
CALL_TYPES = (
    "subscribe",
    "accept",
    "decline",
    "kill",
    "acknowledge",
    "reconcile",
    "revive",
    "suppress",
    "teardown",
    "batch",
    "none",
    "operator_teardown",
    "operator_kill",
)

# A small cluster allocates in well under a millisecond; 20k agents take ~0.5 s.
CYCLE_SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
CYCLE_OFFERS_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class MasterMetrics:
    """The master's counters and histograms, and the collector that reads its state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._offers_sent = Counter(
            "mesolite_offers_sent", "Offers sent to frameworks.", registry=r
        )
        self._offers_accepted = Counter(
            "mesolite_offers_accepted", "Offers used by an ACCEPT call.", registry=r
        )
        self._offers_declined = Counter(
            "mesolite_offers_declined", "Offers declined by a DECLINE call.", registry=r
        )
        rescinded = Counter(
            "mesolite_offers_rescinded",
            "Offers taken back by the master, by reason: not answered within the offer "
            "timeout, the agent disconnected or was removed, the framework disconnected, "
            "failed over or was removed.",
            ["reason"],
            registry=r,
        )
        self._rescinded = {reason: rescinded.labels(reason) for reason in RESCIND_REASONS}
        forwarded = Counter(
            "mesolite_status_updates_forwarded",
            "Status updates from agents forwarded to a connected framework, by task state "
            "(retries included).",
            ["state"],
            registry=r,
        )
        self._forwarded = {state: forwarded.labels(state.value) for state in TaskState}
        preempted = Counter(
            "mesolite_preemptions",
            "Tasks ended by preemption, by kind: min_share (for a role below its "
            "guarantee) or fair_share (below its threshold of its fair share).",
            ["kind"],
            registry=r,
        )
        self._preempted = {kind: preempted.labels(kind) for kind in ("min_share", "fair_share")}
        reservations = Counter(
            "mesolite_reservations",
            "Agents reserved for a framework's task that did not fit yet (with --packing), "
            "by outcome: made, or how the reservation ended (fitted: the task was offered; "
            "demand_changed, timeout, filtered, agent_removed, agent_inactive, "
            "framework_removed, not_wanting).",
            ["outcome"],
            registry=r,
        )
        self._reservations = {o: reservations.labels(o) for o in RESERVATION_OUTCOMES}
        self._update_retries = Counter(
            "mesolite_status_update_retries",
            "Status updates received again with an update id the master had already "
            "applied (the agent retries until the framework acknowledges).",
            registry=r,
        )
        self._rejected = Counter(
            "mesolite_calls_rejected",
            "Calls refused, by call type: a framework's calls rejected with an ERROR "
            "event, its SUBSCRIBE refused (the stream ends), and operator calls "
            "(operator_teardown, operator_kill) refused by authentication, the ACLs or "
            "the master.",
            ["call"],
            registry=r,
        )
        for call in CALL_TYPES:
            self._rejected.labels(call)
        self._cycle_seconds = Histogram(
            "mesolite_allocation_cycle_duration_seconds",
            "Time taken by one allocation cycle, sending its offers included.",
            buckets=CYCLE_SECONDS_BUCKETS,
            registry=r,
        )
        self._cycle_offers = Histogram(
            "mesolite_allocation_cycle_offers",
            "Offers made by one allocation cycle.",
            buckets=CYCLE_OFFERS_BUCKETS,
            registry=r,
        )
        self.registry_write = Histogram(
            "mesolite_registry_write_seconds",
            "Time taken by one registry write: an SQLite commit, or a guarded etcd "
            "transaction (a turn's changes; more than one past etcd's limits).",
            buckets=CYCLE_SECONDS_BUCKETS,
            registry=r,
        )
        self._leading = Gauge(
            "mesolite_master_leading",
            "1 while this master leads; 0 for a deposed one (a standby serves no metrics).",
            registry=r,
        )
        self._terms = Counter(
            "mesolite_master_leadership_terms",
            "Leadership terms this master process has begun (an elected HA master, or a "
            "single master at its start).",
            registry=r,
        )
        # The standard process_* and python_* series, under the names dashboards expect.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)

    # Hooks: one call each from the master ----------------------------------

    def watch_leadership(self, leadership: Leadership) -> None:
        """A term begins: `mesolite_master_leading` reads `leadership` at each scrape."""
        self._leading.set_function(lambda: float(leadership.is_leading()))
        self._terms.inc()

    def offers_made(self, count: int) -> None:
        """One allocation cycle made `count` offers."""
        self._offers_sent.inc(count)
        self._cycle_offers.observe(count)

    @contextmanager
    def time_cycle(self) -> Iterator[None]:
        """Time one allocation cycle (the block)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._cycle_seconds.observe(time.perf_counter() - started)

    def offers_accepted(self, count: int) -> None:
        self._offers_accepted.inc(count)

    def offers_declined(self, count: int) -> None:
        self._offers_declined.inc(count)

    def offers_rescinded(self, reason: RescindReason, count: int = 1) -> None:
        self._rescinded[reason].inc(count)

    def update_forwarded(self, state: TaskState) -> None:
        self._forwarded[state].inc()

    def preempted(self, kind: str) -> None:
        self._preempted[kind].inc()

    def reservation(self, outcome: str) -> None:
        """A reservation was made ("made") or ended with `outcome`."""
        self._reservations[outcome].inc()

    def update_retried(self) -> None:
        self._update_retries.inc()

    def call_rejected(self, call: str | None) -> None:
        self._rejected.labels(call or "none").inc()

    def exposition(self, state: ClusterSnapshot) -> bytes:
        """Every series in Prometheus' text format, the state's gauges read from `state`.

        Blocking, and it reads only `state` and the thread-safe counters: a scrape
        takes the snapshot on the event loop and calls this in a worker thread."""
        return generate_latest(_Scrape(self.registry, state))


class _Scrape:
    """What one scrape collects: the registry's series, and the state's gauges."""

    def __init__(self, registry: CollectorRegistry, state: ClusterSnapshot) -> None:
        self._registry = registry
        self._state = state

    def collect(self) -> Iterable[Metric]:
        yield from self._registry.collect()
        yield from state_metrics(self._state)


def state_metrics(state: ClusterSnapshot) -> Iterator[Metric]:
    """The gauges of one snapshot of the master's state."""
    yield from _tasks(state)
    yield from _task_usage(state)
    yield from _frameworks(state)
    yield from _roles(state)
    yield from _agents(state)
    yield from _agent_usage(state)
    yield from _cluster(state)


def _tasks(state: ClusterSnapshot) -> Iterator[Metric]:
    tasks = GaugeMetricFamily(
        "mesolite_tasks",
        "Tasks the master considers running (not yet terminal), by their current state.",
        labels=["state"],
    )
    by_state = Tally(t.state for t in state.tasks)
    for task_state in TaskState:
        if not task_state.is_terminal:
            tasks.add_metric([task_state.value], by_state.get(task_state, 0))
    yield tasks
    preempting = GaugeMetricFamily(
        "mesolite_tasks_preempting",
        "Running tasks whose framework was told they will be preempted.",
    )
    preempting.add_metric([], sum(1 for t in state.tasks if t.preempting is not None))
    yield preempting


def _task_usage(state: ClusterSnapshot) -> Iterator[Metric]:
    usage = GaugeMetricFamily(
        "mesolite_task_usage",
        "What a running task uses, as its agent measures it in the task's cgroup: cpus "
        "(CPU seconds per second over the agent's last sample) and mem (MB charged). "
        "Only tasks on agents with cgroups.",
        labels=["framework_id", "task_id", "resource"],
    )
    for t in state.tasks:
        if t.usage is not None:
            usage.add_metric([t.framework_id, t.id, "cpus"], t.usage.cpus_used)
            usage.add_metric([t.framework_id, t.id, "mem"], t.usage.mem_used_mb)
    yield usage


def _frameworks(state: ClusterSnapshot) -> Iterator[Metric]:
    labels = ["framework_id", "role"]  # ids only: a name is free text
    dominant = GaugeMetricFamily(
        "mesolite_framework_dominant_share",
        "The framework's dominant share: its largest share of any resource in the "
        "cluster (offers count as allocated).",
        labels=labels,
    )
    weighted = GaugeMetricFamily(
        "mesolite_framework_weighted_share",
        "The framework's share under the master's policy divided by its role's weight: "
        "the allocator offers to the lowest first.",
        labels=labels,
    )
    running = GaugeMetricFamily(
        "mesolite_framework_tasks", "Running tasks of the framework.", labels=labels
    )
    for f in state.frameworks:
        values = [f.id, f.role]
        dominant.add_metric(values, f.dominant_share)
        weighted.add_metric(values, f.weighted_dominant_share)
        running.add_metric(values, f.running_tasks)
    connected = sum(f.connected for f in state.frameworks)
    registered = GaugeMetricFamily(
        "mesolite_frameworks",
        "Registered frameworks, connected or disconnected (within their failover timeout).",
        labels=["state"],
    )
    registered.add_metric(["connected"], connected)
    registered.add_metric(["disconnected"], len(state.frameworks) - connected)
    yield from (dominant, weighted, running, registered)


def _roles(state: ClusterSnapshot) -> Iterator[Metric]:
    labels = ["role", "resource"]
    allocation = GaugeMetricFamily(
        "mesolite_role_allocated",
        "Resources allocated to the role and the roles below it (offers included), "
        "in the resource's unit.",
        labels=labels,
    )
    steady_share = GaugeMetricFamily(
        "mesolite_role_steady_fair_share",
        "The role's steady fair share: the cluster divided among all roles by weight, "
        "within guarantees and limits.",
        labels=labels,
    )
    inst_share = GaugeMetricFamily(
        "mesolite_role_instantaneous_fair_share",
        "The role's instantaneous fair share: the cluster divided among the active roles.",
        labels=labels,
    )
    share = GaugeMetricFamily(
        "mesolite_role_weighted_share",
        "The role's share under the master's policy divided by its weight.",
        labels=["role"],
    )
    resources = state.cluster.total.keys()
    for role in state.roles:
        _add_resources(allocation, role.path, role.allocated, resources)
        _add_resources(steady_share, role.path, role.steady_fair_share, resources)
        _add_resources(inst_share, role.path, role.instantaneous_fair_share, resources)
        share.add_metric([role.path], role.weighted_share)
    yield from (allocation, steady_share, inst_share, share)


def _add_resources(
    family: GaugeMetricFamily, role: str, amounts: Resources, names: Iterable[str]
) -> None:
    """One sample per resource in the cluster (zero included), so series do not come and go."""
    for name in sorted(set(names) | set(amounts)):
        family.add_metric([role, name], amounts.get_amount(name))


def _agents(state: ClusterSnapshot) -> Iterator[Metric]:
    health = Tally(a.health for a in state.agents)
    agents = GaugeMetricFamily(
        "mesolite_agents",
        "Agents in the cluster by health: healthy (connected, heartbeats on time), "
        "unhealthy (connected, heartbeats late) or disconnected (stream broken; no offers).",
        labels=["health"],
    )
    for h in AgentHealth:
        agents.add_metric([h.value], health[h])
    yield agents
    yield GaugeMetricFamily(
        "mesolite_agents_removed",
        "Agents removed from the cluster (they must register again as new agents).",
        value=len(state.removed_agents),
    )
    yield GaugeMetricFamily(
        "mesolite_agents_reserved",
        "Agents reserved now for a framework's task that does not fit yet (--packing).",
        value=sum(1 for a in state.agents if a.reservation is not None),
    )


def _agent_usage(state: ClusterSnapshot) -> Iterator[Metric]:
    labels = ["agent_id", "resource"]
    used = GaugeMetricFamily(
        "mesolite_agent_used",
        "What the agent's running tasks hold (were given), in the resource's unit.",
        labels=labels,
    )
    usage = GaugeMetricFamily(
        "mesolite_agent_usage",
        "What the agent's running tasks use, as it measures them in their cgroups "
        "(cpus: CPUs, mem: MB); absent for agents without cgroups.",
        labels=labels,
    )
    modes = GaugeMetricFamily(
        "mesolite_agents_by_isolation",
        "Agents by how they contain tasks: cgroups-v2, cgroups-v1, or process-tree (the "
        "fallback: per-process rlimits, no CPU or pids limit).",
        labels=["isolation"],
    )
    for a in state.agents:
        for name in sorted(a.total):
            used.add_metric([a.id, name], a.used.get_amount(name))
        for name in sorted(a.usage):
            usage.add_metric([a.id, name], a.usage.get_amount(name))
    known = set(ISOLATION_MODES)
    by_mode = Tally(a.isolation if a.isolation in known else "other" for a in state.agents)
    for mode in ISOLATION_MODES:
        modes.add_metric([mode], by_mode[mode])
    yield from (used, usage, modes)


def _cluster(state: ClusterSnapshot) -> Iterator[Metric]:
    total, allocated = state.cluster.total, state.cluster.allocated
    total_family = GaugeMetricFamily(
        "mesolite_cluster_resources",
        "Resources of all registered agents, in the resource's unit.",
        labels=["resource"],
    )
    allocated_family = GaugeMetricFamily(
        "mesolite_cluster_allocated_resources",
        "Resources in use by tasks or held by outstanding offers, in the resource's unit.",
        labels=["resource"],
    )
    usage_family = GaugeMetricFamily(
        "mesolite_cluster_usage",
        "What running tasks use, as their agents measure it in their cgroups "
        "(cpus: CPUs, mem: MB).",
        labels=["resource"],
    )
    for name in sorted(set(total) | set(allocated)):
        total_family.add_metric([name], total.get_amount(name))
        allocated_family.add_metric([name], allocated.get_amount(name))
    for name in sorted(state.cluster.usage):
        usage_family.add_metric([name], state.cluster.usage.get_amount(name))
    yield from (total_family, allocated_family, usage_family)
    yield GaugeMetricFamily(
        "mesolite_offers_outstanding",
        "Offers sent and not yet accepted, declined or rescinded.",
        value=state.cluster.outstanding_offers,
    )
