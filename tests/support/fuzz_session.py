"""One fuzz example against a master, in-process or over the wire.

    session = InProcessSession(data, found, core)      # tests/test_fuzz_servicers.py
    session = WireSession(data, found, cluster, ...)   # tests/test_fuzz_wire.py
    await session.play()

An example opens two agents and two frameworks (each framework gets an offer and
launches a task, which its agent reports RUNNING), then plays a run of steps drawn
by hypothesis (`FuzzSession.STEPS`, and the subclass's own): calls on the open
streams, new streams (subscriptions and registrations, valid or not), clients
hanging up. Messages come from `tests/support/wire_strategies.py`, built from what
the master has at that step. After every step the checks of `tests/support/fuzzing.py`
run; at the end every client hangs up, the master must keep no stream open, and a new
agent and framework must still get a task launched and reported RUNNING.

The transports (`tests/support/servicer_streams.py`, `tests/support/wire_streams.py`)
differ in how the session waits for the master: in-process, by running the loop until
every stream is quiet; over the wire, by a barrier per stream, while the master's own
loops (allocation, health checks) run on.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, ClassVar, Protocol

import grpc
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mesolite.master.master import Master
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2
from tests.support import wire_strategies as ws
from tests.support.calls import launch, register, running, subscribe
from tests.support.fuzzing import REFUSALS, Figures, error_logs, kept_problems

Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall
Event = Any  # a scheduler_pb2.Event or an agent_pb2.AgentEvent

MAX_STEPS = 12
TOTAL = {"cpus": 4.0, "mem": 4096.0}
# Who may open streams when the transport authenticates (None: no certificate).
FRAMEWORK_PRINCIPALS = ("team-a", "team-b")
AGENT_PRINCIPALS = ("agent-1", "agent-2")
PRINCIPALS = st.sampled_from((*FRAMEWORK_PRINCIPALS, *AGENT_PRINCIPALS, None))


class FuzzStream(Protocol):
    """A client's stream, in-process or over the wire."""

    events: list[Any]
    ended: bool
    code: grpc.StatusCode | None
    details: str

    def send(self, request: Any) -> None: ...
    def close(self) -> None: ...
    def cancel(self) -> None: ...


class Transport(Protocol):
    streams: Any

    def framework(self, first: Call, principal: str | None = None) -> Any: ...
    def agent(self, first: AgentCall, principal: str | None = None) -> Any: ...
    def open(self) -> list[Any]: ...
    async def settle(self) -> None: ...
    async def aclose(self) -> None: ...


def kind_of(event: Any) -> str:
    """Which event a message is ("" for the bytes of a raw stream)."""
    return "" if isinstance(event, bytes) else str(event.WhichOneof("event"))


def launched(task_id: str) -> Callable[[Any], bool]:
    return lambda e: kind_of(e) == "launch_task" and e.launch_task.task.task_id == task_id


def updated(task_id: str) -> Callable[[Any], bool]:
    return lambda e: kind_of(e) == "update" and e.update.status.task_id == task_id


def wire_copy(message: Any) -> Any:
    """The message as the master's end of the wire would decode it."""
    return type(message).FromString(message.SerializeToString())


class FuzzSession(abc.ABC):
    """One example: a master, the streams a test opened on it, the steps it played."""

    STEPS: ClassVar[tuple[tuple[str, int], ...]] = (
        ("framework call", 8),
        ("agent call", 6),
        ("subscribe", 2),
        ("register", 2),
        ("hang up", 1),
    )
    # Whether nothing happens between steps but what they cause (in-process): then a
    # refused call or stream can be checked to have changed nothing at all.
    EXACT: ClassVar[bool] = False
    # Whether streams are opened by principals (the transport authenticates them).
    AUTHENTICATED: ClassVar[bool] = False

    def __init__(self, data: st.DataObject, found: Figures) -> None:
        self.data = data
        self.found = found
        self.logs: list[MutableMapping[str, Any]] = []
        self.frameworks: dict[int, str] = {}  # id(stream) -> framework id, once subscribed
        self.agents: dict[int, str] = {}  # id(stream) -> agent id, once registered
        # The principal each framework and agent id was first seen with: it never changes.
        self.owners: dict[tuple[str, str], str | None] = {}

    @property
    @abc.abstractmethod
    def master(self) -> Master: ...

    @property
    @abc.abstractmethod
    def streams(self) -> Transport: ...

    # How each transport waits for the master --------------------------------------

    @abc.abstractmethod
    async def offers(self, fw: Any) -> list[scheduler_pb2.Offer]:
        """The offers outstanding for `fw`, once it has some (or the wait is over)."""

    @abc.abstractmethod
    async def until(self, stream: Any, found: Callable[[Any], bool]) -> Any:
        """The first answer on `stream` that satisfies `found`; fails if none comes."""

    @abc.abstractmethod
    async def other_step(self, kind: str) -> None:
        """A step of the subclass's own STEPS."""

    @abc.abstractmethod
    def other_checks(self) -> None:
        """What the subclass checks after every step, besides `settled`'s checks."""

    async def disconnected(self) -> None:
        """Once every stream has ended: the master keeps none of them open."""
        assert self.connected_on_master() == [], self.connected_on_master()

    # Playing ----------------------------------------------------------------------

    async def play(self) -> None:
        try:
            with capture_logs() as self.logs:
                await self.set_up()
                assert self.logs, "the log capture must see the master's loggers"
                kinds = [k for k, weight in self.STEPS for _ in range(weight)]
                for _ in range(self.data.draw(st.integers(1, MAX_STEPS), label="steps")):
                    await self.step(self.data.draw(st.sampled_from(kinds), label="step"))
                await self.hang_up_all()
                await self.probe()
            self.found.examples += 1
        finally:
            await self.streams.aclose()

    async def set_up(self) -> None:
        """Two agents and two frameworks, each framework with a task RUNNING."""
        agents = [
            self.streams.agent(register(TOTAL), self.owner(AGENT_PRINCIPALS, i)) for i in range(2)
        ]
        fws = [
            self.streams.framework(subscribe(f"fw{i}"), self.owner(FRAMEWORK_PRINCIPALS, i))
            for i in range(2)
        ]
        await self.settled()
        for i, fw in enumerate(fws):
            offers = await self.offers(fw)
            if not offers or id(fw) not in self.frameworks:
                continue
            offer = offers[0]
            fw.send(launch(offer, f"t{i}", {"cpus": 1.0, "mem": 128.0}))
            agent = next(a for a in agents if self.agents.get(id(a)) == offer.agent_id)
            await self.until(agent, launched(f"t{i}"))
            agent.send(running(f"t{i}", self.frameworks[id(fw)], f"u{i}"))
            await self.until(fw, updated(f"t{i}"))
        await self.settled()

    async def step(self, kind: str) -> None:
        # The draws do not depend on the master's state (see tests/support/wire_strategies.py):
        # a stream is picked by index, and a call drawn even if no stream is there to send it.
        draw = self.data.draw
        known = ws.Known.of(self.master)
        fws = [s for s in self.streams.open() if id(s) in self.frameworks]
        agents = [s for s in self.streams.open() if id(s) in self.agents]
        if kind == "framework call":
            fw = draw(ws.pick(fws, None), label="framework")
            framework_id = self.frameworks[id(fw)] if fw else ""
            call = draw(ws.framework_calls(known, framework_id), label="call")
            if fw is not None:
                await self.framework_call(fw, call)
        elif kind == "agent call":
            agent = draw(ws.pick(agents, None), label="agent")
            agent_id = self.agents[id(agent)] if agent else ""
            agent_call = draw(ws.agent_calls(known, agent_id), label="call")
            if agent is not None:
                await self.send(agent, agent_call)
        elif kind == "subscribe":
            first = draw(ws.subscribes(known), label="first")
            who = self.principal(FRAMEWORK_PRINCIPALS)
            await self.new_stream(lambda: self.streams.framework(wire_copy(first), who), first)
        elif kind == "register":
            registration = draw(ws.registers(known), label="first")
            who = self.principal(AGENT_PRINCIPALS)
            await self.new_stream(
                lambda: self.streams.agent(wire_copy(registration), who), registration
            )
        elif kind == "hang up":
            stream = draw(ws.pick(self.streams.open(), None), label="stream")
            cancel = draw(st.booleans(), label="cancel")
            if stream is not None and cancel:
                stream.cancel()
            elif stream is not None:
                stream.close()
            await self.settled()
        else:
            await self.other_step(kind)

    def owner(self, group: Sequence[str], i: int) -> str | None:
        """Who opens the i-th stream of a set-up or a probe (nobody if anonymous)."""
        return group[i % len(group)] if self.AUTHENTICATED else None

    def principal(self, group: Sequence[str]) -> str | None:
        """Who opens a fuzzed stream: mostly one of `group`, else anyone or nobody. Drawn
        only if the transport authenticates."""
        if not self.AUTHENTICATED:
            return None
        return self.data.draw(
            ws.weighted((4, st.sampled_from(tuple(group))), (1, PRINCIPALS)), label="principal"
        )

    async def framework_call(self, fw: FuzzStream, call: Call) -> None:
        before = self.state() if self.EXACT else None
        errors = sum(1 for e in fw.events if kind_of(e) == "error")
        await self.send(fw, call)
        if sum(1 for e in fw.events if kind_of(e) == "error") > errors:
            self.found.refused += 1
            assert before is None or self.state() == before, f"a refused call changed: {call}"

    async def send(self, stream: FuzzStream, message: Any) -> None:
        stream.send(wire_copy(message))
        self.found.inputs += 1
        await self.settled()

    async def new_stream(self, open_stream: Callable[[], FuzzStream], first: Any) -> None:
        before = self.state() if self.EXACT else None
        stream = open_stream()
        self.found.inputs += 1
        await self.settled()
        if stream.ended:
            self.found.refused += 1
            assert stream.code in REFUSALS, (stream.code, stream.details)
            assert stream.events == [], stream.events
            assert before is None or self.state() == before, f"a refused stream changed: {first}"
        else:
            assert kind_of(stream.events[0]) in ("subscribed", "registered"), stream.events[0]

    async def settled(self) -> None:
        """Let the master handle everything sent; then check that it is sound."""
        await self.streams.settle()
        for stream in self.streams.streams:
            if stream.events and id(stream) not in self.frameworks | self.agents:
                first = stream.events[0]
                if kind_of(first) == "subscribed":
                    self.frameworks[id(stream)] = first.subscribed.framework_id
                elif kind_of(first) == "registered":
                    self.agents[id(stream)] = first.registered.agent_id
        assert error_logs(self.logs) == [], error_logs(self.logs)
        assert self.master.invariant_violations == [], self.master.invariant_violations
        assert kept_problems(self.master) == [], kept_problems(self.master)
        self.check_owners()
        self.other_checks()

    def check_owners(self) -> None:
        """No framework or agent id changes hands (nor after a restart: the registry
        keeps who registered it)."""
        master = self.master
        records = [("framework", f.framework_id, f.principal) for f in master.frameworks.values()]
        records += [("agent", a.agent_id, a.principal) for a in master.agents.values()]
        for kind, record_id, principal in records:
            first = self.owners.setdefault((kind, record_id), principal)
            assert first == principal, f"{kind} {record_id} of {first!r} is now {principal!r}'s"

    def state(self) -> object:
        """What a refused call or stream must leave unchanged (EXACT sessions)."""
        raise NotImplementedError

    # The end ----------------------------------------------------------------------

    def connected_on_master(self) -> list[str]:
        master = self.master
        return [f.framework_id for f in master.frameworks.values() if f.connected] + [
            a.agent_id for a in master.agents.values() if a.connected
        ]

    async def hang_up_all(self) -> None:
        """Every client goes, half by closing its stream, half by hanging up."""
        for i, stream in enumerate(self.streams.open()):
            if i % 2:
                stream.cancel()
            else:
                stream.close()
        await self.settled()
        assert self.streams.open() == []
        await self.disconnected()

    async def probe(self) -> None:
        """A new agent and a new framework: a task is launched and reported RUNNING."""
        agent = self.streams.agent(
            register({"cpus": 1.0, "mem": 128.0}), self.owner(AGENT_PRINCIPALS, 0)
        )
        fw = self.streams.framework(subscribe("probe"), self.owner(FRAMEWORK_PRINCIPALS, 0))
        await self.settled()
        assert id(agent) in self.agents and id(fw) in self.frameworks, (agent.code, fw.code)
        offers = [o for o in await self.offers(fw) if o.agent_id == self.agents[id(agent)]]
        assert offers, "the probe framework was offered nothing on the probe agent"
        fw.send(launch(offers[0], "probe", {"cpus": 1.0, "mem": 128.0}))
        await self.until(agent, launched("probe"))
        agent.send(running("probe", self.frameworks[id(fw)], "probe-1"))
        update = await self.until(fw, updated("probe"))
        assert update.update.status.state == common_pb2.TASK_RUNNING
        await self.hang_up_all()


def outstanding(master: Master, events: Sequence[Any]) -> list[scheduler_pb2.Offer]:
    """The offers among `events` still outstanding on `master`."""
    return [
        o
        for e in events
        if kind_of(e) == "offers"
        for o in e.offers.offers
        if o.offer_id in master.offers
    ]
