"""The master's read side: `build_snapshot(master)` turns the core's state into one
`mesolite.snapshot.ClusterSnapshot`, and every view reads that (GET /state, the
Prometheus collectors, the web UI's event stream, the demo, the experiment).

This is the only module outside the core that reads the master's records, and
each figure is derived here once:

- an agent is healthy when it is connected and its last heartbeat is within
  the agent timeout (`_healthy`);
- a dominant share is the largest fraction of *any* resource in the cluster
  (DRF's share, whatever policy the master runs);
- a weighted share is the policy's share divided by the role's weight (or, for
  a weight vector, each resource's part divided by its own weight), as the
  allocator orders by (read from the allocator);
- a framework's `allocated` is what the allocator counts (its tasks plus its
  offers), `used` what its tasks hold, `offered` what its offers hold; the
  same three per agent;
- `usage` is what tasks use as their agents measured it (the last heartbeat's
  figures): per task, summed per agent (cpus, mem) and over the cluster.

History: the ended tasks of every framework, live or completed (the master
keeps `max_completed_tasks_per_framework` of each), newest first, and the
completed frameworks (`max_completed_frameworks`), newest first. A snapshot
holds the newest `ended_tasks` of those tasks: `COMPLETED_TASKS_SHOWN` by
default (the web UI, /metrics, the demo), every one for GET /state (`None`).

Cost: one pass over each of the master's collections, O(agents + frameworks +
tasks + offers + roles) resource-vector operations (each O(resource names)),
plus sorting the roles and removed agents by name, the newest
`ended_tasks` ended tasks of each framework (O(frameworks x ended_tasks), a
heap merge), and the fair shares (`Master.fair_shares`: steady ones cached, instantaneous ones
computed). A snapshot is built once per GET /state, per /events tick (only
while a page listens) and per /metrics scrape; nothing is kept up to date on
the hot paths, and nothing here changes the master.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mesolite.master.leadership import MasterAddress
from mesolite.master.policies import DRFPolicy
from mesolite.model import Offer, TaskUsage
from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import (
    AgentSnapshot,
    ClusterSnapshot,
    ClusterTotals,
    CompletedFrameworkSnapshot,
    EndedTaskSnapshot,
    FrameworkSnapshot,
    MasterSnapshot,
    OfferSnapshot,
    PreemptionSnapshot,
    ReservationSnapshot,
    RoleSnapshot,
    TaskSnapshot,
    TaskUsageSnapshot,
    WorkloadViews,
)

if TYPE_CHECKING:
    from mesolite.master.master import Master
    from mesolite.master.reservations import Reservation
    from mesolite.master.state import AgentRecord, FrameworkRecord, TaskRecord

COMPLETED_TASKS_SHOWN = 50

_DRF = DRFPolicy()


def build_snapshot(
    master: Master,
    *,
    now: float | None = None,
    ended_tasks: int | None = COMPLETED_TASKS_SHOWN,
    workloads: WorkloadViews = ((), ()),
) -> ClusterSnapshot:
    """The cluster now. `now` is on the master's clock (tests move it to see health age);
    `ended_tasks`: how many of the newest ended tasks it holds (None: every one kept).
    `workloads`: the jobs and services of the built-in frameworks beside the master (they
    are not the master's to know: `MasterServer(workloads=...)` asks them)."""
    now = master.now() if now is None else now
    total = master.allocator.total
    offers = tuple(_offer(o.offer) for o in master.offers.values())
    by_framework = _sum_by((o.framework_id, o.resources) for o in offers)
    by_agent = _sum_by((o.agent_id, o.resources) for o in offers)
    frameworks = tuple(
        _framework(master, f, by_framework.get(f.framework_id, EMPTY), total)
        for f in master.frameworks.values()
    )
    reserved = {r.agent_id: r for r in master.allocator.reservations()}
    agents = tuple(
        _agent(master, a, by_agent.get(a.agent_id, EMPTY), now, reserved.get(a.agent_id))
        for a in master.agents.values()
    )
    tasks = tuple(_task(t, _preempting(master, t)) for t in master.tasks())
    allocated = sum((a.allocated for a in agents), EMPTY)
    usage = sum((a.usage for a in agents), EMPTY)
    return ClusterSnapshot(
        master_id=master.master_id,
        policy=master.allocator.policy.name,
        started_at=master.started_at,
        time=master.wall_time(),
        cluster=ClusterTotals(
            total=total,
            allocated=allocated,
            free=total - allocated,
            agents=len(agents),
            frameworks=len(frameworks),
            running_tasks=len(tasks),
            outstanding_offers=len(offers),
            usage=usage,
        ),
        frameworks=frameworks,
        roles=_roles(master, Counter(f.role for f in frameworks)),
        agents=agents,
        offers=offers,
        tasks=tasks,
        removed_agents=tuple(sorted(master.removed_agents)),
        completed_tasks=_recently_ended(
            [*master.frameworks.values(), *master.completed_frameworks.values()], ended_tasks
        ),
        completed_frameworks=tuple(
            _completed_framework(f) for f in reversed(master.completed_frameworks.values())
        ),
        jobs=workloads[0],
        services=workloads[1],
        leader=_master_view(master.leadership.leader()),
        standbys=tuple(
            view for m in master.leadership.standbys() if (view := _master_view(m)) is not None
        ),
    )


def _master_view(address: MasterAddress | None) -> MasterSnapshot | None:
    return (
        None if address is None else MasterSnapshot(address.master_id, address.grpc, address.http)
    )


def agent_snapshot(master: Master, agent_id: str) -> AgentSnapshot | None:
    """One agent as `build_snapshot` shows it; None if the master has no such agent.

    O(its tasks + all offers): for a reader that needs one agent, say the sandbox proxy.
    """
    agent = master.agents.get(agent_id)
    if agent is None:
        return None
    offers = (o.offer for o in master.offers.values())
    offered = sum((o.resources for o in offers if o.agent_id == agent_id), EMPTY)
    reserved = next((r for r in master.allocator.reservations() if r.agent_id == agent_id), None)
    return _agent(master, agent, offered, master.now(), reserved)


def _healthy(connected: bool, last_seen: float, now: float, timeout: float) -> bool:
    return connected and now - last_seen <= timeout


def _sum_by(items: Iterable[tuple[str, Resources]]) -> dict[str, Resources]:
    sums: dict[str, Resources] = {}
    for key, amount in items:
        sums[key] = sums.get(key, EMPTY) + amount
    return sums


def _framework(
    master: Master, f: FrameworkRecord, offered: Resources, total: Resources
) -> FrameworkSnapshot:
    alloc = master.allocator
    allocated = alloc.framework_allocation(f.framework_id)
    used = sum((t.spec.resources for t in f.tasks.values()), EMPTY)
    return FrameworkSnapshot(
        id=f.framework_id,
        name=f.info.name,
        role=f.info.role,
        weight=alloc.role_weight(f.info.role),
        connected=f.connected,
        suppressed=f.suppressed,
        removing=f.removing,
        failover_timeout=f.info.failover_timeout,
        allocated=allocated,
        used=used,
        offered=offered,
        dominant_share=_DRF.share(allocated, total),
        weighted_dominant_share=alloc.framework_share(f.framework_id),
        running_tasks=len(f.tasks),
        completed_tasks=len(f.completed),
        registered_at=f.registered_at,
        used_dominant_share=_DRF.share(used, total),
        user=f.info.user,
        resource_weights=alloc.role_resource_weights(f.info.role),
    )


def _agent(
    master: Master,
    a: AgentRecord,
    offered: Resources,
    now: float,
    reservation: Reservation | None = None,
) -> AgentSnapshot:
    allocated = master.allocator.agent_allocated(a.agent_id)
    return AgentSnapshot(
        id=a.agent_id,
        hostname=a.hostname,
        address=a.address,
        attributes=dict(a.attributes),  # a copy: the snapshot may be read off the loop
        total=a.total,
        allocated=allocated,
        free=a.total - allocated,
        connected=a.connected,
        healthy=_healthy(a.connected, a.last_seen, now, master.config.agent_timeout),
        seconds_since_heartbeat=round(now - a.last_seen, 3),
        running_tasks=len(a.tasks),
        registered_at=a.registered_at,
        used=sum((t.spec.resources for t in a.tasks.values()), EMPTY),
        offered=offered,
        usage=_measured(a.tasks.values()),
        isolation=a.isolation,
        task_user=a.task_user,
        reservation=None
        if reservation is None
        else ReservationSnapshot(
            reservation.framework_id, reservation.shape, round(now - reservation.since, 3)
        ),
    )


def _measured(tasks: Iterable[TaskRecord]) -> Resources:
    """What `tasks` use, as measured: cpus and mem (MB); empty if none was measured."""
    cpus = mem = 0.0
    measured = False
    for t in tasks:
        if t.usage is not None:
            measured = True
            cpus += t.usage.cpus_used
            mem += t.usage.mem_used_mb
    return Resources(cpus=round(cpus, 4), mem=round(mem, 2)) if measured else EMPTY


def _roles(master: Master, frameworks_in: Counter[str]) -> tuple[RoleSnapshot, ...]:
    alloc = master.allocator
    tree, total = alloc.roles, alloc.total
    steady, instantaneous = master.fair_shares()
    roles = []
    for path in sorted(tree.role_paths()):
        allocated = tree.role_allocation(path)
        roles.append(
            RoleSnapshot(
                path=path,
                weight=tree.role_weight(path),
                guarantee=tree.role_guarantee(path),
                limit=tree.role_limit(path),
                configured=tree.role_configured(path),
                allocated=allocated,
                share=alloc.policy.share(allocated, total),
                weighted_share=tree.role_share(path),
                dominant_share=_DRF.share(allocated, total),
                steady_fair_share=steady.get(path, EMPTY),
                instantaneous_fair_share=instantaneous.get(path, EMPTY),
                active=tree.role_active(path),
                frameworks=frameworks_in[path],
                resource_weights=tree.role_resource_weights(path),
            )
        )
    return tuple(roles)


def _preempting(master: Master, t: TaskRecord) -> PreemptionSnapshot | None:
    p = master.preempting.get((t.framework_id, t.spec.task_id))
    if p is None:
        return None
    kill_in = 0.0 if p.killed else max(0.0, round(p.kill_at - master.now(), 3))
    return PreemptionSnapshot(p.for_role, p.kind.value, kill_in)


def _task(t: TaskRecord, preempting: PreemptionSnapshot | None = None) -> TaskSnapshot:
    return TaskSnapshot(
        id=t.spec.task_id,
        name=t.spec.name,
        framework_id=t.framework_id,
        agent_id=t.agent_id,
        state=t.state,
        resources=t.spec.resources,
        usage=_usage(t.usage) if t.usage is not None else None,
        preempting=preempting,
    )


def _usage(u: TaskUsage) -> TaskUsageSnapshot:
    return TaskUsageSnapshot(u.cpus_used, u.cpu_seconds, u.mem_used_mb, u.mem_peak_mb, u.processes)


def _offer(offer: Offer) -> OfferSnapshot:
    return OfferSnapshot(offer.offer_id, offer.framework_id, offer.agent_id, offer.resources)


def _recently_ended(
    frameworks: Iterable[FrameworkRecord], shown: int | None
) -> tuple[EndedTaskSnapshot, ...]:
    """The newest `shown` ended tasks of `frameworks` (None: all), newest first."""
    if shown is None:
        every = [t for f in frameworks for t in reversed(f.completed)]
        newest = sorted(every, key=_ended_at, reverse=True)  # as nlargest orders ties
    else:
        candidates = (t for f in frameworks for t in itertools.islice(reversed(f.completed), shown))
        newest = heapq.nlargest(shown, candidates, key=_ended_at)
    return tuple(
        EndedTaskSnapshot(
            id=t.spec.task_id,
            name=t.spec.name,
            framework_id=t.framework_id,
            agent_id=t.agent_id,
            state=t.state,
            resources=t.spec.resources,
            message=t.status.message if t.status else "",
            exit_code=t.status.exit_code if t.status else None,
            ended_at=_ended_at(t) or None,
            reason=t.status.reason if t.status else "",
        )
        for t in newest
    )


def _completed_framework(f: FrameworkRecord) -> CompletedFrameworkSnapshot:
    return CompletedFrameworkSnapshot(
        id=f.framework_id,
        name=f.info.name,
        role=f.info.role,
        registered_at=f.registered_at,
        ended_at=f.ended_at or 0.0,
        reason=f.end_reason,
        completed_tasks=len(f.completed),
        tasks_by_state=dict(f.ended_counts),  # counted once, as it entered the history
    )


def _ended_at(task: TaskRecord) -> float:
    """When it ended: its last status's time, else when the master saw it end."""
    if task.status is not None and task.status.timestamp:
        return task.status.timestamp
    return task.ended_at or 0.0


__all__ = ["COMPLETED_TASKS_SHOWN", "agent_snapshot", "build_snapshot"]
