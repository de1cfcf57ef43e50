"""Offers: allocation cycles, and what frameworks do with the offers.

An allocation cycle asks the allocator (pure) whom to offer what and sends the
offers; an accept launches tasks on the offers' agent, a decline returns the
resources with a refuse filter; an offer not answered within the offer
timeout, or whose agent or framework goes away, is rescinded.
"""

from __future__ import annotations

from collections.abc import Sequence

from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.core import MasterCore, checked, log, with_agent
from mesolite.master.errors import CallRejected
from mesolite.master.state import FrameworkRecord, OfferRecord, TaskRecord
from mesolite.model import (
    Offer,
    TaskSpec,
)
from mesolite.resources import EMPTY


class OfferHandling(MasterCore):
    @checked
    def allocate(self) -> int:
        """Run one allocation cycle and send the resulting offers; returns their count."""
        decisions = self.allocator.allocate()
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

        placed = [with_agent(spec, agent_id) for spec in tasks]
        # Recorded before any launch goes out: after a restart, a task the
        # registry knows but no agent reports is reported lost, never forgotten.
        self.registry.add_tasks(framework_id, agent_id, placed)
        for o in offers:
            self._drop_offer(o)
        self.metrics.offers_accepted(len(offers))
        for spec in placed:
            task = TaskRecord(spec, framework_id, agent_id)
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
        unused = offered - wanted
        self.allocator.recover(framework_id, agent_id, unused, refuse)
        self.activity.accepted += len(offers)
        self.activity.launched += len(placed)
        log.debug(
            "offers accepted",
            framework_id=framework_id,
            agent_id=agent_id,
            offer_ids=offer_ids,
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
