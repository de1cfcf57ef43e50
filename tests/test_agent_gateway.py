"""The agent against a fake master: a real grpc.aio server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from mesolite import convert
from mesolite.agent import Agent, AgentConfig, AgentRegistrationError, Backoff
from mesolite.grpc_utils import bind, create_server
from mesolite.model import StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from mesolite.v1 import agent_pb2, agent_pb2_grpc
from tests.support.cgroups import TEST_ISOLATION
from tests.support.checkpoints import checkpoint_at
from tests.waiting import wait_for_condition, within

FW = "fw-1"
TOTAL = Resources(cpus=2, mem=1024)


@dataclass(frozen=True)
class _End:
    code: grpc.StatusCode | None
    details: str


@dataclass
class Stream:
    """One agent connection as the fake master sees it."""

    index: int
    register: agent_pb2.AgentCall.Register
    outbox: asyncio.Queue[agent_pb2.AgentEvent | _End] = field(default_factory=asyncio.Queue)
    half_closed: bool = False


@dataclass(frozen=True)
class Received:
    stream: int
    status: TaskStatus


class FakeMaster(agent_pb2_grpc.AgentGatewayServicer):
    """Registers agents, records what they send, and does what the test says."""

    def __init__(self) -> None:
        self.address = ""
        self.heartbeat_interval = 0.05
        self.should_ack: Callable[[TaskStatus], bool] = lambda status: True
        self.refuse_next: tuple[grpc.StatusCode, str] | None = None
        # Sent on the next stream *before* `registered`: a master breaking the order.
        self.before_registered: list[agent_pb2.AgentEvent] = []
        self.streams: list[Stream] = []
        self.updates: list[Received] = []
        self.heartbeats = 0
        # Says it reads batches (Registered.batches), and sends a test's events batched.
        self.batches = False
        self.batched_calls = 0  # calls that came inside an AgentCall.batch
        self._ids = itertools.count(1)

    # The servicer.

    # A coroutine writing through `context` is a valid grpc.aio handler; the
    # generated stub only knows about (async) iterators.
    async def Connect(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        first = await anext(aiter(request_iterator))
        assert first.WhichOneof("call") == "register"
        stream = Stream(len(self.streams), first.register)
        self.streams.append(stream)
        if self.refuse_next is not None:
            code, details = self.refuse_next
            self.refuse_next = None
            await context.abort(code, details)
        agent_id = first.register.agent_id or f"agent-{next(self._ids)}"
        for early in self.before_registered:
            await context.write(early)
        self.before_registered = []
        await context.write(
            agent_pb2.AgentEvent(
                registered=agent_pb2.AgentEvent.Registered(
                    agent_id=agent_id,
                    heartbeat_interval_seconds=self.heartbeat_interval,
                    batches=self.batches,
                )
            )
        )
        reader = asyncio.create_task(self._read(request_iterator, stream))
        try:
            while True:
                item = await stream.outbox.get()
                if self.batches and not isinstance(item, _End) and not stream.outbox.empty():
                    # What waits goes as one batch, up to an end of the stream.
                    events = [item]
                    while not stream.outbox.empty() and not isinstance(item, _End):
                        item = stream.outbox.get_nowait()
                        if not isinstance(item, _End):
                            events.append(item)
                    batch = agent_pb2.AgentEvent.Batch(events=events)
                    await context.write(agent_pb2.AgentEvent(batch=batch))
                    if not isinstance(item, _End):
                        continue
                if isinstance(item, _End):
                    if item.code is not None:
                        await context.abort(item.code, item.details)
                    return
                await context.write(item)
        finally:
            reader.cancel()

    async def _read(self, request_iterator: Any, stream: Stream) -> None:
        await self._record(request_iterator, stream)
        stream.half_closed = True
        # Like a real master: the agent half-closed, so end the stream.
        stream.outbox.put_nowait(_End(None, ""))

    async def _record(self, request_iterator: Any, stream: Stream) -> None:
        async for message in request_iterator:
            if message.WhichOneof("call") == "batch":
                assert self.batches, "a batch sent to a master that did not say it reads them"
                self.batched_calls += len(message.batch.calls)
                calls = list(message.batch.calls)
            else:
                calls = [message]
            for call in calls:
                self._record_one(call, stream)

    def _record_one(self, call: agent_pb2.AgentCall, stream: Stream) -> None:
        kind = call.WhichOneof("call")
        if kind == "heartbeat":
            self.heartbeats += 1
        elif kind == "status_update":
            status = convert.status_from_proto(call.status_update.status)
            self.updates.append(Received(stream.index, status))
            if self.should_ack(status):
                self.ack(status, stream)

    # What tests do with it.

    @property
    def stream(self) -> Stream:
        return self.streams[-1]

    def launch(self, task: TaskSpec, framework_id: str = FW) -> None:
        launch = agent_pb2.AgentEvent.LaunchTask(
            framework_id=framework_id, task=convert.task_to_proto(task)
        )
        self.stream.outbox.put_nowait(agent_pb2.AgentEvent(launch_task=launch))

    def kill(self, task_id: str, framework_id: str = FW) -> None:
        kill = agent_pb2.AgentEvent.KillTask(framework_id=framework_id, task_id=task_id)
        self.stream.outbox.put_nowait(agent_pb2.AgentEvent(kill_task=kill))

    def ack(self, status: TaskStatus, stream: Stream | None = None) -> None:
        ack = agent_pb2.AgentEvent.Acknowledge(
            framework_id=status.framework_id, task_id=status.task_id, update_id=status.update_id
        )
        (stream or self.stream).outbox.put_nowait(agent_pb2.AgentEvent(acknowledge=ack))

    def end_stream(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        self.stream.outbox.put_nowait(_End(code, details))

    def received(self, task_id: str, state: TaskState | None = None) -> list[TaskStatus]:
        return [
            r.status
            for r in self.updates
            if r.status.task_id == task_id and state in (None, r.status.state)
        ]

    def states(self, task_id: str) -> list[TaskState]:
        """The task's states in the order first received, ignoring re-sends."""
        seen: dict[str, TaskState] = {}
        for status in self.received(task_id):
            seen.setdefault(status.update_id, status.state)
        return list(seen.values())

    async def wait_state(self, task_id: str, state: TaskState) -> TaskStatus:
        await wait_for_condition(
            lambda: bool(self.received(task_id, state)),
            timeout=10,
            what=f"{task_id} {state.value} at the master",
        )
        return self.received(task_id, state)[0]

    async def wait_streams(self, count: int) -> Stream:
        await wait_for_condition(
            lambda: len(self.streams) >= count, timeout=10, what=f"{count} registrations"
        )
        return self.streams[count - 1]


@contextlib.asynccontextmanager
async def fake_master_server(master: FakeMaster, port: int = 0) -> AsyncIterator[FakeMaster]:
    server = create_server()
    agent_pb2_grpc.add_AgentGatewayServicer_to_server(master, server)
    master.address = f"127.0.0.1:{bind(server, '127.0.0.1', port)}"
    await server.start()
    try:
        yield master
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def master() -> AsyncIterator[FakeMaster]:
    async with fake_master_server(FakeMaster()) as master:
        yield master


StartAgent = Callable[..., Awaitable[Agent]]


def make_agent(master: FakeMaster, work_dir: Path, **overrides: Any) -> Agent:
    options: dict[str, Any] = dict(
        hostname="test-host",
        attributes={"rack": "r1"},
        kill_grace_period=0.5,
        reconnect_backoff=Backoff(initial=0.05, maximum=0.2),
        status_retry=Backoff(initial=0.2, maximum=1.0),
        stop_timeout=2.0,
        isolation=TEST_ISOLATION,
    )
    options.update(overrides)
    return Agent(AgentConfig(master.address, TOTAL, work_dir, **options))


@pytest.fixture
async def start_agent(master: FakeMaster, tmp_path: Path) -> AsyncIterator[StartAgent]:
    """Starts a registered agent; every agent started is stopped after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**overrides: Any) -> Agent:
            agent = await stack.enter_async_context(make_agent(master, tmp_path, **overrides))
            await within(agent.wait_registered(), 10, "the agent to register")
            return agent

        yield start


def task(task_id: str, command: str, cpus: float = 0.5) -> TaskSpec:
    return TaskSpec(task_id=task_id, command=command, resources=Resources(cpus=cpus, mem=64))


def task_pid(agent: Agent, task_id: str) -> int:
    record = checkpoint_at(agent.records_path(FW, task_id))
    pid = record["pid"]
    assert isinstance(pid, int)
    return pid


def group_alive(pgid: int) -> bool:
    """True while a live (not zombie) process is in process group `pgid`."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def test_registers_then_heartbeats(master: FakeMaster, start_agent: StartAgent) -> None:
    agent = await start_agent()

    assert agent.agent_id == "agent-1"
    register = master.stream.register
    assert register.agent_id == ""
    assert register.hostname == "test-host"
    assert dict(register.attributes) == {"rack": "r1"}
    assert convert.resources_from_proto(register.total) == TOTAL
    assert list(register.tasks) == []
    await wait_for_condition(lambda: master.heartbeats >= 3, what="three heartbeats")


async def test_launched_task_reports_starting_running_finished(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    master.launch(task("t1", "echo hi"))

    finished = await master.wait_state("t1", TaskState.FINISHED)
    assert master.states("t1") == [TaskState.STARTING, TaskState.RUNNING, TaskState.FINISHED]
    assert finished.exit_code == 0
    for status in master.received("t1"):
        assert status.source is StatusSource.AGENT
        assert status.agent_id == agent.agent_id
        assert status.framework_id == FW
        assert len(status.update_id) == 32
        assert status.timestamp > 0


async def test_unacknowledged_update_is_resent_and_holds_back_the_next(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    master.should_ack = lambda status: False
    await start_agent(stop_timeout=0.1)  # nothing will be acknowledged at stop either
    master.launch(task("t1", "true"))

    await wait_for_condition(
        lambda: len(master.received("t1", TaskState.STARTING)) >= 2, what="STARTING re-sent"
    )
    starting = master.received("t1")
    assert {s.update_id for s in starting} == {starting[0].update_id}
    assert master.states("t1") == [TaskState.STARTING]  # RUNNING waits for the ack

    master.ack(starting[0])
    running = await master.wait_state("t1", TaskState.RUNNING)
    master.ack(running)
    await master.wait_state("t1", TaskState.FINISHED)


async def test_acknowledged_update_is_not_resent(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    master.should_ack = lambda status: status.state is TaskState.STARTING
    await start_agent(stop_timeout=0.1)  # nothing will be acknowledged at stop either
    master.launch(task("t1", "true"))

    # Three sends of the unacknowledged RUNNING span more than STARTING's first retry.
    await wait_for_condition(
        lambda: len(master.received("t1", TaskState.RUNNING)) >= 3, what="RUNNING re-sent"
    )
    assert len(master.received("t1", TaskState.STARTING)) == 1


@pytest.mark.parametrize("code", [None, grpc.StatusCode.UNAVAILABLE])
async def test_reregisters_with_its_running_tasks(
    master: FakeMaster, start_agent: StartAgent, code: grpc.StatusCode | None
) -> None:
    agent = await start_agent()
    master.launch(task("t1", "sleep 30"))
    await master.wait_state("t1", TaskState.RUNNING)
    pid = task_pid(agent, "t1")

    master.end_stream(code, "master going away")
    register = (await master.wait_streams(2)).register

    assert register.agent_id == "agent-1"
    [running] = [convert.running_task_from_proto(t) for t in register.tasks]
    assert running.framework_id == FW
    assert running.state is TaskState.RUNNING
    assert running.task == task("t1", "sleep 30")
    assert await within(agent.wait_registered()) == "agent-1"
    assert group_alive(pid)


async def test_events_before_registered_do_not_drop_the_stream(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    """A master that sends a kill before `registered` (as one once did after a
    restart): the agent applies the kill, refuses a launch, and stays on the
    stream instead of reconnecting into the same exchange forever."""
    agent = await start_agent()
    master.launch(task("t1", "sleep 30"))
    await master.wait_state("t1", TaskState.RUNNING)
    pid = task_pid(agent, "t1")

    kill = agent_pb2.AgentEvent.KillTask(framework_id=FW, task_id="t1")
    launch = agent_pb2.AgentEvent.LaunchTask(
        framework_id=FW, task=convert.task_to_proto(task("early", "sleep 30"))
    )
    master.before_registered = [
        agent_pb2.AgentEvent(kill_task=kill),
        agent_pb2.AgentEvent(launch_task=launch),
    ]
    master.end_stream(grpc.StatusCode.UNAVAILABLE, "master restarting")
    await master.wait_streams(2)
    assert await within(agent.wait_registered()) == "agent-1"

    await master.wait_state("t1", TaskState.KILLED)
    failed = await master.wait_state("early", TaskState.FAILED)
    assert "before the agent was registered" in failed.message
    await wait_for_condition(lambda: not group_alive(pid), timeout=10, what="t1's processes gone")
    # Still on the second stream: nothing made the agent drop it.
    assert len(master.streams) == 2 and not master.stream.half_closed


async def test_reregistration_resends_unacknowledged_updates(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    master.should_ack = lambda status: False
    # Retries too slow to matter: only the re-registration re-sends.
    await start_agent(status_retry=Backoff(initial=60, maximum=60), stop_timeout=0.1)
    master.launch(task("t1", "true"))
    starting = await master.wait_state("t1", TaskState.STARTING)

    master.end_stream()
    await master.wait_streams(2)
    await wait_for_condition(
        lambda: any(r.stream == 1 for r in master.updates), what="update re-sent on stream 2"
    )
    assert [r.status.update_id for r in master.updates] == [starting.update_id] * 2


async def test_removed_agent_kills_its_tasks_and_registers_as_new(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    master.launch(task("t1", "sleep 30"))
    await master.wait_state("t1", TaskState.RUNNING)
    pid = task_pid(agent, "t1")

    master.end_stream(grpc.StatusCode.FAILED_PRECONDITION, "agent-1 was removed")
    register = (await master.wait_streams(2)).register

    assert register.agent_id == ""
    assert list(register.tasks) == []
    await wait_for_condition(lambda: not group_alive(pid), what="the task's processes to die")
    assert await within(agent.wait_registered()) == "agent-2"
    # The new agent works, and the old task's KILLED was never delivered.
    master.launch(task("t2", "true"))
    await master.wait_state("t2", TaskState.FINISHED)
    assert master.states("t1") == [TaskState.STARTING, TaskState.RUNNING]


async def test_refused_registration_stops_the_agent(master: FakeMaster, tmp_path: Path) -> None:
    master.refuse_next = (grpc.StatusCode.INVALID_ARGUMENT, "cpus must be positive")
    agent = make_agent(master, tmp_path)
    with pytest.raises(AgentRegistrationError, match="cpus must be positive"):
        await within(agent.run(), 10, "the agent to give up")


async def test_kill_task(master: FakeMaster, start_agent: StartAgent) -> None:
    agent = await start_agent()
    master.launch(task("t1", "sleep 30"))
    await master.wait_state("t1", TaskState.RUNNING)

    master.kill("t1")
    killed = await master.wait_state("t1", TaskState.KILLED)
    assert "SIGTERM" in killed.message
    assert agent.running_tasks() == []


async def test_launch_beyond_free_resources_fails(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    await start_agent()
    master.launch(task("big", "sleep 30", cpus=1.5))
    await master.wait_state("big", TaskState.RUNNING)

    master.launch(task("t2", "true", cpus=1))
    failed = await master.wait_state("t2", TaskState.FAILED)
    assert "insufficient resources" in failed.message
    assert master.states("t2") == [TaskState.FAILED]


async def test_duplicate_launch_is_ignored(master: FakeMaster, start_agent: StartAgent) -> None:
    agent = await start_agent()
    master.launch(task("t1", "sleep 30"))
    await master.wait_state("t1", TaskState.RUNNING)
    master.launch(task("t1", "sleep 30"))
    master.kill("t1")  # handled after the duplicate, so its KILLED comes after any reaction

    await master.wait_state("t1", TaskState.KILLED)
    assert master.states("t1") == [TaskState.STARTING, TaskState.RUNNING, TaskState.KILLED]
    assert agent.running_tasks() == []


async def test_reconnects_to_a_restarted_master(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        first = FakeMaster()
        first_server = contextlib.AsyncExitStack()
        stack.push_async_callback(first_server.aclose)
        await first_server.enter_async_context(fake_master_server(first))
        agent = await stack.enter_async_context(make_agent(first, tmp_path))
        await within(agent.wait_registered())
        first.launch(task("t1", "sleep 30"))
        await first.wait_state("t1", TaskState.RUNNING)
        port = int(first.address.rsplit(":", 1)[1])

        await first_server.aclose()
        second = FakeMaster()
        async with fake_master_server(second, port):
            register = (await second.wait_streams(1)).register
            assert register.agent_id == "agent-1"
            assert [t.task.task_id for t in register.tasks] == ["t1"]
            assert await within(agent.wait_registered()) == "agent-1"
            await agent.stop()


async def test_a_master_back_after_an_outage_is_reached_on_the_next_attempt(
    tmp_path: Path,
) -> None:
    """Each attempt uses a fresh channel: one whose connections kept failing would fail
    calls at once for up to gRPC's own reconnect backoff (2 s here), costing a whole
    extra delay of ours each time, so an agent could miss the re-registration window
    after a master restart."""
    attempts = 0

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.transport.abort()  # like a master that is not up yet

    async with contextlib.AsyncExitStack() as stack:
        first = FakeMaster()
        first_server = contextlib.AsyncExitStack()
        stack.push_async_callback(first_server.aclose)
        await first_server.enter_async_context(fake_master_server(first))
        delay = 0.6
        agent = await stack.enter_async_context(
            make_agent(first, tmp_path, reconnect_backoff=Backoff(delay, delay, jitter=0.0))
        )
        await within(agent.wait_registered())
        port = int(first.address.rsplit(":", 1)[1])
        await first_server.aclose()

        down = await asyncio.start_server(refuse, "127.0.0.1", port)
        await wait_for_condition(lambda: attempts >= 6, timeout=30, what="6 refused attempts")
        down.close()
        await down.wait_closed()
        second = FakeMaster()
        async with fake_master_server(second, port):
            back = asyncio.get_running_loop().time()
            await second.wait_streams(1)
            took = asyncio.get_running_loop().time() - back
            assert took < delay + 0.8, f"re-registered {took:.2f}s after the master was back"
            await agent.stop()


async def test_stop_kills_tasks_and_delivers_their_final_updates(
    master: FakeMaster, tmp_path: Path
) -> None:
    agent = make_agent(master, tmp_path)
    async with agent:
        await within(agent.wait_registered())
        master.launch(task("t1", "sleep 30"))
        await master.wait_state("t1", TaskState.RUNNING)
        pid = task_pid(agent, "t1")
    assert master.states("t1")[-1] is TaskState.KILLED
    assert master.stream.half_closed
    await wait_for_condition(lambda: not group_alive(pid), what="the task's processes to die")


async def test_ended_task_is_reregistered_until_its_end_is_acknowledged(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    master.should_ack = lambda status: status.state is not TaskState.FINISHED
    await start_agent(stop_timeout=0.1)  # nothing will be acknowledged at stop either
    master.launch(task("done", "true", cpus=1.5))
    await master.wait_state("done", TaskState.FINISHED)

    master.end_stream()
    register = (await master.wait_streams(2)).register
    # The master may not have heard of the end: told of the task and how it ended,
    # it does not mark it lost, and forwards the re-sent FINISHED.
    [ended] = [convert.running_task_from_proto(t) for t in register.tasks]
    assert (ended.task.task_id, ended.state) == ("done", TaskState.FINISHED)

    # A master that heard of the end may give its resources to another task; the
    # ended task holds none, so it is still reported beside it.
    master.launch(task("next", "sleep 30", cpus=1.5))
    await master.wait_state("next", TaskState.RUNNING)
    master.end_stream()
    register = (await master.wait_streams(3)).register
    reported = [convert.running_task_from_proto(t) for t in register.tasks]
    assert [(t.task.task_id, t.state) for t in reported] == [
        ("next", TaskState.RUNNING),
        ("done", TaskState.FINISHED),
    ]


async def test_with_a_master_that_reads_batches_it_reads_and_sends_them(
    master: FakeMaster, start_agent: StartAgent
) -> None:
    master.batches = True
    await start_agent()
    assert master.stream.register.batches  # it asked for batched events
    ids = [f"b{i}" for i in range(12)]  # 64 MB each, of 1024
    for task_id in ids:  # written to the agent as one batch of launches
        master.launch(task(task_id, "true", cpus=0.05))
    for task_id in ids:
        await master.wait_state(task_id, TaskState.FINISHED)
    # Twelve tasks reported at once: their updates went out batched, and the batched
    # acknowledgements were read (nothing was re-sent for want of one).
    assert master.batched_calls >= len(ids)
    assert all(
        master.states(t) == [TaskState.STARTING, TaskState.RUNNING, TaskState.FINISHED] for t in ids
    )
