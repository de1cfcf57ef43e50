"""Task status: updates from agents, kills, acknowledgements, reconciliation.

Updates are applied once per update id (agents retry until acknowledged) and
forwarded to the framework each time; a terminal update frees the task's
resources. Updates the master makes itself (TASK_LOST when an agent is gone)
need no acknowledgement and wait for frameworks that are away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from mesolite.master import messages as msg
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.errors import CallRejected
from mesolite.master.state import AgentRecord, FrameworkRecord, TaskRecord
from mesolite.master.validation import MAX_UPDATES_PER_TASK, clip, id_problem, ids_problem
from mesolite.model import (
    StatusSource,
    TaskState,
    TaskStatus,
)

# A task's usual states: their updates are logged at debug (thousands a second).
_USUAL_COURSE = frozenset({TaskState.STARTING, TaskState.RUNNING, TaskState.FINISHED})

# Implicit reconciliations of one framework that may wait at once for agents
# re-registering after a restart (the SDK sends one per subscription).
MAX_DEFERRED_RECONCILIATIONS = 16


class StatusUpdateHandling(MasterCore):
    @checked
    def status_update(
        self, agent_id: str, status: TaskStatus, latest_state: TaskState | None = None
    ) -> None:
        """`latest_state`: of the task's newest update on the agent, queued behind this
        one. If terminal, the task's resources are freed now: a framework that does
        not acknowledge must not hold them (Mesos does the same)."""
        agent = self.agents.get(agent_id)
        if agent is None:
            return
        self._heard_from(agent)
        if problem := self._foreign_update(agent_id, status):
            log.warning(
                "status update refused",
                agent_id=agent_id,
                framework_id=clip(status.framework_id),
                task_id=clip(status.task_id),
                reason=problem,
            )
            return
        status = self._as_preempted(status)
        framework = self.frameworks.get(status.framework_id)
        task = framework.tasks.get(status.task_id) if framework else None
        if task is not None and _over_bound(task, status):
            self._acknowledge_here(agent, status, "update past the task's bound of updates")
            return
        if framework is None or task is None:
            task = self._completed_task(framework, status.task_id) if framework else None
            if task is not None and _over_bound(task, status):
                self._acknowledge_here(agent, status, "update past the task's bound of updates")
                return
            if task is not None and task.end_pending and status.update_id:
                # Ended early (below): its updates still reach the framework, in order.
                if status.update_id not in task.applied_updates:
                    task.applied_updates.add(status.update_id)
                    task.status = status
                    if status.state.is_terminal and framework is not None:
                        self._end_delivered(framework, task)
            elif task is None or status.update_id not in task.applied_updates:
                # Nobody is left to acknowledge it: do so, so the agent stops retrying.
                self._acknowledge_here(agent, status, "update for an unknown task")
                return
            elif not status.state.is_terminal:
                # A retry of an update from before the task's end (which the master
                # may have decided itself, say LOST): forwarded, it would show the
                # framework a live state after the end. Acknowledged here instead.
                self._acknowledge_here(agent, status, "stale update of an ended task")
                return
        else:
            if status.update_id not in task.applied_updates:
                self._apply(agent_id, task, status)
            if latest_state is not None and latest_state.is_terminal and not task.state.is_terminal:
                self._end_early(task, latest_state)
        if task.status is not status:  # applied before this call: the agent retried it
            self.metrics.update_retried()
        if framework is not None and framework.outbox is not None:
            framework.outbox.send(msg.Update(status))
            self.metrics.update_forwarded(status.state)
        elif (
            framework is not None
            and framework.removing
            and status.update_id
            and agent.outbox is not None
        ):  # torn down: nobody else will acknowledge it
            agent.outbox.send(
                msg.AcknowledgeUpdate(status.framework_id, status.task_id, status.update_id)
            )

    def _apply(self, agent_id: str, task: TaskRecord, status: TaskStatus) -> None:
        task.applied_updates.add(status.update_id)
        task.status = status
        self.activity.updates[status.state.value] += 1
        # The usual course at debug (counted for the activity line); anything else at info.
        logged = log.debug if status.state in _USUAL_COURSE else log.info
        logged(
            "task status",
            framework_id=status.framework_id,
            agent_id=agent_id,
            task_id=status.task_id,
            state=status.state.value,
            exit_code=status.exit_code,
            update_id=status.update_id,
        )
        if status.state.is_terminal:
            self._finish(task, status.state)
        else:
            task.state = status.state

    def _foreign_update(self, agent_id: str, status: TaskStatus) -> str | None:
        """Why an agent may not send this update: it speaks only for itself, and only
        of the tasks the master placed on it (as Mesos looks the task up on the
        sending agent). None if it may."""
        if status.source is not StatusSource.AGENT:
            return "an agent cannot speak as the master"
        if status.agent_id and status.agent_id != agent_id:
            return f"the update names agent {clip(status.agent_id)}"
        framework = self.frameworks.get(status.framework_id)
        if framework is None:
            return None  # acknowledged below, so the agent stops re-sending it
        task = framework.tasks.get(status.task_id)
        placed: Collection[str]
        if task is not None:
            placed = (task.agent_id,)
        else:
            # Ended: a task id may have been used again, on another agent.
            placed = framework.completed_on.get(status.task_id, ())
        if placed and agent_id not in placed:
            return f"the task was placed on agent {', '.join(sorted(placed))}"
        return None

    def _acknowledge_here(self, agent: AgentRecord, status: TaskStatus, what: str) -> None:
        """Acknowledge an update no framework will see, so the agent stops re-sending it."""
        if agent.outbox is not None and status.update_id:
            agent.outbox.send(
                msg.AcknowledgeUpdate(status.framework_id, status.task_id, status.update_id)
            )
        log.info(
            f"{what} acknowledged by the master",
            agent_id=agent.agent_id,
            framework_id=status.framework_id,
            task_id=status.task_id,
            state=status.state.value,
        )

    def kill(self, framework_id: str, task_id: str) -> None:
        framework = self._framework(framework_id)
        task = framework.tasks.get(task_id)
        if task is None:
            raise CallRejected(f"task {clip(task_id)} is not a running task of this framework")
        agent = self.agents[task.agent_id]
        if agent.outbox is None:
            raise CallRejected(f"agent {task.agent_id} of task {task_id} is disconnected")
        agent.outbox.send(msg.KillTask(framework_id, task_id))
        log.info(
            "kill requested", framework_id=framework_id, task_id=task_id, agent_id=task.agent_id
        )

    def kill_or_reconcile(self, framework_id: str, task_id: str) -> None:
        """KILL as Mesos answers it: a live task whose agent is connected is killed;
        of any other (unknown, ended, its agent away) the framework is told the latest
        state, as a reconciliation answers (TASK_LOST for a task this master does not
        know)."""
        framework = self._framework(framework_id)
        task = framework.tasks.get(task_id)
        agent = self.agents.get(task.agent_id) if task is not None else None
        if task is not None and agent is not None and agent.outbox is not None:
            self.kill(framework_id, task_id)
            return
        log.info(
            "kill of a task that is not running on a connected agent: reconciling it",
            framework_id=framework_id,
            task_id=clip(task_id),
        )
        self.reconcile(framework_id, [task_id])

    def acknowledge(self, framework_id: str, agent_id: str, task_id: str, update_id: str) -> None:
        """Relay a framework's acknowledgement to the agent: only of an update of its
        own task on that agent, that this master forwarded to it."""
        framework = self._framework(framework_id)
        if not update_id:
            raise CallRejected("acknowledge needs the update id")
        agent = self.agents.get(agent_id)
        if agent is None:
            raise CallRejected(f"agent {clip(agent_id)} is not known")
        task = framework.tasks.get(task_id) or self._completed_task(framework, task_id)
        if task is None or task.agent_id != agent_id or update_id not in task.applied_updates:
            raise CallRejected(
                f"update {clip(update_id)} of task {clip(task_id)} on agent {clip(agent_id)} "
                "is not one this master sent this framework"
            )
        if agent.outbox is not None:
            agent.outbox.send(msg.AcknowledgeUpdate(framework_id, task_id, update_id))
        log.debug(
            "update acknowledged",
            framework_id=framework_id,
            agent_id=agent_id,
            task_id=task_id,
            update_id=update_id,
        )

    def reconcile(self, framework_id: str, task_ids: Sequence[str], call_id: str = "") -> None:
        """Answer with the latest known state of each task, as Mesos does.

        Explicit (task ids given): the state of each task the master knows; a
        task it does not know is TASK_LOST, but only once no agent is still
        re-registering after a master restart. Until then any of them may
        bring it back, or report how it ended (an end the previous master
        applied while the framework was away is in no registry), so the
        master does not answer for it yet (as Mesos): the framework asks
        again.

        Implicit (no ids): every live task of the framework, then `Reconciled`
        with `call_id`, so the framework knows its picture is complete (the SDK
        holds offers until then). While agents the registry placed its tasks on
        are still re-registering after a restart, the whole answer waits for
        them (or for their window to end, their tasks then TASK_LOST first):
        answered earlier, it would leave out tasks that are running.
        """
        framework = self._framework(framework_id)
        assert framework.outbox is not None
        if problem := ids_problem("task ids", task_ids):
            raise CallRejected(problem)
        if not task_ids:
            self._reconcile_all(framework, call_id)
            return
        unanswered = []
        for task_id in task_ids:
            known = framework.tasks.get(task_id) or self._completed_task(framework, task_id)
            if known is not None and known.end_pending:
                # Its own updates, the end last, are on their way from its agent:
                # an answer now would show the end before them.
                unanswered.append(task_id)
            elif known is not None:
                framework.outbox.send(msg.Update(self._latest_status(known)))
            elif self.recovering_agents:
                unanswered.append(task_id)
            else:
                unknown = self._master_status(
                    task_id, framework_id, "", TaskState.LOST, "reconciliation: task is unknown"
                )
                framework.outbox.send(msg.Update(unknown))
        if unanswered:
            log.info(
                "reconciliation deferred: agents re-registering, or updates on their way",
                framework_id=framework_id,
                tasks=len(unanswered),
                agents=len(self.recovering_agents),
            )
        log.info("reconciled", framework_id=framework_id, tasks=len(task_ids))

    def _reconcile_all(self, framework: FrameworkRecord, call_id: str) -> None:
        framework_id = framework.framework_id
        if call_id and (problem := id_problem("call id", call_id)):
            raise CallRejected(problem)
        if self._tasks_expected(framework_id):
            if len(framework.deferred_reconciliations) >= MAX_DEFERRED_RECONCILIATIONS:
                raise CallRejected(
                    f"{MAX_DEFERRED_RECONCILIATIONS} reconciliations already wait for agents "
                    "re-registering after a master restart"
                )
            framework.deferred_reconciliations.append(call_id)
            log.info(
                "reconciliation deferred until the agents with its tasks re-register",
                framework_id=framework_id,
                call_id=call_id,
                agents=sum(
                    any(e.framework_id == framework_id for e in entries)
                    for entries in self.recovering_agents.values()
                ),
            )
            return
        self._answer_all(framework, [call_id])

    def _answer_all(self, framework: FrameworkRecord, call_ids: Sequence[str]) -> None:
        """The implicit reconciliation's answer: each live task, then the markers."""
        assert framework.outbox is not None
        for task in framework.tasks.values():
            framework.outbox.send(msg.Update(self._latest_status(task)))
        for call_id in call_ids:
            framework.outbox.send(msg.Reconciled(call_id, len(framework.tasks)))
        log.info(
            "reconciled",
            framework_id=framework.framework_id,
            tasks=len(framework.tasks),
            call_ids=list(call_ids),
        )

    def _answer_deferred_reconciliations(self) -> None:
        """Answer the implicit reconciliations that waited for agents, now that none
        of a framework's tasks can come back with an agent still re-registering."""
        for framework in self.frameworks.values():
            waiting = framework.deferred_reconciliations
            if waiting and not self._tasks_expected(framework.framework_id):
                framework.deferred_reconciliations = []
                if framework.outbox is not None and not framework.removing:
                    self._answer_all(framework, waiting)

    def _latest_status(self, task: TaskRecord) -> TaskStatus:
        last = task.status
        return TaskStatus(
            task.spec.task_id,
            task.framework_id,
            task.agent_id,
            task.state,
            message="reconciliation",
            exit_code=last.exit_code if last else None,
            reason=last.reason if last else "",
            timestamp=self._wall_clock(),
            source=StatusSource.MASTER,
        )

    def _completed_task(self, framework: FrameworkRecord, task_id: str) -> TaskRecord | None:
        """The newest ended task with this id (a task id may be used again)."""
        return framework.completed_by_id.get(task_id) or framework.ending.get(task_id)

    def _end_delivered(self, framework: FrameworkRecord, task: TaskRecord) -> None:
        """A task ended early has had its end applied (from its agent, or made by the
        master when the agent went away): nothing more of it is waited for."""
        task.end_pending = False
        task_id = task.spec.task_id
        if framework.ending.get(task_id) is task:
            # Back into the history, newest (the framework acknowledges the end next),
            # unless its id has been used again since.
            del framework.ending[task_id]
            _forget_placement(framework, task)
            if task_id not in framework.completed_by_id and task_id not in framework.tasks:
                self._remember_completed(framework, task)

    def _end_early(self, task: TaskRecord, state: TaskState) -> None:
        """The agent says the task ended, but its end update is still queued behind
        updates the framework has not acknowledged: free it now, forward them later."""
        task.end_pending = True
        self._finish(task, state)
        log.info(
            "task ended on the agent; freed before its updates are acknowledged",
            agent_id=task.agent_id,
            framework_id=task.framework_id,
            task_id=task.spec.task_id,
            state=state.value,
        )

    def _remember_completed(self, framework: FrameworkRecord, task: TaskRecord) -> None:
        """Keep an ended task, without its command and environment (what it needs to
        be answered for: ids, state, resources, its last status), a bounded number."""
        spec = task.spec
        if spec.command or spec.environment:
            task.spec = dataclasses.replace(spec, command="", environment={})
        framework.completed.append(task)
        framework.completed_by_id[spec.task_id] = task
        on = framework.completed_on.setdefault(spec.task_id, {})
        on[task.agent_id] = on.get(task.agent_id, 0) + 1
        while len(framework.completed) > self.config.max_completed_tasks_per_framework:
            old = framework.completed.popleft()
            newest = framework.completed_by_id.get(old.spec.task_id) is old
            if newest:
                del framework.completed_by_id[old.spec.task_id]
            if newest and old.end_pending:
                # Its updates, the end last, are still on their way: not forgotten yet.
                framework.ending[old.spec.task_id] = old
            else:
                _forget_placement(framework, old)

    def _terminate(self, task: TaskRecord, state: TaskState, reason: str) -> None:
        """End a task on the master's own authority and tell its framework."""
        status = self._master_status(
            task.spec.task_id, task.framework_id, task.agent_id, state, reason
        )
        task.status = status
        log.info(
            "task status",
            framework_id=task.framework_id,
            agent_id=task.agent_id,
            task_id=task.spec.task_id,
            state=state.value,
            reason=reason,
        )
        self._finish(task, state)
        self._notify(task.framework_id, status)

    def _finish(self, task: TaskRecord, state: TaskState) -> None:
        """Move a task to its terminal state and give its resources back."""
        task.state = state
        task.ended_at = self._wall_clock()
        self.registry.remove_task(task.framework_id, task.spec.task_id)
        framework = self.frameworks[task.framework_id]
        framework.tasks.pop(task.spec.task_id, None)
        self._remember_completed(framework, task)
        agent = self.agents.get(task.agent_id)
        if agent is not None:
            agent.tasks.pop((task.framework_id, task.spec.task_id), None)
            self.allocator.recover(task.framework_id, task.agent_id, task.spec.resources)
            self.allocator.hold(task.framework_id, task.agent_id, self._preempted_ended(task))
        self.request_allocation()
        self._forget_if_done(framework)


def _forget_placement(framework: FrameworkRecord, task: TaskRecord) -> None:
    on = framework.completed_on[task.spec.task_id]
    on[task.agent_id] -= 1
    if not on[task.agent_id]:
        del on[task.agent_id]
        if not on:
            del framework.completed_on[task.spec.task_id]


def _over_bound(task: TaskRecord, status: TaskStatus) -> bool:
    """A new live update for a task that has had MAX_UPDATES_PER_TASK already: an agent
    making up update ids would otherwise grow the task's record without end."""
    return (
        len(task.applied_updates) >= MAX_UPDATES_PER_TASK
        and status.update_id not in task.applied_updates
        and not status.state.is_terminal
    )
