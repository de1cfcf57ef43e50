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
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesolite.master.authn import Authenticator
from mesolite.master.master import Master
from mesolite.master.servicers import AgentGatewayService, SchedulerService
from mesolite.v1 import scheduler_pb2
from tests.support.core import CONFIG, CoreHarness
from tests.support.fuzz_session import FuzzSession, outstanding
from tests.support.fuzzing import (
    AUTHENTICATED_ACLS,
    Figures,
    figures,
    fuzz_settings,
    fuzz_timeout,
    write_acls,
)
from tests.support.servicer_streams import ServicerStreams

# In-process, but tens of seconds: `make test-fast` leaves it out (tests/conftest.py).
pytestmark = [pytest.mark.unit, pytest.mark.slow, fuzz_timeout(300)]

# About 3,000 inputs: 22 s on a quiet 2-core machine (halved to keep CI within 15 minutes).
CI_EXAMPLES = 500


class InProcessSession(FuzzSession):
    """The servicers of a core in virtual time; the steps may also run an allocation
    cycle, let time pass, or restart the master."""

    STEPS = (*FuzzSession.STEPS, ("allocate", 2), ("time", 1), ("restart", 1))
    EXACT: ClassVar[bool] = True
    AUTHENTICATED: ClassVar[bool] = True

    def __init__(self, data: st.DataObject, found: Figures, core: CoreHarness) -> None:
        super().__init__(data, found)
        self.start(core)

    def start(self, core: CoreHarness) -> None:
        """Serve `core`'s master, with no stream open yet."""
        self.core = core
        authn = Authenticator(enabled=True)  # principals from the fake certificates
        self._streams = ServicerStreams(
            SchedulerService(core.master, authn), AgentGatewayService(core.master, authn)
        )
        self.frameworks.clear()
        self.agents.clear()

    @property
    def master(self) -> Master:
        return self.core.master

    @property
    def streams(self) -> ServicerStreams:
        return self._streams

    def state(self) -> object:
        return self.core.state()

    async def offers(self, fw: Any) -> list[scheduler_pb2.Offer]:
        self.master.allocate()
        await self.settled()
        return outstanding(self.master, fw.events)

    async def until(self, stream: Any, found: Callable[[Any], bool]) -> Any:
        await self.settled()
        answers = [e for e in stream.events if found(e)]
        assert answers, f"no such answer among {stream.events}"
        return answers[0]

    async def other_step(self, kind: str) -> None:
        if kind == "allocate":
            self.master.allocate()
            await self.settled()
        elif kind == "time":
            seconds = self.data.draw(st.sampled_from((0.5, 5.0, 11.0, 31.0, 61.0, 4e7)))
            self.core.advance(seconds)
            self.master.check_agent_health()
            await self.settled()
        elif kind == "restart":
            # Every connection drops; a new master starts on the same registry, and
            # some agents and frameworks come back (or try to) at once.
            await self.streams.aclose()
            await self.settled()
            self.start(self.core.restart())
            for _ in range(self.data.draw(st.integers(0, 3), label="coming back")):
                await self.step("register")
                await self.step("subscribe")

    def other_checks(self) -> None:
        assert self.streams.crashes() == [], self.streams.crashes()[0]


@pytest.fixture(scope="module")
def acls_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_acls(tmp_path_factory.mktemp("fuzz"), AUTHENTICATED_ACLS)


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop:
        yield loop


def test_the_servicers_survive_fuzzed_streams(acls_file: Path, runner: asyncio.Runner) -> None:
    config = replace(CONFIG, acls_file=acls_file)
    with figures("in-process servicers") as found:

        @fuzz_settings(CI_EXAMPLES)
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            runner.run(InProcessSession(data, found, CoreHarness(config)).play())

        fuzz()
