"""Fuzz the master's gRPC servicers in-process: thousands of inputs, no network.

Each example builds a master core (invariants checked after every step, an ACL
file that denies some roles), opens streams on its real servicers
(`tests/support/servicer_streams.py`: `SchedulerService.Connect` and
`AgentGatewayService.Connect` with a fake context), sets up two agents and two
frameworks with a task each, then plays a run of steps drawn by hypothesis:
calls on the open streams, new streams (subscriptions and registrations, valid or
not), allocation cycles, time passing (offers and failover timeouts, agents going
silent), clients hanging up and master restarts (a new master on the same registry,
which agents and frameworks come back to). The calls come from
`tests/support/wire_strategies.py`, nearly valid, naming the offers, tasks, agents
and frameworks the master has at that step.

After every step (`tests/support/fuzzing.py`): no crash, refusals only as
documented, a refused call or stream changed nothing, the invariants hold, what
the master keeps is valid. At the end every client hangs up, every stream ends,
and a new agent and framework still get a task launched and RUNNING.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from mesolite.master.servicers import AgentGatewayService, SchedulerService
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2
from tests.support import wire_strategies as ws
from tests.support.core import CONFIG, CoreHarness
from tests.support.fuzzing import (
    REFUSALS,
    Figures,
    error_logs,
    figures,
    fuzz_settings,
    fuzz_timeout,
    kept_problems,
)
from tests.support.servicer_streams import AgentStream, FrameworkStream, ServicerStreams

# In-process, but tens of seconds: `make test-fast` leaves it out (tests/conftest.py).
pytestmark = [pytest.mark.unit, pytest.mark.slow, fuzz_timeout(300)]

# About 30 s and 7,000 inputs on a loaded 2-core machine.
CI_EXAMPLES = 1200
MAX_STEPS = 12
Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall

# Frameworks may register in these roles (and below a/ and eng/); the rest is denied.
ACLS = {
    "register_frameworks": [
        {"principals": {"type": "ANY"}, "roles": {"values": ["*", "a", "a/*", "eng", "eng/*"]}}
    ],
    "register_agents": [{"principals": {"type": "ANY"}}],
}
STEPS = (
    ("framework call", 8),
    ("agent call", 6),
    ("subscribe", 2),
    ("register", 2),
    ("allocate", 2),
    ("time", 1),
    ("hang up", 1),
    ("restart", 1),
)


def subscribe(name: str, role: str = "*", framework_id: str = "") -> Call:
    info = scheduler_pb2.FrameworkInfo(name=name, role=role, framework_id=framework_id)
    return Call(subscribe=Call.Subscribe(framework_info=info))


def register(total: dict[str, float], agent_id: str = "") -> AgentCall:
    return AgentCall(
        register=AgentCall.Register(
            agent_id=agent_id,
            hostname="host",
            address="127.0.0.1:1",
            total=common_pb2.Resources(scalars=total),
        )
    )


def running(task_id: str, framework_id: str, update_id: str) -> AgentCall:
    status = common_pb2.TaskStatus(
        task_id=task_id,
        framework_id=framework_id,
        state=common_pb2.TASK_RUNNING,
        update_id=update_id,
        source=common_pb2.TaskStatus.SOURCE_AGENT,
    )
    return AgentCall(status_update=AgentCall.StatusUpdate(status=status))


def launch(offer: scheduler_pb2.Offer, task_id: str, **amounts: float) -> Call:
    task = common_pb2.TaskInfo(
        task_id=task_id, command="sleep 30", resources=common_pb2.Resources(scalars=amounts)
    )
    return Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=[task]))


def kinds(events: list[Any], kind: str) -> list[Any]:
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


class Session:
    """One example: a master, its servicers, the streams open on them."""

    def __init__(self, data: st.DataObject, config_acls: Path, found: Figures) -> None:
        self.data = data
        self.found = found
        self.start(CoreHarness(replace(CONFIG, acls_file=config_acls)))

    def start(self, core: CoreHarness) -> None:
        """Serve `core`'s master, with no stream open yet."""
        self.core = core
        self.master = core.master
        self.streams = ServicerStreams(
            SchedulerService(self.master), AgentGatewayService(self.master)
        )
        self.frameworks: dict[int, str] = {}  # id(stream) -> framework id, once subscribed
        self.agents: dict[int, str] = {}
        self.logs: list[MutableMapping[str, Any]] = []

    # Playing ------------------------------------------------------------------------

    async def play(self) -> None:
        try:
            await self._play()
        finally:
            await self.streams.aclose()

    async def _play(self) -> None:
        with capture_logs() as self.logs:
            await self.set_up()
            assert self.logs, "the log capture must see the master's loggers"
            steps = self.data.draw(st.integers(1, MAX_STEPS), label="steps")
            for _ in range(steps):
                kind = self.data.draw(
                    st.sampled_from([k for k, weight in STEPS for _ in range(weight)]),
                    label="step",
                )
                await self.step(kind)
            await self.hang_up_all()
            await self.probe()
        self.found.examples += 1

    async def set_up(self) -> None:
        """Two agents and two frameworks, each with a running task, and offers out."""
        agents = [self.open_agent(register({"cpus": 4.0, "mem": 4096.0})) for _ in range(2)]
        fws = [self.open_framework(subscribe(f"fw{i}")) for i in range(2)]
        await self.settled()
        self.master.allocate()
        await self.settled()
        for i, fw in enumerate(fws):
            batches = kinds(fw.events, "offers")
            if not batches:
                continue
            offer = batches[-1].offers[0]
            fw.send(launch(offer, f"t{i}", cpus=1.0, mem=128.0))
            await self.settled()
            agent = next(a for a in agents if self.agents[id(a)] == offer.agent_id)
            agent.send(running(f"t{i}", self.frameworks[id(fw)], f"u{i}"))
        self.master.allocate()
        await self.settled()

    async def step(self, kind: str) -> None:
        draw = self.data.draw
        known = ws.Known.of(self.master)
        fws, agents = self.open_frameworks(), self.open_agents()
        if kind == "framework call" and fws:
            fw = fws[draw(st.integers(0, len(fws) - 1), label="framework")]
            call = draw(ws.framework_calls(known, self.frameworks[id(fw)]), label="call")
            await self.framework_call(fw, call)
        elif kind == "agent call" and agents:
            agent = agents[draw(st.integers(0, len(agents) - 1), label="agent")]
            agent_call = draw(ws.agent_calls(known, self.agents[id(agent)]), label="call")
            await self.send(agent, agent_call)
        elif kind == "subscribe":
            await self.new_stream(self.open_framework, draw(ws.subscribes(known), label="first"))
        elif kind == "register":
            await self.new_stream(self.open_agent, draw(ws.registers(known), label="first"))
        elif kind == "allocate":
            self.master.allocate()
            await self.settled()
        elif kind == "time":
            seconds = draw(st.sampled_from((0.5, 5.0, 11.0, 31.0, 61.0, 4e7)), label="seconds")
            self.core.advance(seconds)
            self.master.check_agent_health()
            await self.settled()
        elif kind == "hang up" and self.streams.open():
            everyone = self.streams.open()
            stream = everyone[draw(st.integers(0, len(everyone) - 1), label="stream")]
            if draw(st.booleans(), label="cancel"):
                stream.cancel()
            else:
                stream.close()
            await self.settled()
        elif kind == "restart":
            # Every connection drops; a new master starts on the same registry.
            await self.streams.aclose()
            await self.settled()
            self.start(self.core.restart())

    async def framework_call(self, fw: FrameworkStream, call: Call) -> None:
        before, errors = self.core.state(), len(kinds(fw.events, "error"))
        await self.send(fw, call)
        if len(kinds(fw.events, "error")) > errors:
            self.found.refused += 1
            assert self.core.state() == before, f"a rejected call changed the master: {call}"

    async def send(self, stream: FrameworkStream | AgentStream, message: Any) -> None:
        # What the wire would deliver: the message after a round trip through bytes.
        stream.send(type(message).FromString(message.SerializeToString()))
        self.found.inputs += 1
        await self.settled()

    async def new_stream(self, open_stream: Any, first: Any) -> None:
        before = self.core.state()
        stream = open_stream(type(first).FromString(first.SerializeToString()))
        self.found.inputs += 1
        await self.settled()
        if stream.ended:
            self.found.refused += 1
            assert stream.code in REFUSALS, (stream.code, stream.details)
            assert stream.events == [], stream.events
            assert self.core.state() == before, f"a refused stream changed the master: {first}"
        else:
            kind = stream.events[0].WhichOneof("event")
            assert kind in ("subscribed", "registered"), stream.events

    # Streams ----------------------------------------------------------------------------

    def open_framework(self, first: Call) -> FrameworkStream:
        return self.streams.framework(first)

    def open_agent(self, first: AgentCall) -> AgentStream:
        return self.streams.agent(first)

    def open_frameworks(self) -> list[FrameworkStream]:
        return [s for s in self.streams.open() if id(s) in self.frameworks]

    def open_agents(self) -> list[AgentStream]:
        return [s for s in self.streams.open() if id(s) in self.agents]

    async def settled(self) -> None:
        """Let the master handle everything sent; then check it is sound."""
        await self.streams.settle()
        for stream in self.streams.streams:
            if stream.events and id(stream) not in self.frameworks | self.agents:
                first = stream.events[0]
                if first.WhichOneof("event") == "subscribed":
                    self.frameworks[id(stream)] = first.subscribed.framework_id
                elif first.WhichOneof("event") == "registered":
                    self.agents[id(stream)] = first.registered.agent_id
        assert self.streams.crashes() == [], self.streams.crashes()[0]
        assert error_logs(self.logs) == [], error_logs(self.logs)
        assert self.master.invariant_violations == [], self.master.invariant_violations
        assert kept_problems(self.master) == [], kept_problems(self.master)

    # The end ---------------------------------------------------------------------------

    async def hang_up_all(self) -> None:
        """Every client goes; every stream must end and the master keep none open."""
        for i, stream in enumerate(self.streams.open()):
            if i % 2:
                stream.cancel()
            else:
                stream.close()
        await self.settled()
        assert self.streams.open() == []
        connected = [f.framework_id for f in self.master.frameworks.values() if f.connected]
        connected += [a.agent_id for a in self.master.agents.values() if a.connected]
        assert connected == [], f"streams left open on the master: {connected}"

    async def probe(self) -> None:
        """A new agent and a new framework: a task is launched and reported RUNNING."""
        agent = self.open_agent(register({"cpus": 1.0, "mem": 128.0}))
        fw = self.open_framework(subscribe("probe"))
        await self.settled()
        assert id(agent) in self.agents and id(fw) in self.frameworks, (agent.code, fw.code)
        self.master.allocate()
        await self.settled()
        [offer] = [o for batch in kinds(fw.events, "offers") for o in batch.offers]
        assert offer.agent_id == self.agents[id(agent)]
        fw.send(launch(offer, "probe", cpus=1.0, mem=128.0))
        await self.settled()
        [launched] = kinds(agent.events, "launch_task")
        assert launched.task.task_id == "probe"
        agent.send(running("probe", self.frameworks[id(fw)], "probe-1"))
        await self.settled()
        [update] = kinds(fw.events, "update")
        assert update.status.state == common_pb2.TASK_RUNNING
        await self.hang_up_all()


@pytest.fixture(scope="module")
def acls_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "acls.json"
    path.write_text(json.dumps(ACLS))
    return path


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop:
        yield loop


def test_the_servicers_survive_fuzzed_streams(acls_file: Path, runner: asyncio.Runner) -> None:
    with figures("in-process servicers") as found:

        @fuzz_settings(CI_EXAMPLES)
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            runner.run(Session(data, acls_file, found).play())

        fuzz()
