"""Simulated agents: gRPC clients that speak the agent's protocol and run no process.

Each registers on a connection of its own (as a real agent, one per host), heartbeats,
and answers every launch as the agent does, without starting anything: the task's
updates STARTING, RUNNING and then (after `task_seconds`) FINISHED, one in flight per
task, the next sent when the master relays the framework's acknowledgement, each
carrying the task's latest state (so the master frees the task's resources as soon as
the first update says it has ended). A kill ends the task KILLED.

One process runs many of them on one event loop (`run`, the process's entry point).
Registration retries with jittered backoff, like the real agent's; its failures are
counted by gRPC status, so a storm's refusals show.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc
import grpc.aio

from mesolite import grpc_utils
from mesolite.backoff import Backoff
from mesolite.errors import MesoliteError
from mesolite.lab.bench._control import Outbox, WorkerGroup, percentiles, run_worker
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2

Call = agent_pb2.AgentCall
Event = agent_pb2.AgentEvent
State = common_pb2.TaskState

RECONNECT = Backoff(initial=0.5, maximum=10.0)  # the real agent's (agent/config.py)


@dataclass(frozen=True, slots=True)
class AgentsSpec:
    master: str
    first: int  # the index of this process's first agent (host names sim-<index>)
    count: int
    resources: dict[str, float]
    task_seconds: float = 0.0
    batches: bool = True  # use the batched wire messages if the master offers them


@dataclass
class AgentStats:
    """What this process's agents did since the last mark."""

    launches: int = 0
    updates: int = 0
    acks: int = 0
    retries: int = 0
    # When the master was first told that a task ended (its resources are free), by
    # agent id: matched with the frameworks' offers for the offer latency.
    freed: list[tuple[str, float]] = field(default_factory=list)
    registered_in: list[float] = field(default_factory=list)  # start to Registered
    failures: collections.Counter[str] = field(default_factory=collections.Counter)


# An update not acknowledged within this is sent again (the real agent backs off from 1 s).
RETRY_AFTER = 2.0


class _Task:
    __slots__ = ("end_told", "framework_id", "pending", "sent_at", "task_id")

    def __init__(self, framework_id: str, task_id: str) -> None:
        self.framework_id = framework_id
        self.task_id = task_id
        self.pending: collections.deque[common_pb2.TaskStatus] = collections.deque()
        self.sent_at = 0.0
        self.end_told = False  # an update that said the task ended has gone out


class SimAgent:
    def __init__(self, index: int, fleet: Fleet) -> None:
        self._fleet = fleet
        self.hostname = f"sim-{index}"
        self.agent_id = ""
        self.registered = False
        self._tasks: dict[tuple[str, str], _Task] = {}
        self._outbox: Outbox[Call] = Outbox(lambda calls: Call(batch=Call.Batch(calls=calls)))

    async def run(self, started: float) -> None:
        """Register (retrying as the real agent does), then serve the master's events."""
        attempt = 0
        while True:
            try:
                await self._session(started)
                return
            except grpc.aio.AioRpcError as e:
                if self.registered:
                    self._fleet.stats.failures[f"stream ended: {e.code().name}"] += 1
                    return
                self._fleet.stats.failures[e.code().name] += 1
            except _EndedBeforeRegistered as e:
                self._fleet.stats.failures[str(e)] += 1
            await asyncio.sleep(RECONNECT.delay(attempt))
            attempt += 1

    async def _session(self, started: float) -> None:
        fleet = self._fleet
        async with grpc_utils.create_channel(fleet.spec.master) as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            register = Call.Register(
                hostname=self.hostname,
                total=common_pb2.Resources(scalars=fleet.spec.resources),
                isolation="simulated",
                batches=fleet.spec.batches,
            )
            await call.write(Call(register=register))
            first = await call.read()
            if first is grpc.aio.EOF:
                code = await call.code()
                if code is not grpc.StatusCode.OK:
                    raise grpc.aio.AioRpcError(
                        code, grpc.aio.Metadata(), grpc.aio.Metadata(), await call.details()
                    )
                raise _EndedBeforeRegistered("ended before Registered")
            if first.WhichOneof("event") != "registered":
                raise _EndedBeforeRegistered(f"first event {first.WhichOneof('event')}")
            self.agent_id = first.registered.agent_id
            # A master that does not know batches leaves `batches` unset: none are sent.
            self._outbox.batches = fleet.spec.batches and first.registered.batches
            self.registered = True
            fleet.stats.registered_in.append(time.monotonic() - started)
            fleet.registered += 1
            interval = first.registered.heartbeat_interval_seconds or 1.0
            writer = asyncio.create_task(self._outbox.write(call))
            heartbeats = asyncio.create_task(self._heartbeats(interval))
            try:
                while (event := await call.read()) is not grpc.aio.EOF:
                    self._handle(event)
            finally:
                heartbeats.cancel()
                writer.cancel()
                self.registered = False
                fleet.registered -= 1

    def send(self, message: Call) -> None:
        self._outbox.send(message)

    async def _heartbeats(self, interval: float) -> None:
        await asyncio.sleep(random.random() * interval)  # spread over the interval
        while True:
            self.send(Call(heartbeat=Call.Heartbeat()))
            await asyncio.sleep(interval)

    def _handle(self, event: Event) -> None:
        kind = event.WhichOneof("event")
        if kind == "launch_task":
            self._launch(event.launch_task)
        elif kind == "acknowledge":
            self._acknowledged(event.acknowledge)
        elif kind == "kill_task":
            self._kill(event.kill_task)
        elif kind == "batch":
            for inner in event.batch.events:
                self._handle(inner)

    def _launch(self, launch: Event.LaunchTask) -> None:
        fleet = self._fleet
        fleet.stats.launches += 1
        task = _Task(launch.framework_id, launch.task.task_id)
        self._tasks[(task.framework_id, task.task_id)] = task
        task.pending.append(self._status(task, State.TASK_STARTING))
        task.pending.append(self._status(task, State.TASK_RUNNING))
        if fleet.spec.task_seconds > 0:
            asyncio.get_running_loop().call_later(
                fleet.spec.task_seconds, self._end, task, State.TASK_FINISHED
            )
        else:
            self._end(task, State.TASK_FINISHED, send=False)
        self._send_head(task)

    def _end(self, task: _Task, state: int, send: bool = True) -> None:
        """The task ended: its end joins its updates, and its resources are free."""
        task.pending.append(self._status(task, state))
        if send and len(task.pending) == 1:  # nothing in flight: send it now
            self._send_head(task)

    def _kill(self, kill: Event.KillTask) -> None:
        task = self._tasks.get((kill.framework_id, kill.task_id))
        if task is not None and not any(_terminal(s.state) for s in task.pending):
            self._end(task, State.TASK_KILLED)

    def _acknowledged(self, ack: Event.Acknowledge) -> None:
        key = (ack.framework_id, ack.task_id)
        task = self._tasks.get(key)
        if task is None or not task.pending or task.pending[0].update_id != ack.update_id:
            return
        self._fleet.stats.acks += 1
        done = task.pending.popleft()
        if task.pending:
            self._send_head(task)
        elif _terminal(done.state):
            del self._tasks[key]

    def retry_unacknowledged(self, before: float) -> None:
        """Send again each update in flight since before `before` (as the agent does)."""
        if not self.registered:
            return
        for task in self._tasks.values():
            if task.pending and task.sent_at < before:
                self._fleet.stats.retries += 1
                self._send_head(task)

    def _send_head(self, task: _Task) -> None:
        self._fleet.stats.updates += 1
        task.sent_at = time.monotonic()
        if not task.end_told and _terminal(task.pending[-1].state):
            task.end_told = True  # the master frees the task's resources on this one
            self._fleet.stats.freed.append((self.agent_id, task.sent_at))
        self.send(
            Call(
                status_update=Call.StatusUpdate(
                    status=task.pending[0], latest_state=task.pending[-1].state
                )
            )
        )

    def _status(self, task: _Task, state: int) -> common_pb2.TaskStatus:
        return common_pb2.TaskStatus(
            task_id=task.task_id,
            framework_id=task.framework_id,
            agent_id=self.agent_id,
            state=state,  # type: ignore[arg-type]
            timestamp=time.time(),
            update_id=f"{self.hostname}-{next(self._fleet.update_ids)}",
            source=common_pb2.TaskStatus.SOURCE_AGENT,
        )


def _terminal(state: int) -> bool:
    return state not in (State.TASK_STARTING, State.TASK_RUNNING, State.TASK_STAGING)


class _EndedBeforeRegistered(MesoliteError):
    """The master ended a stream before it said Registered (counted, then retried)."""


class Fleet(WorkerGroup):
    """This process's agents and what they did."""

    def __init__(self, spec: AgentsSpec) -> None:
        super().__init__()
        self.spec = spec
        self.stats = AgentStats()
        self.registered = 0
        self.update_ids = itertools.count()
        self.agents = [SimAgent(spec.first + i, self) for i in range(spec.count)]
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self.tasks = [asyncio.create_task(a.run(self._started)) for a in self.agents]
        self.tasks.append(asyncio.create_task(self._retries()))

    async def _retries(self) -> None:
        while True:
            await asyncio.sleep(RETRY_AFTER / 2)
            before = time.monotonic() - RETRY_AFTER
            for agent in self.agents:
                agent.retry_unacknowledged(before)

    def mark(self) -> None:
        self.stats = AgentStats()

    def report(self) -> dict[str, Any]:
        s = self.stats
        return {
            "registered": self.registered,
            "launches": s.launches,
            "updates": s.updates,
            "acks": s.acks,
            "retries": s.retries,
            "freed": s.freed,
            "registered_in": percentiles(s.registered_in, (0.5, 0.95, 1.0)),
            "registrations": len(s.registered_in),
            "failures": dict(s.failures),
        }


def run(conn: Connection, spec: AgentsSpec) -> None:
    """A worker process's entry point: `spec.count` agents, steered through `conn`."""
    run_worker(conn, lambda: Fleet(spec))
