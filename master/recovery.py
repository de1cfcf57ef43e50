"""Recovering after a restart: the registry read back, and the rules that make a
master restart invisible to the workload.

Recovery rules (a master restart must never cost the workload)
---------------------------------------------------------------
Let W be `agent_reregister_timeout`, counted from the master's start.

1. Recovered frameworks get a grace: a framework the registry lists is
   removed only if it has not re-subscribed within W + its failover timeout
   of the master's start. A failover timeout measures time away from a
   *running* master; the grace is never shorter than W, whatever the
   failover timeout (0 included). Mesos starts no failover timer at all for
   frameworks recovered after a failover; mesolite bounds the wait instead.
2. Agents the registry lists have W to re-register; after that they are
   removed and the tasks the registry placed on them reported TASK_LOST
   (queued for frameworks that are away). Agents that return in time keep
   their tasks; tasks the registry placed there that the agent no longer
   reports are TASK_LOST.
3. The agent protocol has one order: `Registered` is the first message on
   every agent stream; kills for the tasks it reported come after it.
4. No orphans. A task an agent reports whose framework is gone (torn down
   before the restart, removed during it, or never known to this registry)
   is adopted under a *removing* framework: its resources stay allocated
   (so they are not offered while the process runs), it is killed after
   `Registered`, and its resources return when the agent reports the end.
   Torn-down frameworks stay in the registry, marked removing, until their
   last task has ended, so a restart in between still kills those tasks.
5. Teardown while an agent is disconnected (partitioned): the kill cannot be
   sent; it is sent again when that agent re-registers. If the agent is
   removed first, its tasks are LOST and the agent, refused on return,
   kills them itself.
6. Agent back before its frameworks: tasks are adopted under the recovered
   (disconnected) framework; their updates wait in the agent until the
   framework re-subscribes and acknowledges. Framework back before the
   agent: its tasks on the agent are unknown until the agent returns;
   explicit reconciliation of them gets no answer yet (as in Mesos).
7. Two restarts in a row: nothing is decided at a restart that a later
   restart could contradict; every grace and window starts again from the
   newest start, and the registry is written before anything is
   acknowledged, so the second master sees what the first acknowledged.
8. A registry from an older master is migrated in place; one from a newer
   master is refused (`master/registry.py`).
9. A task that ended while the master was away (its end not yet acknowledged)
   is reported by its agent in its end state: it holds nothing, is not
   TASK_LOST, and its updates, the end last, are forwarded when they come.
"""

from __future__ import annotations

from mesolite.master.core import MasterCore, checked, log
from mesolite.master.registry import TaskEntry
from mesolite.master.state import FrameworkRecord
from mesolite.model import (
    FrameworkInfo,
    TaskState,
)


class RecoveryHandling(MasterCore):
    def _recover(self) -> None:
        """Rebuild from the registry after a restart (rules 1, 2, 4 and 7).

        Offers and allocations are not restored: they follow from what agents
        report.
        """
        now = self._clock()
        window = self.config.agent_reregister_timeout
        for agent in self.registry.agents():
            if agent.removed:
                self._mark_removed(agent.agent_id)
            else:
                self.recovering_agents[agent.agent_id] = []
                self.recovering_principals[agent.agent_id] = agent.principal
        for task in self.registry.tasks():
            self.recovering_agents.setdefault(task.agent_id, []).append(task)
            self.recovering_placements[(task.framework_id, task.task.task_id)] = task.agent_id
        if self.recovering_agents:
            self._recovery_timer = self._timers.call_later(window, self._recovery_expired)
        for entry in self.registry.frameworks():
            info = FrameworkInfo(
                entry.name, entry.role, entry.failover_timeout, entry.framework_id, entry.user
            )
            framework = FrameworkRecord(
                entry.framework_id,
                info,
                outbox=None,
                registered_at=entry.registered_at,
                disconnected_at=now,
                removing=entry.removing,
                principal=entry.principal,
            )
            self.frameworks[entry.framework_id] = framework
            self.allocator.add_framework(entry.framework_id, entry.role, connected=False)
            if not entry.removing:
                self._start_failover_timer(framework, window + entry.failover_timeout)
        if self.frameworks or self.recovering_agents:
            log.info(
                "recovered from the registry",
                frameworks=len(self.frameworks),
                removing_frameworks=sum(f.removing for f in self.frameworks.values()),
                agents=len(self.recovering_agents),
                removed_agents=len(self.removed_agents),
                grace=window,
            )
        # A removing framework with no task left to wait for is done.
        for framework in list(self.frameworks.values()):
            if framework.removing and not self._tasks_expected(framework.framework_id):
                self._forget_if_done(framework)

    def _stop_recovering(self, agent_id: str) -> list[TaskEntry]:
        """The agent is back, or will not be: the tasks the registry placed on it."""
        tasks = self.recovering_agents.pop(agent_id)
        self.recovering_principals.pop(agent_id, None)
        for entry in tasks:
            self.recovering_placements.pop((entry.framework_id, entry.task.task_id), None)
        return tasks

    def _tasks_expected(self, framework_id: str) -> bool:
        """Whether an agent still re-registering was given a task of this framework."""
        return any(
            entry.framework_id == framework_id
            for entries in self.recovering_agents.values()
            for entry in entries
        )

    @checked
    def _recovery_expired(self) -> None:
        """Agents that did not come back are removed; their tasks are lost."""
        for agent_id in list(self.recovering_agents):
            tasks = self._stop_recovering(agent_id)
            self.registry.remove_agent(agent_id, self._wall_clock())
            self._mark_removed(agent_id)
            for entry in tasks:
                self._notify(
                    entry.framework_id,
                    self._master_status(
                        entry.task.task_id,
                        entry.framework_id,
                        agent_id,
                        TaskState.LOST,
                        f"agent {agent_id} did not re-register after the master restarted",
                    ),
                )
            log.warning("agent did not re-register; removed", agent_id=agent_id, tasks=len(tasks))
        for framework in list(self.frameworks.values()):
            self._forget_if_done(framework)
        self._answer_deferred_reconciliations()
