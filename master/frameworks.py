"""Frameworks: subscribing, failing over, tearing down, and the history of those that ended.

A framework subscribes (or re-subscribes with its id) on a stream; when the
stream goes, its failover timer starts, and when that expires, or it (or an
operator, `master/operator.py`) asks for a teardown, it is removed: its offers
rescinded, its tasks killed, and it is forgotten once they have ended
(`removing` until then, kept in the registry so a master restart in between
still kills them). Forgotten, it moves to `completed_frameworks` with its ended
tasks, when and why it ended: the newest `max_completed_frameworks` are kept, in
memory only (as Mesos' completed frameworks).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.acl import Action
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.effects import Peer
from mesolite.master.errors import Refusal, RegistrationRefused
from mesolite.master.registry import FrameworkEntry
from mesolite.master.state import FrameworkRecord
from mesolite.model import (
    DEFAULT_ROLE,
    FrameworkInfo,
)


class FrameworkHandling(MasterCore):
    @checked
    def subscribe(
        self,
        info: FrameworkInfo,
        outbox: Peer[msg.FrameworkMessage],
        principal: str | None = None,
    ) -> str:
        """`principal`: who is on the other end, from the connection (None without
        authentication). A new framework id belongs to it; only it may re-subscribe."""
        role = info.role or DEFAULT_ROLE
        info = FrameworkInfo(info.name, role, info.failover_timeout, info.framework_id, info.user)
        if problem := validation.framework_info_problem(info):
            raise RegistrationRefused(Refusal.INVALID, problem)
        if not self.authorized(Action.REGISTER_FRAMEWORKS, principal, role):
            raise RegistrationRefused(
                Refusal.FORBIDDEN,
                f"principal {principal!r} may not register frameworks in role {role!r}",
            )
        if not self.may_run_tasks_as(principal, info.user):
            raise RegistrationRefused(
                Refusal.FORBIDDEN,
                f"principal {principal!r} may not run tasks as user {info.user!r} "
                "(the ACLs' run_tasks)",
            )
        if info.framework_id:
            return self._resubscribe(info, outbox, principal)
        if len(self.frameworks) >= self.config.max_frameworks:
            raise RegistrationRefused(
                Refusal.PRECONDITION,
                f"this master has {len(self.frameworks)} frameworks, its maximum",
            )
        quota = self.config.max_frameworks_per_principal
        if principal is not None and (
            sum(f.principal == principal for f in self.frameworks.values()) >= quota
        ):
            raise RegistrationRefused(
                Refusal.PRECONDITION,
                f"principal {principal!r} has {quota} frameworks, its maximum",
            )
        roles = self.allocator.roles
        if not roles.has_role(role) and len(roles.role_paths()) >= self.config.max_roles:
            raise RegistrationRefused(
                Refusal.PRECONDITION,
                f"role {role!r} would be created, but this master has "
                f"{self.config.max_roles} roles, its maximum",
            )
        framework_id = self._new_id("F")
        framework = FrameworkRecord(
            framework_id, info, outbox, registered_at=self._wall_clock(), principal=principal
        )
        self.registry.add_framework(self._registry_entry(framework))
        self.frameworks[framework_id] = framework
        if self.allocator.add_framework(framework_id, role):
            log.info("role created on first use", role=role, weight=1.0)
        log.info(
            "framework subscribed",
            framework_id=framework_id,
            name=info.name,
            role=role,
            principal=principal,
            user=info.user or None,
        )
        outbox.send(msg.Subscribed(framework_id, self.config.framework_heartbeat_interval))
        self.request_allocation()
        return framework_id

    @staticmethod
    def _registry_entry(framework: FrameworkRecord) -> FrameworkEntry:
        info = framework.info
        return FrameworkEntry(
            framework.framework_id,
            info.name,
            info.role,
            info.failover_timeout,
            framework.registered_at,
            framework.removing,
            framework.principal,
            info.user,
        )

    def _resubscribe(
        self, info: FrameworkInfo, outbox: Peer[msg.FrameworkMessage], principal: str | None
    ) -> str:
        framework = self.frameworks.get(info.framework_id)
        if framework is None or framework.removing:
            raise RegistrationRefused(
                Refusal.NOT_FOUND, f"framework {info.framework_id} is not known to this master"
            )
        if framework.principal != principal:
            # As Mesos: a framework's principal may not change. Checked before the
            # role, so a stranger learns nothing about the framework.
            log.warning(
                "re-subscription by another principal refused",
                framework_id=framework.framework_id,
                principal=principal,
                owner=framework.principal,
            )
            raise RegistrationRefused(
                Refusal.FORBIDDEN,
                f"framework {info.framework_id} belongs to another principal",
            )
        if framework.info.role != info.role:
            raise RegistrationRefused(
                Refusal.INVALID,
                f"framework {info.framework_id} has role {framework.info.role!r}; "
                f"changing it to {info.role!r} is not supported",
            )
        if framework.info.user != info.user:
            # As Mesos (UPDATE_FRAMEWORK): its tasks, running and to come, keep one user.
            raise RegistrationRefused(
                Refusal.INVALID,
                f"framework {info.framework_id} runs its tasks as user "
                f"{framework.info.user!r}; changing it to {info.user!r} is not supported",
            )
        if framework.outbox is not None:
            framework.outbox.close("another scheduler subscribed with this framework id")
            self._rescind_offers(framework)
        if framework.failover_timer is not None:
            framework.failover_timer.cancel()
            framework.failover_timer = None
        if framework.info != info:
            framework.info = info
            self.registry.add_framework(self._registry_entry(framework))
        framework.outbox = outbox
        framework.deferred_reconciliations = []  # asked on the old stream
        framework.disconnected_at = None
        framework.suppressed = False
        self.allocator.revive(framework.framework_id)
        self.allocator.connect_framework(framework.framework_id)
        log.info("framework re-subscribed", framework_id=framework.framework_id, name=info.name)
        outbox.send(
            msg.Subscribed(framework.framework_id, self.config.framework_heartbeat_interval)
        )
        for status in framework.undelivered:
            outbox.send(msg.Update(status))
        framework.undelivered.clear()
        self.request_allocation()
        return framework.framework_id

    @checked
    def disconnect_framework(self, framework_id: str, outbox: Peer[Any]) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is None or framework.outbox is not outbox:
            return  # already replaced or torn down
        framework.outbox = None
        framework.deferred_reconciliations = []  # nobody to answer now
        framework.disconnected_at = self._clock()
        self._rescind_offers(framework)
        self.allocator.disconnect_framework(framework_id)
        self.log_reservations()
        timeout = framework.info.failover_timeout
        log.info("framework disconnected", framework_id=framework_id, failover_timeout=timeout)
        self._start_failover_timer(framework, timeout)

    def _start_failover_timer(self, framework: FrameworkRecord, timeout: float) -> None:
        framework_id = framework.framework_id
        framework.failover_timer = self._timers.call_later(
            timeout, self._failover_expired, framework_id
        )

    @checked
    def _failover_expired(self, framework_id: str) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is not None and not framework.connected:
            away = self._clock() - (framework.disconnected_at or self._clock())
            timeout = framework.info.failover_timeout
            log.info("framework failover timeout expired", framework_id=framework_id)
            self._remove_framework(
                framework,
                f"failover timeout expired: away for {away:.0f} s, "
                f"its failover timeout is {timeout:g} s",
            )

    @checked
    def teardown(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        log.info("framework teardown requested", framework_id=framework_id)
        self._remove_framework(framework, "torn down by the framework")

    def _remove_framework(self, framework: FrameworkRecord, reason: str) -> None:
        """Tear a framework down: kill its tasks, then forget it once they have ended.

        Its tasks' resources stay allocated until the agents report the tasks
        ended (or the agents are removed): freed any earlier, they would be
        offered while the processes still run, and the agent would refuse the
        launches for lack of room.
        """
        framework_id = framework.framework_id
        framework.ended_at, framework.end_reason = self._wall_clock(), reason
        self._rescind_offers(framework, notify=False)
        if framework.failover_timer is not None:
            framework.failover_timer.cancel()
            framework.failover_timer = None
        if framework.outbox is not None:
            framework.outbox.close("framework torn down")
            framework.outbox = None
        framework.deferred_reconciliations = []
        self.registry.mark_framework_removing(framework_id)
        framework.removing = True
        self.allocator.disconnect_framework(framework_id)
        self.log_reservations()
        for task in framework.tasks.values():
            agent = self.agents.get(task.agent_id)
            if agent is not None and agent.outbox is not None:
                agent.outbox.send(msg.KillTask(framework_id, task.spec.task_id))
            # Else the agent is away: the kill goes out when it re-registers (rule 5).
            log.info(
                "killing task of removed framework",
                framework_id=framework_id,
                task_id=task.spec.task_id,
                agent_id=task.agent_id,
                agent_connected=agent is not None and agent.outbox is not None,
            )
        log.info(
            "framework torn down",
            framework_id=framework_id,
            tasks=len(framework.tasks),
            reason=reason,
        )
        self._forget_if_done(framework)

    def _forget_if_done(self, framework: FrameworkRecord) -> None:
        """Forget a removing framework once none of its tasks can still be running.

        Tasks on agents still re-registering after a restart may come back;
        until then the framework stays (removing), so their return kills them.
        """
        framework_id = framework.framework_id
        if framework.removing and not framework.tasks and not self._tasks_expected(framework_id):
            self.registry.remove_framework(framework_id)
            self.allocator.remove_framework(framework_id)
            self.log_reservations()
            del self.frameworks[framework_id]
            self._keep_completed(framework)
            log.info("framework removed", framework_id=framework_id)
            self.request_allocation()

    def _keep_completed(self, framework: FrameworkRecord) -> None:
        """Keep a removed framework in the history, forgetting the oldest past the bound.

        What it keeps is what the views show: its info, when and why it ended, and
        its ended tasks (already bounded, without commands or environments)."""
        if framework.ended_at is None:  # torn down before the master restarted
            framework.ended_at = self._wall_clock()
            framework.end_reason = "torn down before the master restarted"
        framework.ended_counts = dict(Counter(t.state.value for t in framework.completed))
        framework.undelivered.clear()
        framework.completed_by_id.clear()
        framework.outbox = None
        framework.failover_timer = None
        self.completed_frameworks.pop(framework.framework_id, None)
        self.completed_frameworks[framework.framework_id] = framework
        while len(self.completed_frameworks) > self.config.max_completed_frameworks:
            oldest = next(iter(self.completed_frameworks))
            del self.completed_frameworks[oldest]

    @checked
    def revive(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        framework.suppressed = False
        self.allocator.revive(framework_id)
        log.info("offers revived", framework_id=framework_id)
        self.request_allocation()

    @checked
    def suppress(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        framework.suppressed = True
        self.allocator.suppress(framework_id)
        self.log_reservations()
        log.info("offers suppressed", framework_id=framework_id)
