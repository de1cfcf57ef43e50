"""Simulated frameworks: greedy gRPC clients that speak the scheduler protocol.

Each subscribes, then answers every offer at once: it launches as many tasks of its
size as the offer holds (at most `tasks_per_offer`; 0 for no cap), or declines the
offer if none fits; it acknowledges every update that asks for it, as the SDK does.
It counts the tasks that ended (FINISHED, or any other end) and measures each task's
round trip, from the ACCEPT that launched it to its end's update.

One process runs several on one event loop (`run`, the process's entry point).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc.aio

from mesolite import grpc_utils
from mesolite.lab.bench._control import Outbox, WorkerGroup, run_worker
from mesolite.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

Call = scheduler_pb2.Call
Event = scheduler_pb2.Event
State = common_pb2.TaskState

_LIVE = (State.TASK_STAGING, State.TASK_STARTING, State.TASK_RUNNING)


@dataclass(frozen=True, slots=True)
class FrameworksSpec:
    master: str
    first: int
    count: int
    task: dict[str, float]  # each task's resources
    tasks_per_offer: int = 0  # 0: as many as fit
    batches: bool = True


@dataclass
class FrameworkStats:
    offers: int = 0
    accepts: int = 0
    declines: int = 0
    launched: int = 0
    finished: int = 0
    other_ends: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    round_trip: list[float] = field(default_factory=list)  # ACCEPT to the task's end
    offered: list[tuple[str, float]] = field(default_factory=list)  # (agent id, when)


class SimFramework:
    def __init__(self, index: int, group: Group) -> None:
        self._group = group
        self.name = f"bench-{index}"
        self._ids = itertools.count()
        self._launched_at: dict[str, float] = {}
        self._outbox: Outbox[Call] = Outbox(lambda calls: Call(batch=Call.Batch(calls=calls)))
        self.subscribed = False

    async def run(self) -> None:
        spec = self._group.spec
        async with grpc_utils.create_channel(spec.master) as channel:
            call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
            subscribe = Call.Subscribe(
                framework_info=scheduler_pb2.FrameworkInfo(name=self.name), batches=spec.batches
            )
            await call.write(Call(subscribe=subscribe))
            first = await call.read()
            if first is grpc.aio.EOF or first.WhichOneof("event") != "subscribed":
                self._group.stats.errors["not subscribed"] += 1
                return
            subscribed = first.subscribed
            self._outbox.batches = spec.batches and subscribed.batches
            self.subscribed = True
            writer = asyncio.create_task(self._outbox.write(call))
            try:
                while (event := await call.read()) is not grpc.aio.EOF:
                    self._handle(event)
            except grpc.aio.AioRpcError as e:
                self._group.stats.errors[f"stream ended: {e.code().name}"] += 1
            finally:
                writer.cancel()
                self.subscribed = False

    def send(self, message: Call) -> None:
        self._outbox.send(message)

    def _handle(self, event: Event) -> None:
        kind = event.WhichOneof("event")
        if kind == "offers":
            for offer in event.offers.offers:
                self._answer(offer)
        elif kind == "update":
            self._update(event.update.status)
        elif kind == "error":
            self._group.stats.errors[event.error.message[:80]] += 1
        elif kind == "batch":
            for inner in event.batch.events:
                self._handle(inner)

    def _answer(self, offer: scheduler_pb2.Offer) -> None:
        spec, stats = self._group.spec, self._group.stats
        stats.offers += 1
        stats.offered.append((offer.agent_id, time.monotonic()))
        have = offer.resources.scalars
        fits = min(int(have.get(name, 0.0) // amount) for name, amount in spec.task.items())
        if spec.tasks_per_offer:
            fits = min(fits, spec.tasks_per_offer)
        if fits <= 0:
            stats.declines += 1
            self.send(Call(decline=Call.Decline(offer_ids=[offer.offer_id])))
            return
        resources = common_pb2.Resources(scalars=spec.task)
        tasks = []
        now = time.monotonic()
        for _ in range(fits):
            task_id = f"{self.name}-{next(self._ids)}"
            self._launched_at[task_id] = now
            tasks.append(common_pb2.TaskInfo(task_id=task_id, command="true", resources=resources))
        stats.accepts += 1
        stats.launched += fits
        self.send(Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=tasks)))

    def _update(self, status: common_pb2.TaskStatus) -> None:
        stats = self._group.stats
        if status.update_id:
            self.send(
                Call(
                    acknowledge=Call.Acknowledge(
                        agent_id=status.agent_id,
                        task_id=status.task_id,
                        update_id=status.update_id,
                    )
                )
            )
        if status.state in _LIVE:
            return
        launched = self._launched_at.pop(status.task_id, None)
        if launched is None:
            return  # a retry of an end already counted
        stats.round_trip.append(time.monotonic() - launched)
        if status.state == State.TASK_FINISHED:
            stats.finished += 1
        else:
            stats.other_ends[State.Name(status.state)] += 1


class Group(WorkerGroup):
    """This process's frameworks and what they did."""

    def __init__(self, spec: FrameworksSpec) -> None:
        super().__init__()
        self.spec = spec
        self.stats = FrameworkStats()
        self.frameworks = [SimFramework(spec.first + i, self) for i in range(spec.count)]

    def start(self) -> None:
        self.tasks = [asyncio.create_task(f.run()) for f in self.frameworks]

    def mark(self) -> None:
        self.stats = FrameworkStats()

    def report(self) -> dict[str, Any]:
        s = self.stats
        return {
            "subscribed": sum(f.subscribed for f in self.frameworks),
            "offers": s.offers,
            "accepts": s.accepts,
            "declines": s.declines,
            "launched": s.launched,
            "finished": s.finished,
            "other_ends": dict(s.other_ends),
            "errors": dict(s.errors),
            "round_trip": s.round_trip[-20_000:],
            "offered": s.offered,
        }


def run(conn: Connection, spec: FrameworksSpec) -> None:
    """A worker process's entry point: `spec.count` frameworks, steered through `conn`."""
    run_worker(conn, lambda: Group(spec))
