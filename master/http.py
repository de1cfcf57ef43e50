"""Read-only HTTP views of the master: `GET /state` as JSON, `GET /metrics` for Prometheus,
and the web UI (`master.ui_routes`).

The shape of /state is a contract that tools read; add fields, never rename.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from master.master import Master
from master.policies import DRFPolicy
from master.ui_routes import setup_ui
from mesolite.resources import EMPTY, Resources

MASTER_KEY = web.AppKey("master", Master)


def state_snapshot(master: Master) -> dict[str, Any]:
    alloc = master.allocator
    total = alloc.total
    now = master._clock()
    offered_by: dict[str, Resources] = {}
    for o in master.offers.values():
        owner = o.offer.framework_id
        offered_by[owner] = offered_by.get(owner, EMPTY) + o.offer.resources
    frameworks = []
    for f in master.frameworks.values():
        used = sum((t.spec.resources for t in f.tasks.values()), EMPTY)
        allocated = alloc.framework_allocation(f.framework_id)
        frameworks.append(
            {
                "id": f.framework_id,
                "name": f.info.name,
                "role": f.info.role,
                "weight": alloc.role_weight(f.info.role),
                "connected": f.connected,
                "suppressed": f.suppressed,
                "removing": f.removing,
                "failover_timeout": f.info.failover_timeout,
                "allocated": allocated.to_dict(),
                "used": used.to_dict(),
                "offered": offered_by.get(f.framework_id, EMPTY).to_dict(),
                "dominant_share": DRFPolicy().share(allocated, total),
                "weighted_dominant_share": alloc.framework_share(f.framework_id),
                "running_tasks": len(f.tasks),
                "completed_tasks": len(f.completed),
                "registered_at": f.registered_at,
            }
        )
    agents = []
    allocated_total = EMPTY
    for a in master.agents.values():
        allocated = alloc.agent_allocated(a.agent_id)
        allocated_total = allocated_total + allocated
        agents.append(
            {
                "id": a.agent_id,
                "hostname": a.hostname,
                "address": a.address,
                "attributes": a.attributes,
                "total": a.total.to_dict(),
                "allocated": allocated.to_dict(),
                "free": (a.total - allocated).to_dict(),
                "connected": a.connected,
                "healthy": a.connected and now - a.last_seen <= master.config.agent_timeout,
                "seconds_since_heartbeat": round(now - a.last_seen, 3),
                "running_tasks": len(a.tasks),
                "registered_at": a.registered_at,
            }
        )
    tasks = [
        {
            "id": t.spec.task_id,
            "name": t.spec.name,
            "framework_id": t.framework_id,
            "agent_id": t.agent_id,
            "state": t.state.value,
            "resources": t.spec.resources.to_dict(),
        }
        for t in master.tasks()
    ]
    offers = [
        {
            "id": o.offer.offer_id,
            "framework_id": o.offer.framework_id,
            "agent_id": o.offer.agent_id,
            "resources": o.offer.resources.to_dict(),
        }
        for o in master.offers.values()
    ]
    steady, instantaneous = master.fair_shares()
    tree = alloc.roles
    roles = []
    for path in sorted(tree.role_paths()):
        allocated = tree.role_allocation(path)
        roles.append(
            {
                "path": path,
                "weight": tree.role_weight(path),
                "guarantee": tree.role_guarantee(path).to_dict(),
                "limit": tree.role_limit(path),
                "configured": tree.role_configured(path),
                "allocated": allocated.to_dict(),
                "share": alloc.policy.share(allocated, total),
                "weighted_share": tree.role_share(path),
                "dominant_share": DRFPolicy().share(allocated, total),
                "steady_fair_share": steady.get(path, EMPTY).to_dict(),
                "instantaneous_fair_share": instantaneous.get(path, EMPTY).to_dict(),
                "active": tree.role_active(path),
                "frameworks": sum(1 for f in master.frameworks.values() if f.info.role == path),
            }
        )
    return {
        "master_id": master.master_id,
        "policy": alloc.policy.name,
        "started_at": master.started_at,
        "time": time.time(),
        "cluster": {
            "total": total.to_dict(),
            "allocated": allocated_total.to_dict(),
            "free": (total - allocated_total).to_dict(),
            "agents": len(agents),
            "frameworks": len(frameworks),
            "running_tasks": len(tasks),
            "outstanding_offers": len(offers),
        },
        "frameworks": frameworks,
        "roles": roles,
        "agents": agents,
        "offers": offers,
        "tasks": tasks,
        "removed_agents": sorted(master.removed_agents),
    }


async def _state(request: web.Request) -> web.Response:
    return web.json_response(state_snapshot(request.app[MASTER_KEY]))


def create_app(master: Master) -> web.Application:
    app = web.Application()
    app[MASTER_KEY] = master
    app.router.add_get("/state", _state)
    app.router.add_get("/metrics", make_aiohttp_handler(master.metrics.registry))
    setup_ui(app, master, state_snapshot)  # GET / (the web UI), /events, task sandboxes
    return app
