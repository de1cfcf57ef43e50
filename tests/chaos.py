"""Fault injection: a real cluster with a steady task stream, killed and restarted at random.

One run (`run_chaos(work_dir, seed)`): a master and three agents as separate
processes, two frameworks (SDK, in this process) each keeping a few short
tasks running. A seeded schedule then, a few times, SIGKILLs the master, an
agent (restarted on the same work dir, sometimes only after the master has
given up on it) or a framework (its run cancelled mid-flight, then a new
instance with the same id file), and brings it back. Then the frameworks stop
launching, everything is let to settle, and the run is judged:

- no task silently lost: every launched task reached a terminal state its
  framework saw (tasks are short, so all of them end);
- each task's story is consistent: no update shown twice (by update id), and
  once a task has ended nothing but that same end is heard of it again (a
  reconciliation answer and the agent's own update may both report it);
- no resources leaked or counted twice: the master ends with no tasks, no
  framework using anything, and exactly the three agents' resources;
- the master's invariants held after every step (`--check-invariants`).

Used by `tests/test_fault_injection.py` (a few seeds in CI) and
`scripts/fault_injection.py` (many seeds, printing figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from framework_sdk import Framework, Offer, Resources, TaskSpec, TaskState, TaskStatus
from tests.cluster import AgentProcess, MasterProcess, spawn_agent_process

AGENT_RESOURCES = "cpus:2;mem:1024;disk:0"
AGENTS = 3
TASK = Resources(cpus=0.5, mem=64)
AGENT_TIMEOUT = 3.0


@dataclass
class Ledger:
    """What a framework's durable store would hold; it outlives framework restarts."""

    launched: dict[str, str] = field(default_factory=dict)  # task id -> agent id
    shown: list[TaskStatus] = field(default_factory=list)
    terminal: dict[str, TaskState] = field(default_factory=dict)

    def unresolved(self) -> list[str]:
        return [t for t in self.launched if t not in self.terminal]


class SteadyFramework(Framework):
    """Keeps `want` short tasks running; launches one task per offer."""

    reconnect_initial = 0.1
    reconnect_max = 1.0

    def __init__(self, name: str, ledger: Ledger, rng: random.Random, id_file: Path) -> None:
        super().__init__(name, failover_timeout=120.0, id_file=id_file)
        self.ledger = ledger
        self.rng = rng
        self.want = 2
        self.problems: list[str] = []

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        # Launches may have been lost with a dying master: ask about each one.
        if self.ledger.unresolved():
            await self.reconcile(self.ledger.unresolved())

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            running = len(self.ledger.unresolved())
            if running < self.want and offer.resources.contains(TASK):
                task_id = f"{self.name}-{len(self.ledger.launched):04d}"
                seconds = self.rng.uniform(0.2, 1.5)
                self.ledger.launched[task_id] = offer.agent_id
                await self.launch(
                    offer, [TaskSpec(task_id, f"sleep {seconds:.2f}", TASK)], refuse_seconds=0
                )
            else:
                await self.decline(offer, refuse_seconds=1.0)

    async def on_update(self, status: TaskStatus) -> None:
        # No awaits here: a cancellation lands before or after, never in between.
        ledger = self.ledger
        if status.task_id not in ledger.launched:
            self.problems.append(f"update for a task never launched: {status.task_id}")
            return
        ended = ledger.terminal.get(status.task_id)
        if ended is not None and status.state is not ended:
            # The same end twice is fine (a reconciliation answer and the agent's
            # own update can both arrive); a different story is not.
            self.problems.append(f"{status.task_id}: {status.state.value} after {ended.value}")
        if status.state is TaskState.FAILED:
            # `sleep` does not fail: the real exit status was lost somewhere.
            self.problems.append(f"{status.task_id}: TASK_FAILED ({status.message})")
        ledger.shown.append(status)
        if status.state.is_terminal:
            ledger.terminal[status.task_id] = status.state


@dataclass
class Report:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    tasks: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        faults = ", ".join(f"{n} {k}" for k, n in sorted(self.faults.items())) or "none"
        ended = ", ".join(f"{n} {k}" for k, n in sorted(self.ended.items()))
        return (
            f"seed {self.seed}: faults {faults}; {self.tasks} tasks ({ended}); "
            f"{len(self.violations)} violations"
        )


class Chaos:
    def __init__(self, work_dir: Path, seed: int) -> None:
        self.work_dir = work_dir
        self.rng = random.Random(seed)
        self.report = Report(seed)
        self.master = MasterProcess(
            work_dir,
            "--agent-timeout",
            str(AGENT_TIMEOUT),
            "--agent-reregister-timeout",
            "5",
            "--allocation-interval",
            "0.2",
            "--offer-timeout",
            "5",
        )
        self.agents: list[AgentProcess | None] = [None] * AGENTS
        self.retired: list[AgentProcess] = []
        self.ledgers = {name: Ledger() for name in ("alpha", "beta")}
        self.frameworks: dict[str, SteadyFramework] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}

    # Components ------------------------------------------------------------

    async def start_agent(self, i: int) -> None:
        self.agents[i] = await spawn_agent_process(
            self.master.address, self.work_dir / f"agent{i}", AGENT_RESOURCES, f"agent{i}"
        )

    async def kill_agent(self, i: int) -> None:
        agent = self.agents[i]
        assert agent is not None
        agent.kill()
        await agent.process.wait()
        self.retired.append(agent)
        self.agents[i] = None

    def start_framework(self, name: str) -> None:
        fw = SteadyFramework(
            name, self.ledgers[name], random.Random(self.rng.random()), self.work_dir / f"{name}.id"
        )
        if name in self.frameworks:
            fw.want = self.frameworks[name].want
            fw.problems = self.frameworks[name].problems
        self.frameworks[name] = fw
        self.runs[name] = asyncio.create_task(fw.run(self.master.address))

    async def crash_framework(self, name: str) -> None:
        """Like the process dying: no stop(), no teardown, the stream just goes."""
        run = self.runs.pop(name)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await run

    # The run ---------------------------------------------------------------

    async def run(self, faults: int) -> Report:
        try:
            await self.master.start()
            for i in range(AGENTS):
                await self.start_agent(i)
            for name in self.ledgers:
                self.start_framework(name)
            for _ in range(faults):
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))  # let traffic flow
                await self.inject()
            await self.settle()
            async with aiohttp.ClientSession() as http:
                await self.judge(http)
        finally:
            await self.cleanup()
        return self.report

    async def inject(self) -> None:
        kind = self.rng.choice(["master", "agent", "agent", "framework"])
        self.report.faults[kind] += 1
        if kind == "master":
            await self.master.kill()
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            await self.master.start()
        elif kind == "agent":
            i = self.rng.randrange(AGENTS)
            await self.kill_agent(i)
            # Sometimes back quickly, sometimes after the master gave up on it.
            down = self.rng.choice([0.2, 1.0, AGENT_TIMEOUT + 2.0])
            await asyncio.sleep(down)
            await self.start_agent(i)
        else:
            name = self.rng.choice(list(self.ledgers))
            await self.crash_framework(name)
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            self.start_framework(name)

    async def settle(self, timeout: float = 60.0) -> None:
        """Stop launching and wait until every launched task has ended, reconciling."""
        for fw in self.frameworks.values():
            fw.want = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(ledger.unresolved() for ledger in self.ledgers.values()):
            if loop.time() > deadline:
                break
            for fw in self.frameworks.values():
                if fw.connected and fw.ledger.unresolved():
                    with contextlib.suppress(Exception):
                        await fw.reconcile(fw.ledger.unresolved())
            await asyncio.sleep(1.0)

    async def judge(self, http: aiohttp.ClientSession) -> None:
        report = self.report
        for name, ledger in self.ledgers.items():
            report.tasks += len(ledger.launched)
            report.ended.update(state.value for state in ledger.terminal.values())
            for task_id in ledger.unresolved():
                report.violations.append(f"{name}: task {task_id} never reached an end it saw")
            ids = Counter(s.update_id for s in ledger.shown if s.update_id)
            for update_id, n in ids.items():
                if n > 1:
                    report.violations.append(f"{name}: update {update_id} shown {n} times")
            report.violations.extend(self.frameworks[name].problems)

        async def quiet() -> dict[str, Any]:
            return await self.master.state(http)

        state = await quiet()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        # Agents restarted late may still be joining; offers may be outstanding.
        while (len(state["agents"]) != AGENTS or state["tasks"]) and loop.time() < deadline:
            await asyncio.sleep(0.2)
            state = await quiet()
        if state["tasks"]:
            report.violations.append(f"master still lists tasks: {state['tasks']}")
        for f in state["frameworks"]:
            if f["used"]:
                report.violations.append(f"framework {f['name']} still uses {f['used']}")
        if len(state["agents"]) != AGENTS or state["cluster"]["total"] != {
            "cpus": 2.0 * AGENTS,
            "mem": 1024.0 * AGENTS,
        }:
            report.violations.append(
                f"cluster should hold {AGENTS} agents' resources once: {state['cluster']}"
            )
        report.violations.extend(self.master.violations())

    async def cleanup(self) -> None:
        for name in list(self.runs):
            await self.crash_framework(name)
        for agent in [*self.agents, *self.retired]:
            if agent is not None:
                await agent.cleanup()
        await self.master.stop()


async def run_chaos(work_dir: Path, seed: int, faults: int = 6) -> Report:
    return await Chaos(work_dir, seed).run(faults)
