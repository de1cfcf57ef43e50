"""Offers: allocation cycles, and what frameworks do with the offers.

An allocation cycle asks the allocator (pure) whom to offer what and sends the
offers; an accept launches tasks on the offers' agent, a decline returns the
resources with a refuse filter; an offer not answered within the offer
timeout, or whose agent or framework goes away, is rescinded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.core import MasterCore, checked, log, with_agent
from mesolite.master.errors import CallRejected
from mesolite.master.state import FrameworkRecord, OfferRecord, TaskRecord
from mesolite.model import (
    Offer,
    TaskSpec,
    TaskState,
)
from mesolite.resources import EMPTY, Resources

# Mesos' TaskStatus.Reason of the updates an ACCEPT answered as Mesos does makes.
INVALID_OFFERS = "REASON_INVALID_OFFERS"
TASK_INVALID = "REASON_TASK_INVALID"


@dataclass(frozen=True, slots=True)
class InvalidTask:
    """A task a front door could not read into a `TaskSpec` (a resource that is not a
    scalar, an executor): `accept_each` ends it TASK_ERROR with `problem`."""

    task_id: str
    problem: str


class OfferHandling(MasterCore):
    @checked
    def allocate(self) -> int:
        """Run one allocation cycle and send the resulting offers; returns their count."""
        decisions = self.allocator.allocate()
        self.log_reservations()
        self.allocation_cycles += 1
        by_framework: dict[str, list[Offer]] = {}
        for d in decisions:
            agent = self.agents[d.agent_id]
            offer = Offer(
                self._new_id("O"),
                d.framework_id,
                d.agent_id,
                agent.hostname,
                d.resources,
                dict(agent.attributes),
                self._revocable(d.framework_id, d.resources),
            )
            timer = None
            if self.config.offer_timeout > 0:
                timer = self._timers.call_later(
                    self.config.offer_timeout, self._offer_expired, offer.offer_id
                )
            self.offers[offer.offer_id] = OfferRecord(offer, timer)
            self.frameworks[d.framework_id].offers.add(offer.offer_id)
            by_framework.setdefault(d.framework_id, []).append(offer)
            log.debug(
                "offer made",
                offer_id=offer.offer_id,
                framework_id=d.framework_id,
                agent_id=d.agent_id,
                resources=d.resources,
            )
        for framework_id, offers in by_framework.items():
            outbox = self.frameworks[framework_id].outbox
            assert outbox is not None, "the allocator offers only to connected frameworks"
            outbox.send(msg.Offers(offers))
        self.metrics.offers_made(len(decisions))
        self.activity.offers += len(decisions)
        return len(decisions)

    @checked
    def accept(
        self,
        framework_id: str,
        offer_ids: Sequence[str],
        tasks: Sequence[TaskSpec],
        refuse_seconds: float | None,
    ) -> None:
        framework = self._framework(framework_id)
        offers = self._own_offers(framework, offer_ids)
        agent_ids = {o.offer.agent_id for o in offers}
        if len(agent_ids) != 1:
            raise CallRejected(f"the offers span {len(agent_ids)} agents; accept one agent's")
        agent_id = agent_ids.pop()
        agent = self.agents[agent_id]
        offered = sum((o.offer.resources for o in offers), EMPTY)
        if problem := validation.refuse_seconds_problem(refuse_seconds):
            raise CallRejected(problem)
        if problem := validation.tasks_problem(tasks, framework.tasks, agent_id):
            raise CallRejected(problem)
        refuse = validation.refuse_seconds(refuse_seconds)
        wanted = validation.resources_of(tasks)
        if not offered.contains(wanted):
            raise CallRejected(f"tasks need {wanted} but the offers hold only {offered}")
        if agent.outbox is None:
            raise CallRejected(f"agent {agent_id} is disconnected")

        self._launch(framework, agent_id, offers, tasks, offered - wanted, refuse)

    @checked
    def accept_each(
        self,
        framework_id: str,
        offer_ids: Sequence[str],
        tasks: Sequence[TaskSpec | InvalidTask],
        refuse_seconds: float | None,
    ) -> None:
        """ACCEPT as Mesos answers it: never refused as a whole. With offers that are
        not this framework's outstanding offers of one connected agent, each task ends
        TASK_DROPPED (REASON_INVALID_OFFERS; a front door shows TASK_LOST to a
        framework that is not partition-aware) and the valid offers' resources go
        back; else each task that is invalid, or does not fit in what is left of the
        offers, ends TASK_ERROR (REASON_TASK_INVALID) while the others launch."""
        framework = self._framework(framework_id)
        if len(tasks) > validation.MAX_TASKS_PER_CALL:
            raise CallRejected(
                f"{len(tasks)} tasks in one call, more than {validation.MAX_TASKS_PER_CALL}"
            )
        if problem := validation.refuse_seconds_problem(refuse_seconds):
            raise CallRejected(problem)
        refuse = validation.refuse_seconds(refuse_seconds)
        try:
            offers = self._own_offers(framework, offer_ids)
            agent_id = self._one_connected_agent(offers)
        except CallRejected as e:
            self._invalid_offers(framework, offer_ids, tasks, str(e))
            return
        offered = sum((o.offer.resources for o in offers), EMPTY)
        left = offered
        launched: list[TaskSpec] = []
        seen: set[str] = set()
        for task in tasks:
            if isinstance(task, InvalidTask):
                why: str | None = task.problem
            else:
                why = validation.task_problem(task, framework.tasks, seen, agent_id)
                if why is None and not left.contains(task.resources):
                    why = (
                        f"task {task.task_id} uses more resources {task.resources} "
                        f"than available {left}"
                    )
            if why is not None:
                self._task_error(framework_id, agent_id, task.task_id, why)
                continue
            assert isinstance(task, TaskSpec)
            seen.add(task.task_id)
            left = left - task.resources
            launched.append(task)
        self._launch(framework, agent_id, offers, launched, left, refuse)

    def _one_connected_agent(self, offers: Sequence[OfferRecord]) -> str:
        agent_ids = {o.offer.agent_id for o in offers}
        if len(agent_ids) != 1:
            raise CallRejected(f"the offers span {len(agent_ids)} agents; accept one agent's")
        agent_id = agent_ids.pop()
        if self.agents[agent_id].outbox is None:
            raise CallRejected(f"agent {agent_id} is disconnected")
        return agent_id

    def _invalid_offers(
        self,
        framework: FrameworkRecord,
        offer_ids: Sequence[str],
        tasks: Sequence[TaskSpec | InvalidTask],
        problem: str,
    ) -> None:
        """An accept of offers that cannot be used: the valid ones are taken back
        (unfiltered, as Mesos), and each task ends TASK_DROPPED."""
        framework_id = framework.framework_id
        for offer_id in dict.fromkeys(offer_ids[: validation.MAX_IDS_PER_CALL]):
            o = self.offers.get(offer_id)
            if o is not None and o.offer.framework_id == framework_id:
                self._drop_offer(o)
                self.allocator.recover(framework_id, o.offer.agent_id, o.offer.resources)
        log.info(
            "accept of invalid offers: its tasks are dropped",
            framework_id=framework_id,
            tasks=len(tasks),
            reason=problem,
        )
        for task in tasks:
            status = self._master_status(
                validation.clip(task.task_id, 200),
                framework_id,
                "",
                TaskState.DROPPED,
                f"Task launched with invalid offers: {problem}",
            )
            self._notify(framework_id, dataclasses.replace(status, reason=INVALID_OFFERS))
        self.request_allocation()

    def _task_error(self, framework_id: str, agent_id: str, task_id: str, problem: str) -> None:
        log.info(
            "task refused",
            framework_id=framework_id,
            agent_id=agent_id,
            task_id=validation.clip(task_id),
            reason=problem,
        )
        status = self._master_status(
            validation.clip(task_id, 200), framework_id, agent_id, TaskState.ERROR, problem
        )
        self._notify(framework_id, dataclasses.replace(status, reason=TASK_INVALID))

    def _launch(
        self,
        framework: FrameworkRecord,
        agent_id: str,
        offers: Sequence[OfferRecord],
        tasks: Sequence[TaskSpec],
        unused: Resources,
        refuse: float,
    ) -> None:
        """Use the offers: launch the (valid) tasks, return the rest with the filter."""
        framework_id = framework.framework_id
        agent = self.agents[agent_id]
        assert agent.outbox is not None
        placed = [with_agent(spec, agent_id) for spec in tasks]
        # Recorded before any launch goes out: after a restart, a task the
        # registry knows but no agent reports is reported lost, never forgotten.
        self.registry.add_tasks(framework_id, agent_id, placed)
        for o in offers:
            self._drop_offer(o)
        self.metrics.offers_accepted(len(offers))
        for spec in placed:
            task = TaskRecord(spec, framework_id, agent_id, launched_at=self._clock())
            framework.tasks[spec.task_id] = task
            agent.tasks[(framework_id, spec.task_id)] = task
            agent.outbox.send(msg.LaunchTask(framework_id, spec, framework.info.user))
            log.debug(
                "launching task",
                framework_id=framework_id,
                agent_id=agent_id,
                task_id=spec.task_id,
                resources=spec.resources,
                user=framework.info.user or None,
            )
        self.allocator.recover(framework_id, agent_id, unused, refuse)
        self.activity.accepted += len(offers)
        self.activity.launched += len(placed)
        log.debug(
            "offers accepted",
            framework_id=framework_id,
            agent_id=agent_id,
            offer_ids=[o.offer.offer_id for o in offers],
            tasks=len(tasks),
            unused=unused,
        )
        self.request_allocation()

    @checked
    def decline(
        self, framework_id: str, offer_ids: Sequence[str], refuse_seconds: float | None
    ) -> None:
        framework = self._framework(framework_id)
        offers = self._own_offers(framework, offer_ids)
        if problem := validation.refuse_seconds_problem(refuse_seconds):
            raise CallRejected(problem)
        refuse = validation.refuse_seconds(refuse_seconds)
        for o in offers:
            self._drop_offer(o)
            self.allocator.recover(framework_id, o.offer.agent_id, o.offer.resources, refuse)
        self.metrics.offers_declined(len(offers))
        self.activity.declined += len(offers)
        log.debug(
            "offers declined",
            framework_id=framework_id,
            offer_ids=offer_ids,
            refuse_seconds=refuse,
        )
        self.request_allocation()

    def _own_offers(
        self, framework: FrameworkRecord, offer_ids: Sequence[str]
    ) -> list[OfferRecord]:
        if not offer_ids:
            raise CallRejected("no offer ids given")
        if problem := validation.ids_problem("offer ids", offer_ids):
            raise CallRejected(problem)
        if len(set(offer_ids)) != len(offer_ids):
            raise CallRejected("offer ids repeat")
        found = []
        for offer_id in offer_ids:
            o = self.offers.get(offer_id)
            if o is None or o.offer.framework_id != framework.framework_id:
                raise CallRejected(
                    f"offer {validation.clip(offer_id)} is not outstanding for this framework "
                    "(unknown, rescinded or already used)"
                )
            found.append(o)
        return found

    @checked
    def _offer_expired(self, offer_id: str) -> None:
        o = self.offers.get(offer_id)
        if o is not None:
            log.info("offer timed out", offer_id=offer_id, framework_id=o.offer.framework_id)
            self.metrics.offers_rescinded("timeout")
            self._rescind(o)
            self.request_allocation()

    def _drop_offer(self, o: OfferRecord) -> None:
        del self.offers[o.offer.offer_id]
        framework = self.frameworks.get(o.offer.framework_id)
        if framework is not None:
            framework.offers.discard(o.offer.offer_id)
        if o.expiry_timer is not None:
            o.expiry_timer.cancel()

    def _rescind(self, o: OfferRecord, notify: bool = True) -> None:
        """Take an offer back; its resources return to the allocator unfiltered."""
        self._drop_offer(o)
        offer = o.offer
        self.allocator.recover(offer.framework_id, offer.agent_id, offer.resources)
        framework = self.frameworks.get(offer.framework_id)
        if notify and framework is not None and framework.outbox is not None:
            framework.outbox.send(msg.Rescind(offer.offer_id))
        log.info(
            "offer rescinded",
            offer_id=offer.offer_id,
            framework_id=offer.framework_id,
            agent_id=offer.agent_id,
        )

    def _rescind_offers(self, framework: FrameworkRecord, notify: bool = True) -> None:
        for offer_id in list(framework.offers):
            self.metrics.offers_rescinded("framework_gone")
            self._rescind(self.offers[offer_id], notify)

    def _rescind_agent_offers(self, agent_id: str) -> None:
        for o in [o for o in self.offers.values() if o.offer.agent_id == agent_id]:
            self.metrics.offers_rescinded("agent_lost")
            self._rescind(o)
