"""Agents: registration, re-registration, health and removal.

A new agent registers without an id and is given one; an agent the master
knows re-registers with the tasks it runs. `Registered` is always the first
message on an agent's stream; kills the master owes the agent for the tasks it
reported follow it. An agent that stops heartbeating for longer than the agent
timeout is removed: its tasks are reported lost and it is refused if it
comes back (it then kills its tasks and registers anew).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.acl import Action
from mesolite.master.core import MasterCore, checked, log, with_agent
from mesolite.master.effects import Peer
from mesolite.master.errors import Refusal, RegistrationRefused
from mesolite.master.registry import FrameworkEntry
from mesolite.master.state import AgentRecord, FrameworkRecord, TaskRecord
from mesolite.model import (
    DEFAULT_ROLE,
    FrameworkInfo,
    RunningTask,
    TaskState,
    TaskUsage,
)
from mesolite.resources import Resources


class AgentHandling(MasterCore):
    @checked
    def register_agent(
        self,
        agent_id: str,
        hostname: str,
        address: str,
        total: Resources,
        attributes: dict[str, str],
        running: Sequence[RunningTask],
        outbox: Peer[msg.AgentMessage],
        principal: str | None = None,
        *,
        peer_host: str = "",
        isolation: str = "",
        task_user: str = "",
    ) -> str:
        """`principal`: who is on the other end, from the connection (None without
        authentication); `peer_host`: the IP address it connects from, if known (the
        master reads its sandboxes there: `validation.sandbox_address`); `isolation` and
        `task_user`: how it contains tasks, for the operator's views. Everything is
        checked before anything changes."""
        self._check_registration(
            agent_id, hostname, address, total, attributes, running, principal, isolation, task_user
        )
        address = validation.sandbox_address(address, peer_host)
        now = self._clock()
        kills: list[msg.KillTask] = []  # sent after `Registered` (rule 3)
        if agent_id in self.agents:
            kills = self._reregister_known(self.agents[agent_id], address, running, outbox, now)
        elif agent_id in self.recovering_agents:
            self._add_agent(agent_id, hostname, address, total, attributes, outbox, now, principal)
            kills = self._reregister_recovered(self.agents[agent_id], running)
        else:
            agent_id = self._new_id("S")
            self._add_agent(agent_id, hostname, address, total, attributes, outbox, now, principal)
            log.info(
                "agent registered",
                agent_id=agent_id,
                hostname=hostname,
                resources=str(total),
                principal=principal,
            )
        self.agents[agent_id].isolation = isolation
        self.agents[agent_id].task_user = task_user
        outbox.send(msg.AgentRegistered(agent_id, self.config.agent_heartbeat_interval))
        for kill in kills:
            outbox.send(kill)
        self.request_allocation()
        return agent_id

    def _check_registration(
        self,
        agent_id: str,
        hostname: str,
        address: str,
        total: Resources,
        attributes: dict[str, str],
        running: Sequence[RunningTask],
        principal: str | None,
        isolation: str = "",
        task_user: str = "",
    ) -> None:
        """Raise `RegistrationRefused` for a registration the master must not apply."""
        problem = validation.agent_registration_problem(
            agent_id, total, running, address
        ) or validation.agent_info_problem(hostname, attributes, isolation, task_user)
        if problem:
            raise RegistrationRefused(Refusal.INVALID, problem)
        if not self.authorized(Action.REGISTER_AGENTS, principal):
            raise RegistrationRefused(
                Refusal.FORBIDDEN, f"principal {principal!r} may not register agents"
            )
        if agent_id in self.removed_agents:
            raise RegistrationRefused(
                Refusal.PRECONDITION,
                f"agent {agent_id} was removed from the cluster; register as a new agent",
            )
        known = self.agents.get(agent_id)
        if agent_id and known is None and agent_id not in self.recovering_agents:
            raise RegistrationRefused(
                Refusal.PRECONDITION,
                f"agent {agent_id} is not known to this master; register as a new agent",
            )
        if not agent_id:
            if len(self.agents) + len(self.recovering_agents) >= self.config.max_agents:
                raise RegistrationRefused(
                    Refusal.PRECONDITION,
                    f"this master has {self.config.max_agents} agents, its maximum",
                )
            return
        owner = known.principal if known else self.recovering_principals.get(agent_id)
        if owner != principal:
            log.warning(
                "registration with another principal's agent id refused",
                agent_id=agent_id,
                principal=principal,
                owner=owner,
            )
            raise RegistrationRefused(
                Refusal.FORBIDDEN, f"agent {agent_id} belongs to another principal"
            )
        capacity = known.total if known else total
        if problem := validation.reported_tasks_problem(
            agent_id, running, self._placed_on, capacity
        ):
            raise RegistrationRefused(Refusal.INVALID, problem)

    def _placed_on(self, framework_id: str, task_id: str) -> str | None:
        """The agent this master placed a task on, if it knows the task."""
        framework = self.frameworks.get(framework_id)
        task = framework.tasks.get(task_id) if framework else None
        if task is not None:
            return task.agent_id
        return self.recovering_placements.get((framework_id, task_id))

    def _reregister_known(
        self,
        agent: AgentRecord,
        address: str,
        running: Sequence[RunningTask],
        outbox: Peer[msg.AgentMessage],
        now: float,
    ) -> list[msg.KillTask]:
        """An agent this master already has connects again; returns the kills it owes."""
        if agent.outbox is not None:
            agent.outbox.close("the agent connected again")
        # Its offers go: what it runs may differ from what the master thought.
        self._rescind_agent_offers(agent.agent_id)
        agent.outbox = outbox
        agent.address = address
        self._heard_from(agent)
        reported = {(rt.framework_id, rt.task.task_id) for rt in running}
        for key, task in list(agent.tasks.items()):
            if key not in reported:
                self._terminate(task, TaskState.LOST, "the agent does not know this task")
        unplaced: list[msg.KillTask] = []
        for rt in running:
            known = agent.tasks.get((rt.framework_id, rt.task.task_id))
            if known is not None:
                if rt.state.is_terminal:  # ended while the agent was away
                    self._end_early(known, rt.state)
                continue
            # Not placed here by this master (which has run all along): never taken
            # into a framework's records on the agent's word; a live one is killed.
            # (An ended one whose end was applied awaits its acknowledgement.)
            unplaced += self._unplaced(agent, rt)
        self.allocator.activate_agent(agent.agent_id)
        kills = self._kills_owed(agent) + self._preemption_kills_owed(agent.agent_id) + unplaced
        log.info(
            "agent re-registered", agent_id=agent.agent_id, tasks=len(running), kills=len(kills)
        )
        return kills

    def _unplaced(self, agent: AgentRecord, rt: RunningTask) -> list[msg.KillTask]:
        """A task the agent reports that was never placed on it: a live one is killed,
        and neither is taken into any framework's records (nor its resources counted)."""
        if rt.state.is_terminal:
            return []
        log.warning(
            "agent reports a task never placed on it; killing it",
            agent_id=agent.agent_id,
            framework_id=rt.framework_id,
            task_id=rt.task.task_id,
        )
        return [msg.KillTask(rt.framework_id, rt.task.task_id)]

    def _kills_owed(self, agent: AgentRecord) -> list[msg.KillTask]:
        """Kills for the agent's tasks whose framework is being removed (rules 4 and 5)."""
        kills = []
        for (framework_id, task_id), task in agent.tasks.items():
            framework = self.frameworks[task.framework_id]
            if framework.removing:
                kills.append(msg.KillTask(framework_id, task_id))
                log.info(
                    "killing task of removed framework",
                    framework_id=framework_id,
                    task_id=task_id,
                    agent_id=agent.agent_id,
                )
        return kills

    def _add_agent(
        self,
        agent_id: str,
        hostname: str,
        address: str,
        total: Resources,
        attributes: dict[str, str],
        outbox: Peer[msg.AgentMessage],
        now: float,
        principal: str | None,
    ) -> None:
        self.registry.admit_agent(agent_id, hostname, total, self._wall_clock(), principal)
        self.agents[agent_id] = AgentRecord(
            agent_id,
            hostname,
            address,
            total,
            attributes,
            outbox,
            last_seen=now,
            registered_at=self._wall_clock(),
            principal=principal,
        )
        self._heard_from(self.agents[agent_id])
        self.allocator.add_agent(agent_id, total)
        self._cluster_changed()

    def _reregister_recovered(
        self, agent: AgentRecord, running: Sequence[RunningTask]
    ) -> list[msg.KillTask]:
        """An agent the registry knows comes back after a master restart (rule 2)."""
        expected = self._stop_recovering(agent.agent_id)
        if not self.recovering_agents and self._recovery_timer is not None:
            self._recovery_timer.cancel()
        placed_here = {(e.framework_id, e.task.task_id) for e in expected}
        unplaced: list[msg.KillTask] = []
        for rt in running:
            key = (rt.framework_id, rt.task.task_id)
            gone = rt.framework_id not in self.frameworks
            if key in placed_here or rt.state.is_terminal:
                self._adopt_task(agent, rt)  # ended ones hold nothing (rule 9)
            elif gone and len(self.frameworks) < self.config.max_frameworks:
                self._adopt_task(agent, rt)  # under a stand-in, then killed (rule 4)
            else:  # live, never placed here by the registry (or no room for a stand-in)
                unplaced += self._unplaced(agent, rt)
        reported = {(rt.framework_id, rt.task.task_id) for rt in running}
        lost = [e for e in expected if (e.framework_id, e.task.task_id) not in reported]
        for entry in lost:
            self.registry.remove_task(entry.framework_id, entry.task.task_id)
            self._notify(
                entry.framework_id,
                self._master_status(
                    entry.task.task_id,
                    entry.framework_id,
                    agent.agent_id,
                    TaskState.LOST,
                    "the agent no longer runs this task",
                ),
            )
        kills = self._kills_owed(agent) + unplaced
        log.info(
            "agent re-registered after master restart",
            agent_id=agent.agent_id,
            tasks=len(running),
            lost=len(lost),
            kills=len(kills),
        )
        # Removing frameworks waiting only for this agent's tasks (lost, or ended
        # while the master was away) are done.
        for framework_id in {e.framework_id for e in expected}:
            framework = self.frameworks.get(framework_id)
            if framework is not None:
                self._forget_if_done(framework)
        self._answer_deferred_reconciliations()
        return kills

    def _adopt_task(self, agent: AgentRecord, rt: RunningTask) -> None:
        """Take in a task an agent reports that this master does not know yet.

        A task of a framework this master does not know (rule 4) is adopted
        under a stand-in removing framework, so its resources stay counted
        until the kill that follows `Registered` has ended it.
        """
        framework = self.frameworks.get(rt.framework_id)
        if rt.state.is_terminal:
            self._adopt_ended_task(agent, rt, framework)
            return
        if framework is None:
            framework = self._stand_in(rt.framework_id)
            log.warning(
                "task of a framework this master does not know; it will be killed",
                agent_id=agent.agent_id,
                framework_id=rt.framework_id,
                task_id=rt.task.task_id,
            )
        spec = with_agent(rt.task, agent.agent_id)
        task = TaskRecord(spec, rt.framework_id, agent.agent_id, rt.state)
        framework.tasks[spec.task_id] = task
        agent.tasks[(rt.framework_id, spec.task_id)] = task
        self.allocator.grant(rt.framework_id, agent.agent_id, spec.resources)
        self.registry.add_tasks(rt.framework_id, agent.agent_id, [spec])
        log.info(
            "task adopted from agent",
            agent_id=agent.agent_id,
            framework_id=rt.framework_id,
            task_id=spec.task_id,
            state=rt.state.value,
        )

    def _adopt_ended_task(
        self, agent: AgentRecord, rt: RunningTask, framework: FrameworkRecord | None
    ) -> None:
        """A task that ended while the master was away, its end not yet acknowledged.

        It holds nothing; its updates, the end last, are forwarded when they come
        (`end_pending`), so its framework learns how it really ended.
        """
        key = (rt.framework_id, rt.task.task_id)
        if self._placed_on(*key) in (None, agent.agent_id):  # not its id used again
            self.registry.remove_task(*key)
        if framework is None:  # nobody to tell: its update is acknowledged as unknown
            return
        spec = with_agent(rt.task, agent.agent_id)
        task = TaskRecord(
            spec,
            rt.framework_id,
            agent.agent_id,
            rt.state,
            end_pending=True,
            ended_at=self._wall_clock(),
        )
        self._remember_completed(framework, task)
        log.info(
            "ended task reported by agent; its end will be forwarded",
            agent_id=agent.agent_id,
            framework_id=rt.framework_id,
            task_id=spec.task_id,
            state=rt.state.value,
        )

    def _deliver_pending_ends(self, agent_id: str, reason: str) -> None:
        """Ends the master knew of (`end_pending`) whose updates the removed agent
        will never deliver now: the master tells the frameworks itself."""
        for framework in self.frameworks.values():
            for task in [*framework.completed, *framework.ending.values()]:
                if task.end_pending and task.agent_id == agent_id:
                    self._end_delivered(framework, task)
                    self._notify(
                        task.framework_id,
                        self._master_status(
                            task.spec.task_id,
                            task.framework_id,
                            agent_id,
                            task.state,
                            f"the task ended; agent {agent_id} was removed before it "
                            f"delivered its updates: {reason}",
                        ),
                    )

    def _stand_in(self, framework_id: str) -> FrameworkRecord:
        """A removing framework for tasks whose framework is gone, in the default role."""
        info = FrameworkInfo("(gone)", DEFAULT_ROLE, 0.0, framework_id)
        framework = FrameworkRecord(
            framework_id,
            info,
            outbox=None,
            registered_at=self._wall_clock(),
            removing=True,
            ended_at=self._wall_clock(),
            end_reason="gone before the master restarted: its tasks found on agents were killed",
        )
        self.registry.add_framework(
            FrameworkEntry(
                framework_id, info.name, DEFAULT_ROLE, 0.0, framework.registered_at, removing=True
            )
        )
        self.frameworks[framework_id] = framework
        self.allocator.add_framework(framework_id, DEFAULT_ROLE, connected=False)
        return framework

    def agent_heartbeat(self, agent_id: str, usage: Sequence[TaskUsage] = ()) -> None:
        """The agent is alive; `usage` is what its running tasks use now. Only its own
        tasks' figures are taken; a task it does not measure has none."""
        agent = self.agents.get(agent_id)
        if agent is not None:
            self._heard_from(agent)
            measured = {(u.framework_id, u.task_id): u for u in usage}
            for key, task in agent.tasks.items():
                task.usage = measured.get(key)

    @checked
    def disconnect_agent(self, agent_id: str, outbox: Peer[Any]) -> None:
        agent = self.agents.get(agent_id)
        if agent is None or agent.outbox is not outbox:
            return
        agent.outbox = None
        self.allocator.deactivate_agent(agent_id)
        self.log_reservations()
        self._rescind_agent_offers(agent_id)
        log.info("agent disconnected", agent_id=agent_id)

    @checked
    def check_agent_health(self) -> list[str]:
        """Remove agents silent for longer than the agent timeout; returns their ids.
        Reads only those and the first agent that is not (`_heard_from`): a tick costs
        what changed, not the number of agents."""
        deadline = self._clock() - self.config.agent_timeout
        silent = []
        for agent_id in self._by_last_seen:
            if self.agents[agent_id].last_seen >= deadline:
                break
            silent.append(agent_id)
        for agent_id in silent:
            self.remove_agent(agent_id, "the agent stopped sending heartbeats")
        return silent

    @checked
    def remove_agent(self, agent_id: str, reason: str) -> None:
        agent = self.agents[agent_id]
        self._rescind_agent_offers(agent_id)
        for task in list(agent.tasks.values()):
            self._terminate(task, TaskState.LOST, f"agent {agent_id} was removed: {reason}")
        self._deliver_pending_ends(agent_id, reason)
        self.allocator.remove_agent(agent_id)
        self.log_reservations()
        self._cluster_changed()
        del self.agents[agent_id]
        del self._by_last_seen[agent_id]
        self.registry.remove_agent(agent_id, self._wall_clock())
        self._mark_removed(agent_id)
        if agent.outbox is not None:
            agent.outbox.close(reason)
        for framework in self.frameworks.values():
            if framework.outbox is not None:
                framework.outbox.send(msg.AgentFailure(agent_id))
        log.warning("agent removed", agent_id=agent_id, reason=reason)
        self.request_allocation()
