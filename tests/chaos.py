"""Fault injection: a real cluster with a steady task stream, killed and restarted at random.

One run (`run_chaos(work_dir, seed)`): a master and three agents as separate
processes, two frameworks (SDK, in this process):

- `alpha`, failover timeout 120 s with an id file: keeps a few short tasks
  running; when it crashes it comes back as itself;
- `beta`, failover timeout 0 (the SDK's default): keeps short and long
  (`sleep 300`) tasks running; when it crashes it is gone for good (that is
  what a failover timeout of 0 means) and a new generation (`beta-g2`, ...)
  with a new id takes its place. Only the master can end a gone
  generation's long tasks.

A seeded schedule then, a few times, SIGKILLs the master (and sometimes, while
it is down, an agent or a framework too), an agent (restarted on the same work
dir, sometimes only after the master has given up on it) or a framework, and
brings each back. Then the frameworks stop launching and kill what is left,
everything is let to settle, and the run is judged:

- no task silently lost: every task a live framework launched reached a
  terminal state it saw;
- each task's story is consistent: no update shown twice (by update id), and
  once a task has ended nothing but that same end is heard of it again;
- no resources leaked or counted twice: the master ends with no tasks, only
  the live frameworks, nothing used, and exactly the three agents' resources;
- no orphans: no task process is alive at the end on any agent, in
  particular none of a gone framework;
- the master's invariants held after every step (`--check-invariants`);
- no live framework's `run()` ended by itself (only the harness ends them).

Used by `tests/test_fault_injection.py` (a few seeds in CI) and
`scripts/fault_injection.py` (many seeds, printing figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from mesolite.agent import _exit_log
from mesolite.agent._checkpoint import load_agent_id
from mesolite.agent._procs import is_alive
from mesolite.agent._task_log import read_checkpoints
from mesolite.framework_sdk import (
    ConnectionConfig,
    Framework,
    Offer,
    Resources,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from tests.cluster import AgentProcess, MasterProcess, spawn_agent_process

AGENT_RESOURCES = "cpus:2;mem:1024;disk:0"
AGENTS = 3
TASK = Resources(cpus=0.5, mem=64)
AGENT_TIMEOUT = 5.0
HEARTBEAT_INTERVAL = 1.0  # given to the master (its default is 15 s)
# Longer than an agent's longest reconnect backoff (10 s, agent/config.py):
# an agent that retries only every 10 s needs more than 10 s to come back. With 5 s,
# the first 50 runs lost tasks of agents that were up but between two retries.
REREGISTER_TIMEOUT = 12.0


@dataclass
class Ledger:
    """What a framework's durable store would hold; it outlives framework restarts."""

    launched: dict[str, str] = field(default_factory=dict)  # task id -> agent id
    shown: list[TaskStatus] = field(default_factory=list)
    terminal: dict[str, TaskState] = field(default_factory=dict)

    def unresolved(self) -> list[str]:
        return [t for t in self.launched if t not in self.terminal]


class SteadyFramework(Framework):
    """Keeps `want` tasks running; launches one task per offer.

    A `long_every`-th task is `sleep 300`: it ends only when killed.
    """

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        rng: random.Random,
        id_file: Path | None,
        failover_timeout: float,
        long_every: int = 0,
    ) -> None:
        super().__init__(
            name,
            failover_timeout=failover_timeout,
            id_file=id_file,
            connection=ConnectionConfig(reconnect_initial=0.1, reconnect_max=1.0),
        )
        self.ledger = ledger
        self.rng = rng
        self.want = 2
        self.long_every = long_every
        self.problems: list[str] = []

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        # Launches may have been lost with a dying master: ask about each one.
        if self.ledger.unresolved():
            await self.reconcile(self.ledger.unresolved())

    async def on_offers(self, offers: list[Offer]) -> None:
        for offer in offers:
            running = len(self.ledger.unresolved())
            if running < self.want and offer.resources.contains(TASK):
                n = len(self.ledger.launched)
                task_id = f"{self.name}-{n:04d}"
                seconds = self.rng.uniform(0.2, 1.5)
                if self.long_every and n % self.long_every == 0:
                    seconds = 300
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
    silently_lost: int = 0  # launched by a live framework, no end it saw
    # TASK_LOST because the master removed an agent that was never down for long:
    # the workload paid for a master restart (or a master bug).
    lost_with_agent_up: int = 0
    duplicate_updates: int = 0
    leaked: int = 0  # resources, tasks or frameworks the master still holds at the end
    orphans: int = 0  # task processes alive at the end
    orphans_of_gone: int = 0  # ... of those, of a framework that is gone
    invariant_violations: int = 0
    violations: list[str] = field(default_factory=list)
    # Highly available masters (tests/chaos_ha.py): seconds from each leader's kill or
    # stop to another master serving; leader changes while an etcd member was down.
    takeovers: list[float] = field(default_factory=list)
    etcd_member_leader_changes: int = 0

    def line(self) -> str:
        faults = ", ".join(f"{n} {k}" for k, n in sorted(self.faults.items())) or "none"
        ended = ", ".join(f"{n} {k}" for k, n in sorted(self.ended.items()))
        return (
            f"seed {self.seed}: faults {faults}; {self.tasks} tasks ({ended}); "
            f"{len(self.violations)} violations"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "seed": self.seed,
                "faults": dict(self.faults),
                "tasks": self.tasks,
                "ended": dict(self.ended),
                "silently_lost": self.silently_lost,
                "lost_with_agent_up": self.lost_with_agent_up,
                "duplicate_updates": self.duplicate_updates,
                "leaked": self.leaked,
                "orphans": self.orphans,
                "orphans_of_gone": self.orphans_of_gone,
                "invariant_violations": self.invariant_violations,
                "violations": self.violations,
                "takeovers": self.takeovers,
                "etcd_member_leader_changes": self.etcd_member_leader_changes,
            },
            sort_keys=True,
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
            "--agent-heartbeat-interval",
            str(HEARTBEAT_INTERVAL),
            "--agent-reregister-timeout",
            str(REREGISTER_TIMEOUT),
            "--allocation-interval",
            "0.2",
            "--offer-timeout",
            "5",
        )
        self.agents: list[AgentProcess | None] = [None] * AGENTS
        self.retired: list[AgentProcess] = []
        # Live frameworks by kind ("alpha", "beta"); every generation's ledger by name.
        self.frameworks: dict[str, SteadyFramework] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}
        self.ledgers: dict[str, Ledger] = {}
        self.generations = Counter[str]()
        self.gone: list[SteadyFramework] = []  # crashed for good (failover timeout 0)
        # Per agent: (its id, when it was killed), to measure how long each was silent.
        self.kills: list[tuple[int, str, float]] = []

    # Components ------------------------------------------------------------

    async def start_agent(self, i: int) -> None:
        self.agents[i] = await spawn_agent_process(
            self.master.address, self.work_dir / f"agent{i}", AGENT_RESOURCES, f"agent{i}"
        )

    async def kill_agent(self, i: int) -> None:
        agent = self.agents[i]
        assert agent is not None
        self.kills.append((i, load_agent_id(self.work_dir / f"agent{i}") or "", time.time()))
        agent.kill()
        await agent.process.wait()
        self.retired.append(agent)
        self.agents[i] = None

    def start_framework(self, kind: str) -> None:
        """`alpha` comes back as itself; `beta` starts a new generation (a new id)."""
        if kind == "alpha":
            name, failover, long_every = "alpha", 120.0, 0
        else:
            self.generations[kind] += 1
            name, failover, long_every = f"beta-g{self.generations[kind]}", 0.0, 3
        ledger = self.ledgers.setdefault(name, Ledger())
        fw = SteadyFramework(
            name,
            ledger,
            random.Random(self.rng.random()),
            # A framework that never fails over keeps no id (the SDK refuses one with
            # failover timeout 0: the id could never be used).
            self.work_dir / f"{name}.id" if failover else None,
            failover_timeout=failover,
            long_every=long_every,
        )
        if kind in self.frameworks and kind == "alpha":
            fw.problems = self.frameworks[kind].problems
        self.frameworks[kind] = fw
        self.runs[kind] = asyncio.create_task(fw.run(self.master.address))

    async def crash_framework(self, kind: str) -> None:
        """Like the process dying: no stop(), no teardown, the stream just goes."""
        run = self.runs.pop(kind)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await run
        if kind == "beta":
            self.gone.append(self.frameworks[kind])

    # The run ---------------------------------------------------------------

    async def run(self, faults: int) -> Report:
        try:
            await self.master.start()
            for i in range(AGENTS):
                await self.start_agent(i)
            for kind in ("alpha", "beta"):
                self.start_framework(kind)
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
        kind = self.rng.choice(["master", "master", "agent", "agent", "framework"])
        if kind == "master":
            await self.master.kill()
            self.report.faults["master"] += 1
            # Sometimes more goes wrong while the master is down.
            also = self.rng.choice(["nothing", "nothing", "agent", "framework"])
            restart_agent: int | None = None
            if also == "agent":
                self.report.faults["agent while master down"] += 1
                restart_agent = self.rng.randrange(AGENTS)
                await self.kill_agent(restart_agent)
            elif also == "framework":
                await self.framework_fault(while_master_down=True)
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            await self.master.start()
            if restart_agent is not None:
                await asyncio.sleep(self.rng.choice([0.0, 1.0]))
                await self.start_agent(restart_agent)
        else:
            await self.inject_other(kind)

    async def inject_other(self, kind: str) -> None:
        """An agent's or a framework's fault (`kind`: "agent" or "framework")."""
        if kind == "agent":
            self.report.faults["agent"] += 1
            i = self.rng.randrange(AGENTS)
            await self.kill_agent(i)
            # Sometimes back quickly, sometimes after the master gave up on it.
            down = self.rng.choice([0.2, 1.0, AGENT_TIMEOUT + 2.0])
            await asyncio.sleep(down)
            await self.start_agent(i)
        else:
            await self.framework_fault(while_master_down=False)

    async def framework_fault(self, while_master_down: bool) -> None:
        kind = self.rng.choice(["alpha", "beta"])
        what = "framework restart" if kind == "alpha" else "framework gone"
        self.report.faults[what + (" while master down" if while_master_down else "")] += 1
        await self.crash_framework(kind)
        if not while_master_down:
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        self.start_framework(kind)

    async def settle(self, timeout: float = 60.0) -> None:
        """Stop launching, kill what is left and wait until every launched task has ended
        and every live framework is subscribed.

        The last fault may have just started a framework or restarted the master: a new
        beta generation has no id until it subscribes, and the judge needs each live
        framework's id (seed 200: judged at once, with nothing left running, the new
        generation was taken for a gone framework still listed).
        """
        for fw in self.frameworks.values():
            fw.want = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def unsettled(kind: str, fw: SteadyFramework) -> bool:
            subscribing = not fw.connected and not self.runs[kind].done()
            return subscribing or bool(fw.ledger.unresolved())

        while any(unsettled(kind, fw) for kind, fw in self.frameworks.items()):
            if loop.time() > deadline:
                break
            for fw in self.frameworks.values():
                if fw.connected and fw.ledger.unresolved():
                    with contextlib.suppress(Exception):
                        for task_id in fw.ledger.unresolved():
                            await fw.kill(task_id)
                        await fw.reconcile(fw.ledger.unresolved())
            await asyncio.sleep(1.0)

    async def judge(self, http: aiohttp.ClientSession) -> None:
        report = self.report
        live = {fw.name for fw in self.frameworks.values()}
        # A live framework's run() ends only when this harness crashes it: one that
        # ended by itself left its tasks unheard of, and says why (seed 178: an SDK
        # that took a master crash for a rejection never re-subscribed).
        for kind, run in self.runs.items():
            if run.done():
                why = "cancelled" if run.cancelled() else repr(run.exception())
                report.violations.append(f"{self.frameworks[kind].name}: run() ended: {why}")
        for name, ledger in self.ledgers.items():
            report.tasks += len(ledger.launched)
            report.ended.update(state.value for state in ledger.terminal.values())
            if name in live:
                for task_id in ledger.unresolved():
                    report.silently_lost += 1
                    report.violations.append(f"{name}: task {task_id} never reached an end it saw")
            long_outages = self.long_outages()
            # An id the master gave out that no agent process ever logged as its own:
            # the process died (SIGKILL) between being registered and hearing so, so
            # no process will ever come back under it, and its tasks are rightly lost.
            known = self.registered_ids()
            for status in ledger.shown:
                removed = "was removed" in status.message or "did not re-register" in status.message
                if (
                    status.state is TaskState.LOST
                    and removed
                    and status.agent_id not in long_outages
                    and status.agent_id in known
                ):
                    report.lost_with_agent_up += 1
                    report.violations.append(
                        f"{name}: task {status.task_id} lost though agent {status.agent_id} "
                        f"was never down for long: {status.message}"
                    )
            ids = Counter(s.update_id for s in ledger.shown if s.update_id)
            for update_id, n in ids.items():
                if n > 1:
                    report.duplicate_updates += 1
                    report.violations.append(f"{name}: update {update_id} shown {n} times")
        for fw in [*self.frameworks.values(), *self.gone]:
            report.violations.extend(fw.problems)

        async def quiet() -> dict[str, Any]:
            return await self.master.state(http)

        live_ids = {fw.framework_id for fw in self.frameworks.values() if fw.framework_id}
        for fw in self.frameworks.values():
            if fw.framework_id is None:
                report.violations.append(f"{fw.name}: never subscribed")
        state = await quiet()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        # Agents restarted late may still be joining; offers may be outstanding;
        # a gone framework may wait out its grace.
        while (
            len(state["agents"]) != AGENTS
            or state["tasks"]
            or {f["id"] for f in state["frameworks"]} - live_ids
        ) and loop.time() < deadline:
            await asyncio.sleep(0.2)
            state = await quiet()
        leaks: list[str] = []
        if state["tasks"]:
            leaks.append(f"master still lists tasks: {state['tasks']}")
        for f in state["frameworks"]:
            if f["used"]:
                leaks.append(f"framework {f['name']} still uses {f['used']}")
            if f["id"] not in live_ids:
                leaks.append(f"gone framework {f['name']} ({f['id']}) still listed")
        if len(state["agents"]) != AGENTS or state["cluster"]["total"] != {
            "cpus": 2.0 * AGENTS,
            "mem": 1024.0 * AGENTS,
        }:
            leaks.append(f"cluster should hold {AGENTS} agents' resources once: {state['cluster']}")
        report.leaked = len(leaks)
        report.violations.extend(leaks)
        await self.judge_orphans()
        invariants = self.master.violations()
        report.invariant_violations = len(invariants)
        report.violations.extend(invariants)

    def long_outages(self) -> set[str]:
        """Agent ids silent long enough that the master may have removed them.

        Silence runs from the kill to the next `registered` in the agent's log
        (the restarted process can take seconds to start on a loaded machine);
        the master removes an agent whose last heartbeat (up to one interval
        before the kill) is older than the agent timeout.
        """
        long = set()
        for i, agent_id, killed in self.kills:
            log = self.work_dir / f"agent{i}" / "agent.log"
            back = [t for t, _ in _registrations(log) if t > killed]
            silence = (min(back) if back else float("inf")) - killed
            if silence + HEARTBEAT_INTERVAL >= AGENT_TIMEOUT:
                long.add(agent_id)
        return long

    def registered_ids(self) -> set[str]:
        """Every agent id some agent process logged `registered` under."""
        return {
            agent_id
            for i in range(AGENTS)
            for _, agent_id in _registrations(self.work_dir / f"agent{i}" / "agent.log")
        }

    async def judge_orphans(self) -> None:
        """Every task process has ended; a gone framework's are counted apart."""
        gone_ids = {fw.framework_id for fw in self.gone if fw.framework_id}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # kills in flight get their grace period
        while True:
            alive = sorted(
                {
                    key
                    for i in range(AGENTS)
                    for key, pid, started in _task_processes(self.work_dir / f"agent{i}")
                    if is_alive(pid, started)
                }
            )
            if not alive or loop.time() > deadline:
                break
            await asyncio.sleep(0.2)
        self.report.orphans = len(alive)
        self.report.orphans_of_gone = sum(1 for fw_id, _ in alive if fw_id in gone_ids)
        for fw_id, task_id in alive:
            whose = "a gone framework" if fw_id in gone_ids else "framework"
            self.report.violations.append(f"orphan: task {task_id} of {whose} {fw_id} still runs")

    async def cleanup(self) -> None:
        for kind in list(self.runs):
            await self.crash_framework(kind)
        for agent in [*self.agents, *self.retired]:
            if agent is not None:
                await agent.cleanup()
        await self.master.stop()


_REGISTERED = re.compile(r"^(\S+Z) \[\w+\s*\] registered\s.*\bagent_id=(\S+)")


def _registrations(log: Path) -> list[tuple[float, str]]:
    """(when, agent id) of each `registered` the agent logged (console format, wall clock)."""
    found = []
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if match := _REGISTERED.match(line):
                stamp = datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))
                found.append((stamp.timestamp(), match.group(2)))
    return found


def _task_processes(work_dir: Path) -> list[tuple[tuple[str, str], int, int]]:
    """((framework id, task id), pid, start time) of every task process an agent on
    `work_dir` ever recorded: in its task checkpoints, in its supervisor's exit log
    (every command it spawned, even one whose checkpoint a compaction dropped) and
    in the wrappers' `wrapper.json`."""
    found = []

    def add(key: tuple[str, str], record: Any) -> None:
        pid, started = record.get("pid"), record.get("pid_start_time", record.get("start_time"))
        if isinstance(pid, int) and isinstance(started, int):
            found.append((key, pid, started))

    with contextlib.suppress(OSError, ValueError):
        for key, record in read_checkpoints(work_dir).items():
            add(key, record)
    for name in (_exit_log.PREVIOUS_NAME, _exit_log.EXITS_NAME):
        with contextlib.suppress(OSError):
            for line in (work_dir / "supervisor" / name).read_bytes().splitlines():
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    record = json.loads(line)
                    if record.get("op") == "spawned":
                        records = Path(record["records"])
                        add((records.parent.name, records.name), record)
    for wrapper in work_dir.glob("meta/*/*/wrapper.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            add((wrapper.parent.parent.name, wrapper.parent.name), json.loads(wrapper.read_text()))
    return found


async def run_chaos(work_dir: Path, seed: int, faults: int = 6) -> Report:
    return await Chaos(work_dir, seed).run(faults)
