"""Preemption: taking resources back for roles below their guarantee or fair share.

The planner (`master/preemption.py`, pure) decides which tasks to take back; this
concern tracks how long each role has been starved, asks the planner on every
allocation cycle (`check_preemption`, called by the process's allocation loop
and the simulator), and carries out its decisions in two steps, as Mesos'
inverse offers and kill grace periods do:

1. the victim's framework is told first (`messages.Preemption`: the task, its
   agent, the grace period and the role it is for) and may end the task itself;
2. after `preemption_grace` seconds the agent is told to kill it. Its end reaches
   the framework as TASK_KILLED with reason REASON_CONTAINER_PREEMPTED, and its
   framework is offered nothing on that agent for `preemption_hold` seconds
   (`Allocator.hold`), so what was freed goes to the starved role and not back.

**Guarantees are honoured by default.** A role with a guarantee preempts for it
after `min_share_timeout` (default 15 s, `DEFAULT_MIN_SHARE_TIMEOUT`) below it;
so a guaranteed role that wants offers waits at most about min_share_timeout +
one allocation interval (the check) + `preemption_grace` + one allocation
interval (the offer): 15 + 1 + 5 + 1 = 22 s with the defaults, provided roles
above their own shares hold enough it can use. Fair-share preemption is off
unless a role sets `fair_share_timeout`. `--no-preemption` turns both off.

Preemption works on the roles frameworks are in, against their hierarchical
instantaneous fair shares (`master/fair_levels.py`). A role whose every framework
declared its demand (`master/demand.py`) is starved of its guarantee only as far as
its demand reaches (what it holds plus what it waits for), as the Fair Scheduler
caps min-share starvation at the demand: nothing is taken back for it that it could
not use.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from mesolite.master import messages as msg
from mesolite.master.core import MasterCore, checked, log
from mesolite.master.effects import Cancellable
from mesolite.master.preemption import Candidate, Kind, RoleState, Victim, plan, starvation
from mesolite.master.state import TaskRecord
from mesolite.model import TaskState, TaskStatus
from mesolite.resources import EMPTY, Resources

REASON_PREEMPTED = "REASON_CONTAINER_PREEMPTED"


@dataclass(slots=True)
class Preempting:
    """A task told it will be preempted, not yet ended."""

    for_role: str
    kind: Kind
    kill_at: float
    timer: Cancellable | None
    killed: bool = False  # the agent was told to kill it


class PreemptionHandling(MasterCore):
    def _start_preemption(self) -> None:
        self.preempting: dict[tuple[str, str], Preempting] = {}
        self.preemptions: Counter[str] = Counter()  # ended by preemption, by kind
        self._below_guarantee_since: dict[str, float] = {}
        self._below_fair_share_since: dict[str, float] = {}

    def _stop_preemption(self) -> None:
        for p in self.preempting.values():
            if p.timer is not None:
                p.timer.cancel()

    def role_states(self, track: bool = False) -> dict[str, RoleState]:
        """Every role a framework is in, as the planner sees it now. With `track`
        (the preemption check), starting and ending starvation is recorded too."""
        if not self.frameworks:
            return {}
        tree = self.allocator.roles
        total = self.allocator.total
        active = tree.active_roles()
        shares = self.instantaneous_fair_shares()
        held, demands = shares.held, shares.demands
        now = self._clock()
        states: dict[str, RoleState] = {}
        for path in held:
            spec = self.roles_config.spec(path)
            guarantee = tree.role_guarantee(path)
            state = RoleState(
                held[path],
                shares.fair.get(path, EMPTY),
                _within(guarantee, demands.get(path)),
                tree.role_weight(path),
                tree.role_resource_weights(path),
                wants=path in active,
                min_share_timeout=spec.effective_min_share_timeout if guarantee else None,
                fair_share_timeout=spec.fair_share_timeout,
                threshold=spec.fair_share_preemption_threshold,
            )
            below_g, below_f = starvation(state, total, self.allocator.policy)
            g_since = _since(self._below_guarantee_since, path, below_g, now, track)
            f_since = _since(self._below_fair_share_since, path, below_f, now, track)
            states[path] = dataclasses.replace(
                state,
                below_guarantee_for=None if g_since is None else now - g_since,
                below_fair_share_for=None if f_since is None else now - f_since,
            )
        if track:
            for since in (self._below_guarantee_since, self._below_fair_share_since):
                for path in [p for p in since if p not in states]:
                    del since[path]
        return states

    @checked
    def check_preemption(self) -> int:
        """Preempt what the planner says now; returns how many tasks it chose."""
        if not self.config.preemption:
            return 0
        states = self.role_states(track=True)
        if not any(_due(s) for s in states.values()):
            return 0
        tree = self.allocator.roles
        candidates = [
            Candidate(
                t.framework_id,
                t.spec.task_id,
                tree.framework_role(t.framework_id),
                t.agent_id,
                t.spec.resources,
                t.launched_at,
            )
            for fw in self.frameworks.values()
            if not fw.removing
            for t in fw.tasks.values()
            if not t.state.is_terminal
            and (t.framework_id, t.spec.task_id) not in self.preempting
            and self.agents[t.agent_id].outbox is not None
        ]
        allocated = EMPTY
        for agent_id in self.agents:
            allocated = allocated + self.allocator.agent_allocated(agent_id)
        free = self.allocator.total - allocated
        # Tasks already told count as given: to the role they are for, from their own.
        for (framework_id, task_id), p in self.preempting.items():
            pending = self.frameworks[framework_id].tasks[task_id]
            role = tree.framework_role(framework_id)
            if role in states:
                s = states[role]
                states[role] = dataclasses.replace(
                    s, allocation=s.allocation - pending.spec.resources
                )
            if p.for_role in states:
                s = states[p.for_role]
                states[p.for_role] = dataclasses.replace(
                    s, allocation=s.allocation + pending.spec.resources
                )
        victims = plan(states, candidates, free, self.allocator.total, self.allocator.policy)
        for v in victims:
            self._preempt(v)
        return len(victims)

    def _preempt(self, victim: Victim) -> None:
        task = victim.task
        key = (task.framework_id, task.task_id)
        grace = self.config.preemption_grace
        now = self._clock()
        timer = self._timers.call_later(grace, self._grace_over, *key)
        self.preempting[key] = Preempting(victim.for_role, victim.kind, now + grace, timer)
        framework = self.frameworks[task.framework_id]
        if framework.outbox is not None:
            framework.outbox.send(
                msg.Preemption(task.task_id, task.agent_id, grace, victim.for_role)
            )
        log.info(
            "preempting task",
            framework_id=task.framework_id,
            task_id=task.task_id,
            agent_id=task.agent_id,
            role=task.role,
            for_role=victim.for_role,
            kind=victim.kind.value,
            grace_seconds=grace,
        )

    @checked
    def _grace_over(self, framework_id: str, task_id: str) -> None:
        p = self.preempting.get((framework_id, task_id))
        framework = self.frameworks.get(framework_id)
        task = framework.tasks.get(task_id) if framework else None
        if p is None or task is None:
            return
        p.timer = None
        agent = self.agents.get(task.agent_id)
        if agent is None or agent.outbox is None:
            return  # killed when the agent is back (_preemption_kills_owed), or lost with it
        p.killed = True
        agent.outbox.send(msg.KillTask(framework_id, task_id))
        log.info(
            "killing preempted task",
            framework_id=framework_id,
            task_id=task_id,
            agent_id=task.agent_id,
            for_role=p.for_role,
        )

    def _preemption_kills_owed(self, agent_id: str) -> list[msg.KillTask]:
        """Kills for the agent's preempted tasks whose grace is over (an agent connecting
        again: it was away when the grace ended, or lost the kill with its stream)."""
        kills = []
        for key, p in self.preempting.items():
            framework_id, task_id = key
            framework = self.frameworks[framework_id]
            task = framework.tasks[task_id]
            # (A removing framework's tasks are all killed: master/agents.py `_kills_owed`.)
            if p.timer is None and task.agent_id == agent_id and not framework.removing:
                p.killed = True
                kills.append(msg.KillTask(framework_id, task_id))
                log.info(
                    "killing preempted task",
                    framework_id=framework_id,
                    task_id=task_id,
                    agent_id=agent_id,
                    for_role=p.for_role,
                )
        return kills

    def _preempted_ended(self, task: TaskRecord) -> float:
        p = self.preempting.pop((task.framework_id, task.spec.task_id), None)
        if p is None:
            return 0.0
        if p.timer is not None:
            p.timer.cancel()
        self.preemptions[p.kind.value] += 1
        self.metrics.preempted(p.kind.value)
        # The role it was for is given its chance: its wait starts again from now.
        for since in (self._below_guarantee_since, self._below_fair_share_since):
            if p.for_role in since:
                since[p.for_role] = self._clock()
        log.info(
            "task preempted",
            framework_id=task.framework_id,
            task_id=task.spec.task_id,
            agent_id=task.agent_id,
            for_role=p.for_role,
            kind=p.kind.value,
            state=task.state.value,
        )
        return self.config.preemption_hold

    def _revocable(self, framework_id: str, offered: Resources) -> Resources:
        """The part of an offer, just granted, beyond its role's guarantee: what the role
        would hold of each resource past its guarantee once this is used."""
        tree = self.allocator.roles
        role = tree.framework_role(framework_id)
        guarantee = tree.role_guarantee(role)
        if guarantee.is_empty():
            return offered
        before = tree.role_allocation(role) - offered  # the offer is already counted
        return Resources(
            {
                n: offered.get_amount(n)
                - max(
                    0.0, min(offered.get_amount(n), guarantee.get_amount(n) - before.get_amount(n))
                )
                for n in offered
            }
        )

    def _as_preempted(self, status: TaskStatus) -> TaskStatus:
        """A preempted task's end, as its framework is told: killed, for preemption."""
        p = self.preempting.get((status.framework_id, status.task_id))
        if p is None or status.state is not TaskState.KILLED or status.reason:
            return status
        return dataclasses.replace(
            status,
            reason=REASON_PREEMPTED,
            message=status.message or f"preempted for role {p.for_role} ({p.kind.value})",
        )


def _since(
    table: dict[str, float], path: str, starved: bool, now: float, track: bool
) -> float | None:
    if not track:
        return table.get(path) if starved else None
    if not starved:
        table.pop(path, None)
        return None
    return table.setdefault(path, now)


def _within(guarantee: Resources, demand: Resources | None) -> Resources:
    """The part of a guarantee the role can use: no more of each resource than its demand
    (the Fair Scheduler's min-share starvation is min(minShare, demand) - usage), all
    of it when its demand is unknown."""
    if demand is None:
        return guarantee
    return Resources({n: min(guarantee.get_amount(n), demand.get_amount(n)) for n in guarantee})


def _due(s: RoleState) -> bool:
    return (
        s.min_share_timeout is not None
        and s.below_guarantee_for is not None
        and s.below_guarantee_for >= s.min_share_timeout
    ) or (
        s.fair_share_timeout is not None
        and s.below_fair_share_for is not None
        and s.below_fair_share_for >= s.fair_share_timeout
    )
