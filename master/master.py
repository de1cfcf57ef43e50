"""`Master`: the master's core, composed from its concerns (see `master/core.py`).

    master = Master(config, timers=AsyncioTimers(loop))   # the process shell
    master = Master(config, timers=fake_timers, clock=fake_timers.now,
                    registry=Registry(None))               # a unit test

Build it, call its methods with domain values, and read what it queued on the
peers' outboxes; the process shell (`master/server.py`) runs its allocation
cycles and health checks on timers, and the servicers (`master/servicers.py`)
connect it to gRPC.
"""

from __future__ import annotations

from collections.abc import Iterable

from mesolite.master import messages as msg
from mesolite.master.agents import AgentHandling
from mesolite.master.config import MasterConfig
from mesolite.master.demand import DemandHandling
from mesolite.master.errors import CallRejected, OperatorCallRefused, Refusal, RegistrationRefused
from mesolite.master.frameworks import FrameworkHandling
from mesolite.master.offers import OfferHandling
from mesolite.master.operator import OperatorHandling
from mesolite.master.preemptions import PreemptionHandling
from mesolite.master.recovery import RecoveryHandling
from mesolite.master.role_settings import RoleHandling
from mesolite.master.state import TaskRecord
from mesolite.master.status_updates import StatusUpdateHandling

__all__ = [
    "CallRejected",
    "Master",
    "MasterConfig",
    "OperatorCallRefused",
    "Refusal",
    "RegistrationRefused",
]


class Master(
    FrameworkHandling,
    OfferHandling,
    AgentHandling,
    StatusUpdateHandling,
    RecoveryHandling,
    RoleHandling,
    OperatorHandling,
    PreemptionHandling,
    DemandHandling,
):
    def _start(self) -> None:
        self._start_preemption()
        self._apply_roles()
        self._recover()

    def send_framework_heartbeats(self) -> None:
        for framework in self.frameworks.values():
            if framework.outbox is not None:
                framework.outbox.send(msg.Heartbeat())

    def shutdown(self) -> None:
        """Cancel timers and close every stream (the master process is stopping)."""
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
        self._stop_preemption()
        for o in self.offers.values():
            if o.expiry_timer is not None:
                o.expiry_timer.cancel()
        for framework in self.frameworks.values():
            if framework.failover_timer is not None:
                framework.failover_timer.cancel()
            if framework.outbox is not None:
                framework.outbox.close("master shutting down")
        for agent in self.agents.values():
            if agent.outbox is not None:
                agent.outbox.close("master shutting down")

    def tasks(self) -> Iterable[TaskRecord]:
        for framework in self.frameworks.values():
            yield from framework.tasks.values()
