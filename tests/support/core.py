"""Drive the master's core directly: no network, no event loop, virtual time.

    core = CoreHarness()
    fw = core.subscribe("batch")
    agent = core.add_agent("cpus:4;mem:4096")
    [offer] = core.allocate_for(fw)
    core.launch(fw, offer, "t1", "cpus:1;mem:128")
    core.update(agent, fw, "t1", TaskState.RUNNING)

Every step runs with the invariant checker on (`MasterConfig.check_invariants`);
`CoreHarness.assert_sound()` fails on any violation so far.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from mesolite.master import messages as msg
from mesolite.master.master import Master, MasterConfig
from mesolite.master.registry import Registry
from mesolite.model import FrameworkInfo, Offer, RunningTask, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from tests.support.fakes import FakeTimers, RecordingPeer

CONFIG = MasterConfig(
    allocation_interval=1.0,
    offer_timeout=30.0,
    agent_heartbeat_interval=1.0,
    agent_timeout=10.0,
    agent_reregister_timeout=60.0,
    check_invariants=True,
)
WALL_CLOCK_OFFSET = 1.7e9


@dataclass
class FrameworkPeer:
    framework_id: str
    peer: RecordingPeer[msg.FrameworkMessage]
    info: FrameworkInfo


@dataclass
class AgentPeer:
    agent_id: str
    peer: RecordingPeer[msg.AgentMessage]
    total: Resources


class CoreHarness:
    def __init__(
        self, config: MasterConfig = CONFIG, registry: Registry | None = None, start: float = 1000.0
    ) -> None:
        self.config = config
        self.registry = registry or Registry(None)
        self.timers = FakeTimers(start)
        self.master = Master(
            config,
            timers=self.timers,
            clock=self.timers,
            wall_clock=lambda: WALL_CLOCK_OFFSET + self.timers.now,
            registry=self.registry,
        )
        self._update_ids = itertools.count(1)

    def restart(self) -> CoreHarness:
        """A new master on the same registry, as after SIGKILL; the old one never runs again."""
        self.assert_sound()
        return CoreHarness(self.config, self.registry, self.timers.now)

    def advance(self, seconds: float) -> None:
        self.timers.advance(seconds)

    def assert_sound(self) -> None:
        assert self.master.invariant_violations == [], self.master.invariant_violations

    def state(self) -> tuple[object, ...]:
        """What a refused call must leave unchanged."""
        m = self.master
        return (
            sorted(m.offers),
            {
                f: (fw.principal, fw.info, sorted(fw.tasks), fw.connected)
                for f, fw in m.frameworks.items()
            },
            {a: (ag.principal, sorted(ag.tasks), ag.connected) for a, ag in m.agents.items()},
            {
                (t.framework_id, t.spec.task_id): (t.agent_id, t.state)
                for fw in m.frameworks.values()
                for t in fw.tasks.values()
            },
            {a: str(m.allocator.agent_allocated(a)) for a in m.agents},
            sorted((t.framework_id, t.task.task_id, t.agent_id) for t in self.registry.tasks()),
            self.registry.frameworks(),
            self.registry.agents(),
        )

    # Frameworks ------------------------------------------------------------

    def subscribe(
        self,
        name: str = "fw",
        role: str = "*",
        failover: float = 0.0,
        framework_id: str = "",
        principal: str | None = None,
        user: str = "",
    ) -> FrameworkPeer:
        peer: RecordingPeer[msg.FrameworkMessage] = RecordingPeer()
        info = FrameworkInfo(name, role, failover, framework_id, user)
        fid = self.master.subscribe(info, peer, principal=principal)
        [subscribed] = peer.take(msg.Subscribed)
        assert subscribed.framework_id == fid
        return FrameworkPeer(fid, peer, dataclasses.replace(info, framework_id=fid))

    def resubscribe(self, fw: FrameworkPeer, principal: str | None = None) -> FrameworkPeer:
        info = fw.info
        return self.subscribe(
            info.name, info.role, info.failover_timeout, fw.framework_id, principal, info.user
        )

    def allocate_for(self, fw: FrameworkPeer) -> list[Offer]:
        """Run an allocation cycle; the offers `fw` received (from any cycle so far)."""
        self.master.allocate()
        return [o for batch in fw.peer.take(msg.Offers) for o in batch.offers]

    def launch(
        self, fw: FrameworkPeer, offer: Offer, task_id: str, resources: str, command: str = "true"
    ) -> TaskSpec:
        spec = TaskSpec(task_id, command, Resources.parse(resources))
        self.master.accept(fw.framework_id, [offer.offer_id], [spec], refuse_seconds=0)
        return spec

    def updates(self, fw: FrameworkPeer) -> list[TaskStatus]:
        return [u.status for u in fw.peer.take(msg.Update)]

    # Agents ----------------------------------------------------------------

    def add_agent(
        self,
        resources: str = "cpus:4;mem:4096",
        agent_id: str = "",
        running: tuple[RunningTask, ...] = (),
        hostname: str = "host",
        principal: str | None = None,
    ) -> AgentPeer:
        peer: RecordingPeer[msg.AgentMessage] = RecordingPeer()
        total = Resources.parse(resources)
        aid = self.master.register_agent(
            agent_id, hostname, "127.0.0.1:1", total, {}, running, peer, principal=principal
        )
        assert isinstance(peer.messages[0], msg.AgentRegistered), "Registered comes first"
        peer.messages.pop(0)
        return AgentPeer(aid, peer, total)

    def update(
        self,
        agent: AgentPeer,
        fw: FrameworkPeer,
        task_id: str,
        state: TaskState,
        update_id: str = "",
        exit_code: int | None = None,
    ) -> TaskStatus:
        status = TaskStatus(
            task_id,
            fw.framework_id,
            agent.agent_id,
            state,
            exit_code=exit_code,
            update_id=update_id or f"u{next(self._update_ids)}",
        )
        self.master.status_update(agent.agent_id, status)
        return status

    def heartbeat(self, agent: AgentPeer) -> None:
        self.master.agent_heartbeat(agent.agent_id)

    def running(self, fw: FrameworkPeer, task: TaskSpec) -> RunningTask:
        """How an agent reports `task` when it registers again."""
        return RunningTask(fw.framework_id, task, TaskState.RUNNING)
