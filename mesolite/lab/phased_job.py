"""A job for the dynamic-sharing experiment: keeps the cluster busy with tasks whose size
changes from phase to phase.

Like `examples.batch.BatchFramework` with `tasks=0`, it launches one task per offer and
hands the remainder back with `refuse_seconds=0`, so the master re-offers it at once to
whichever job now has the lowest share: the task-by-task progressive filling of the DRF
paper. Unlike it, the task size follows a phase (`set_phase`) and each task sleeps a
random time drawn from a seeded generator, so runs are repeatable up to scheduling.

At a phase boundary only *new* tasks take the new size; running tasks end on their own
(they are short), as in the paper. The job also revives: refuse filters left by offers
too small for the old size must not hide offers that fit the new one.

An offer too small for a task is declined, or, with `hold_seconds` > 0, kept for up to
that long in case more frees up on the same agent: the master re-offers resources the
moment a task ends, one task's worth at a time, so a job whose tasks need two CPUs would
otherwise almost never see two free CPUs on one agent while a job of one-CPU tasks takes
each freed CPU (`mesolite.lab.experiment` explains). Held offers count toward the job's share in
the allocator, as every offer does, so a job cannot hold more than DRF lets it.

With `demand_agents` > 0 the job declares its demand (`declare_demand`) when it subscribes
and at each phase change: tasks of the phase's shape, as many as that many agents of
`agent_capacity` could hold (it always wants more). The master then offers it only agents
where a task fits, and, with `--packing`, one task at a time where it fits best; the
job launches as many tasks as an offer holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from mesolite.framework_sdk import (
    Framework,
    MesoliteError,
    Offer,
    Resources,
    TaskSpec,
    TaskState,
    TaskStatus,
    new_task_id,
)

_log = structlog.get_logger(__name__)

# How long an offer too small for a task is refused once declined. A larger offer on the
# same agent (say, once one of its tasks ends) passes the filter at once, so this only
# saves the master from re-offering crumbs; a phase change clears it with revive().
DECLINE_SECONDS = 5.0


@dataclass(slots=True)
class JobStats:
    launched: int = 0
    finished: int = 0  # TASK_FINISHED
    failed: int = 0  # any other end (tasks killed at shutdown count here)
    rejected: int = 0  # calls the master refused
    declined: int = 0  # offers too small for a task, declined
    combined: int = 0  # launches that needed a held offer


class PhasedJob(Framework):
    """Runs tasks of `demands[phase]` forever, one per offer, each sleeping a random
    `durations` (min, max) seconds; offers too small are held up to `hold_seconds`."""

    def __init__(
        self,
        name: str,
        demands: Sequence[Resources],
        durations: tuple[float, float],
        seed: int,
        hold_seconds: float = 0.0,
        agent_capacity: Resources | None = None,
        demand_agents: int = 0,
    ) -> None:
        super().__init__(name=name)
        if not demands:
            raise ValueError("a job needs a demand for at least one phase")
        low, high = durations
        if not 0 < low <= high:
            raise ValueError(f"task durations must satisfy 0 < min <= max, got {durations}")
        if hold_seconds < 0:
            raise ValueError(f"hold_seconds must not be negative, got {hold_seconds}")
        if demand_agents and agent_capacity is None:
            raise ValueError("declaring a demand needs the agents' capacity")
        self.demands = list(demands)
        self.durations = (low, high)
        self.hold_seconds = hold_seconds
        self.agent_capacity = agent_capacity
        self.demand_agents = demand_agents
        self.phase = 0
        self.stats = JobStats()
        self._rng = random.Random(seed)
        self._subscribed = False
        self._winding_down = False
        self._held: dict[str, list[Offer]] = {}  # agent id -> offers too small alone
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._tasks: dict[str, tuple[str, Resources]] = {}  # task id -> (agent id, resources)
        self._on_agent: dict[str, Resources] = {}  # agent id -> what our tasks hold there

    @property
    def demand(self) -> Resources:
        return self.demands[self.phase]

    async def set_phase(self, phase: int) -> None:
        """From now on launch tasks of `demands[phase]`; running tasks are left alone."""
        self.phase = phase
        if self._subscribed:
            await self._declare()
            await self.revive()  # clear filters set against offers too small for the old size
            for agent_id in list(self._held):  # re-judged against the new size
                await self._try_launch(agent_id, [])

    async def wind_down(self) -> None:
        """Launch nothing more: give back held offers and ask for no more."""
        self._winding_down = True
        if self._subscribed:
            await self.suppress()
            for agent_id in list(self._held):
                await self._release(agent_id, refuse_seconds=0)

    # -- callbacks -----------------------------------------------------------------------

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self._subscribed = True
        await self._declare()  # a declaration lives in the master's memory: again each time

    async def on_disconnected(self) -> None:
        self._subscribed = False
        for agent_id in list(self._held):  # the master rescinds offers with the stream
            self._drop_held(agent_id)

    async def on_offers(self, offers: list[Offer]) -> None:
        by_agent: dict[str, list[Offer]] = {}
        for offer in offers:
            by_agent.setdefault(offer.agent_id, []).append(offer)
        for agent_id, fresh in by_agent.items():
            await self._try_launch(agent_id, fresh)

    async def on_rescind(self, offer_id: str) -> None:
        for agent_id, offers in list(self._held.items()):
            left = [o for o in offers if o.offer_id != offer_id]
            if len(left) != len(offers):
                if left:
                    self._held[agent_id] = left
                else:
                    self._drop_held(agent_id)

    async def on_update(self, status: TaskStatus) -> None:
        if not status.state.is_terminal:
            return
        placed = self._tasks.pop(status.task_id, None)
        if placed is not None:
            agent_id, resources = placed
            left = self._on_agent[agent_id] - resources
            if left.is_empty():
                del self._on_agent[agent_id]
            else:
                self._on_agent[agent_id] = left
        if status.state is TaskState.FINISHED:
            self.stats.finished += 1
        else:
            self.stats.failed += 1

    async def on_error(self, message: str, call_id: str) -> None:
        self.stats.rejected += 1
        _log.warning("call rejected", job=self.name, call_id=call_id, error=message)

    # -- internals -----------------------------------------------------------------------

    async def _declare(self) -> None:
        if not self.demand_agents or self.agent_capacity is None:
            return
        demand = self.demand
        per_agent = min(
            (
                int(self.agent_capacity.get_amount(n) // demand.get_amount(n))
                for n in demand
                if demand.get_amount(n) > 0
            ),
            default=0,
        )
        await self.declare_demand([(demand, per_agent * self.demand_agents)])

    async def _try_launch(self, agent_id: str, fresh: list[Offer]) -> None:
        """Launch one task on the agent's held and `fresh` offers together if it fits;
        otherwise hold them (or decline them when not holding)."""
        held = self._drop_held(agent_id)
        offers = held + fresh
        if not offers:
            return
        free = sum((o.resources for o in offers), Resources())
        demand = self.demand
        if self._winding_down:
            await self.decline(offers, refuse_seconds=0)
        elif free.contains(demand):
            # One task, or with a declared demand as many as the offers hold: the
            # master then offers no more than it placed, one task at a time.
            tasks: list[TaskSpec] = []
            while free.contains(demand) and (not tasks or self.demand_agents):
                seconds = self._rng.uniform(*self.durations)
                tasks.append(
                    TaskSpec(
                        task_id=new_task_id(self.name),
                        command=f"sleep {seconds:.2f}",
                        resources=demand,
                        name=f"{self.name} phase {self.phase + 1}",
                    )
                )
                free = free - demand
            # refuse_seconds=0: the remainder goes straight back to the allocator.
            await self.launch(offers, tasks, refuse_seconds=0)
            for task in tasks:
                self._tasks[task.task_id] = (agent_id, demand)
                self._on_agent[agent_id] = self._on_agent.get(agent_id, Resources()) + demand
            self.stats.launched += len(tasks)
            self.stats.combined += bool(held)
        elif self._worth_holding(agent_id):
            self._held[agent_id] = offers
            loop = asyncio.get_running_loop()
            self._expiry[agent_id] = loop.call_later(self.hold_seconds, self._expire, agent_id)
        else:
            self.stats.declined += 1
            await self.decline(offers, refuse_seconds=DECLINE_SECONDS)

    def _worth_holding(self, agent_id: str) -> bool:
        """Whether a task could fit on the agent once *other* jobs' tasks there end.

        Without the agent's size (`agent_capacity`), any offer is worth holding.
        """
        if self.hold_seconds <= 0:
            return False
        if self.agent_capacity is None:
            return True
        ours = self._on_agent.get(agent_id, Resources())
        return self.agent_capacity.contains(ours + self.demand)

    def _drop_held(self, agent_id: str) -> list[Offer]:
        timer = self._expiry.pop(agent_id, None)
        if timer is not None:
            timer.cancel()
        return self._held.pop(agent_id, [])

    def _expire(self, agent_id: str) -> None:
        task = asyncio.create_task(self._release(agent_id, refuse_seconds=DECLINE_SECONDS))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, agent_id: str, refuse_seconds: float) -> None:
        offers = self._drop_held(agent_id)
        if offers and self._subscribed:
            self.stats.declined += 1
            with contextlib.suppress(MesoliteError):  # the stream went away meanwhile
                await self.decline(offers, refuse_seconds=refuse_seconds)
