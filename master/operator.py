"""What an operator may do to the workload: tear a framework down, kill one task.

Called from the operator API (`master/operator_api.py`, `POST /api/v1/...`), as
Mesos' `/teardown` and its v1 operator API. The edge has already authenticated
the caller and asked the ACLs (`teardown_frameworks`, `kill_tasks`, each with the
framework's principal as its object); here the request is checked against the
state, refused with `OperatorCallRefused` before anything changes, and applied.
Every refusal and every act is logged with the ids and the operator's principal.

A teardown is the framework's own teardown, done for it: offers rescinded, its
tasks killed, the framework removed once they have ended, and then kept in the
history with the operator named as the reason. A kill is the framework's own
KILL: the agent is told to kill the task, and the framework hears the end
(TASK_KILLED) in the usual status update.
"""

from __future__ import annotations

from mesolite.master import messages as msg
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.errors import OperatorCallRefused, Refusal
from mesolite.master.state import FrameworkRecord
from mesolite.master.validation import clip, id_problem, task_id_problem


def _who(principal: str | None) -> str:
    return f"operator {principal!r}" if principal is not None else "an anonymous operator"


class OperatorHandling(MasterCore):
    @checked
    def operator_teardown(self, framework_id: str, principal: str | None) -> int:
        """Tear the framework down for an operator; returns how many of its tasks are
        being killed. Raises `OperatorCallRefused` (nothing changed)."""
        framework = self._live_framework(framework_id)
        tasks = len(framework.tasks)
        log.info(
            "framework teardown requested by an operator",
            framework_id=framework_id,
            principal=principal,
            tasks=tasks,
        )
        self._remove_framework(framework, f"torn down by {_who(principal)}")
        return tasks

    @checked
    def operator_kill(self, framework_id: str, task_id: str, principal: str | None) -> str:
        """Kill a task of a framework for an operator; returns the task's agent id.
        Raises `OperatorCallRefused` (nothing changed)."""
        if problem := id_problem("framework id", framework_id) or task_id_problem(task_id):
            raise OperatorCallRefused(Refusal.INVALID, problem)
        framework = self._live_framework(framework_id)
        task = framework.tasks.get(task_id)
        if task is None:
            ended = framework.completed_by_id.get(task_id)
            if ended is not None:
                raise OperatorCallRefused(
                    Refusal.PRECONDITION,
                    f"task {task_id} of framework {framework_id} has already ended: "
                    f"{ended.state.value}",
                )
            raise OperatorCallRefused(
                Refusal.NOT_FOUND,
                f"framework {framework_id} has no task {clip(task_id)!r}",
            )
        agent = self.agents.get(task.agent_id)
        if agent is None or agent.outbox is None:
            raise OperatorCallRefused(
                Refusal.PRECONDITION,
                f"agent {task.agent_id} of task {task_id} is disconnected: "
                "try again once it is back (or tear the framework down)",
            )
        agent.outbox.send(msg.KillTask(framework_id, task_id))
        log.info(
            "task kill requested by an operator",
            framework_id=framework_id,
            task_id=task_id,
            agent_id=task.agent_id,
            principal=principal,
        )
        return task.agent_id

    def _live_framework(self, framework_id: str) -> FrameworkRecord:
        """The framework an operator call names, if it may be acted on now."""
        if problem := id_problem("framework id", framework_id):
            raise OperatorCallRefused(Refusal.INVALID, problem)
        framework = self.frameworks.get(framework_id)
        if framework is None:
            ended = self.completed_frameworks.get(framework_id)
            if ended is not None:
                raise OperatorCallRefused(
                    Refusal.PRECONDITION,
                    f"framework {framework_id} has already ended: {ended.end_reason}",
                )
            raise OperatorCallRefused(
                Refusal.NOT_FOUND,
                f"framework {framework_id} is not known to this master",
            )
        if framework.removing:
            raise OperatorCallRefused(
                Refusal.PRECONDITION,
                f"framework {framework_id} is already being torn down: "
                f"{_count(len(framework.tasks), 'task')} still being killed",
            )
        return framework


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


__all__ = ["OperatorHandling"]
