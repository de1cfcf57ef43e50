"""Hand-made cluster snapshots for tests of the views that read them."""

from __future__ import annotations

from typing import Any

from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import AgentSnapshot, ClusterSnapshot, ClusterTotals, FrameworkSnapshot


def empty_snapshot(**changes: Any) -> ClusterSnapshot:
    """A master with nothing registered, up for 1h 2m 5s; `changes` replace fields."""
    fields: dict[str, Any] = {
        "master_id": "m1",
        "policy": "drf",
        "started_at": 100.0,
        "time": 3825.0,
        "cluster": ClusterTotals(EMPTY, EMPTY, EMPTY, 0, 0, 0, 0),
        "frameworks": (),
        "roles": (),
        "agents": (),
        "offers": (),
        "tasks": (),
        "removed_agents": (),
    }
    return ClusterSnapshot(**(fields | changes))


def agent(agent_id: str, *, connected: bool = True, healthy: bool = True) -> AgentSnapshot:
    """An idle agent with one CPU."""
    return AgentSnapshot(
        id=agent_id,
        hostname=f"host-{agent_id}",
        address="",
        attributes={},
        total=Resources(cpus=1),
        allocated=EMPTY,
        free=Resources(cpus=1),
        connected=connected,
        healthy=healthy,
        seconds_since_heartbeat=12.0,
        running_tasks=0,
        registered_at=0.0,
    )


def framework_snapshot(**changes: Any) -> FrameworkSnapshot:
    """A connected framework "f1" in role `*`, holding nothing; `changes` replace fields."""
    fields: dict[str, Any] = {
        "id": "f1",
        "name": "f1",
        "role": "*",
        "weight": 1.0,
        "connected": True,
        "suppressed": False,
        "removing": False,
        "failover_timeout": 0.0,
        "allocated": EMPTY,
        "used": EMPTY,
        "offered": EMPTY,
        "dominant_share": 0.0,
        "weighted_dominant_share": 0.0,
        "running_tasks": 0,
        "completed_tasks": 0,
        "registered_at": 0.0,
    }
    return FrameworkSnapshot(**(fields | changes))
