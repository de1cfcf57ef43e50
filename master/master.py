"""The master's core: agents, frameworks, tasks and offers, and what happens to them.

The gRPC servicers call the methods here with domain values (already converted
and validated for shape at the wire); each method validates the request
against the current state, raises `CallRejected` *before* changing anything if
it is wrong, and otherwise applies it and queues messages on the peers'
outboxes. Every method is synchronous, so each call is atomic on the event loop.

Which framework gets which resources is the allocator's decision (`Allocator`,
pure); this module only tells it what happened and turns its decisions into
offers.

Recovery rules (a master restart must never cost the workload)
---------------------------------------------------------------
Let W be `agent_reregister_timeout`, counted from the master's start.

1. Recovered frameworks get a grace: a framework the registry lists is
   removed only if it has not re-subscribed within W + its failover timeout
   of the master's start. A failover timeout measures time away from a
   *running* master; the grace is never shorter than W, whatever the
   failover timeout (0 included). Mesos starts no failover timer at all for
   frameworks recovered after a failover; mesolite bounds the wait instead.
2. Agents the registry lists have W to re-register; after that they are
   removed and the tasks the registry placed on them reported TASK_LOST
   (queued for frameworks that are away). Agents that return in time keep
   their tasks; tasks the registry placed there that the agent no longer
   reports are TASK_LOST.
3. The agent protocol has one order: `Registered` is the first message on
   every agent stream; kills for the tasks it reported come after it.
4. No orphans. A task an agent reports whose framework is gone (torn down
   before the restart, removed during it, or never known to this registry)
   is adopted under a *removing* framework: its resources stay allocated
   (so they are not offered while the process runs), it is killed after
   `Registered`, and its resources return when the agent reports the end.
   Torn-down frameworks stay in the registry, marked removing, until their
   last task has ended, so a restart in between still kills those tasks.
5. Teardown while an agent is disconnected (partitioned): the kill cannot be
   sent; it is sent again when that agent re-registers. If the agent is
   removed first, its tasks are LOST and the agent, refused on return,
   kills them itself.
6. Agent back before its frameworks: tasks are adopted under the recovered
   (disconnected) framework; their updates wait in the agent until the
   framework re-subscribes and acknowledges. Framework back before the
   agent: its tasks on the agent are unknown until the agent returns;
   explicit reconciliation of them gets no answer yet (as in Mesos).
7. Two restarts in a row: nothing is decided at a restart that a later
   restart could contradict; every grace and window starts again from the
   newest start, and the registry is written before anything is
   acknowledged, so the second master sees what the first acknowledged.
8. A registry from an older master is migrated in place; one from a newer
   master is refused (`master/registry.py`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from master import invariants
from master import messages as msg
from master.allocator import Allocator, RoleSettings
from master.fair_share import ShareInput, compute_fair_shares
from master.metrics import MasterMetrics
from master.outbox import Outbox
from master.policies import make_policy
from master.registry import FrameworkEntry, Registry, TaskEntry
from master.roles import RolesConfig, RolesConfigError, is_valid_role, load_roles
from mesolite.model import (
    DEFAULT_REFUSE_SECONDS,
    DEFAULT_ROLE,
    FrameworkInfo,
    Offer,
    RunningTask,
    StatusSource,
    TaskSpec,
    TaskState,
    TaskStatus,
)
from mesolite.resources import EMPTY, Resources

log = structlog.get_logger(__name__)

_ID = re.compile(r"^[A-Za-z0-9_.\-:]{1,200}$")


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _checked(method: _Method) -> _Method:
    """After the method returns, verify the invariants if the master is in test mode."""

    @functools.wraps(method)
    def wrapper(self: Master, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if self.config.check_invariants:
            self.verify(method.__name__)
        return result

    return wrapper  # type: ignore[return-value]


class CallRejected(Exception):
    """A request that is invalid in the current state; nothing was changed."""


class RegistrationRefused(Exception):
    """A subscription or agent registration that is refused; the stream ends."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # a grpc.StatusCode name: NOT_FOUND, INVALID_ARGUMENT, ...


@dataclass(frozen=True, slots=True)
class MasterConfig:
    allocation_interval: float = 1.0
    offer_timeout: float = 30.0
    agent_heartbeat_interval: float = 1.0
    agent_timeout: float = 10.0
    framework_heartbeat_interval: float = 5.0
    # After a restart, agents the registry lists have this long to come back
    # before they are marked removed and their tasks reported lost.
    agent_reregister_timeout: float = 60.0
    completed_tasks_kept: int = 1000
    weights: dict[str, float] = field(default_factory=dict)
    # Check the bookkeeping after every step (tests): see master/invariants.py.
    check_invariants: bool = False
    roles_file: Path | None = None
    work_dir: Path | None = None  # holds the registry; None keeps it in memory (tests)
    policy: str = "drf"
    seed: int = 0


@dataclass(slots=True)
class Task:
    spec: TaskSpec
    framework_id: str
    agent_id: str
    state: TaskState = TaskState.STAGING
    status: TaskStatus | None = None
    applied_updates: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Agent:
    agent_id: str
    hostname: str
    address: str
    total: Resources
    attributes: dict[str, str]
    outbox: Outbox[msg.AgentMessage] | None
    last_seen: float
    registered_at: float
    tasks: dict[tuple[str, str], Task] = field(default_factory=dict)  # (framework, task)

    @property
    def connected(self) -> bool:
        return self.outbox is not None


@dataclass(slots=True)
class Framework:
    framework_id: str
    info: FrameworkInfo
    outbox: Outbox[msg.FrameworkMessage] | None
    registered_at: float
    tasks: dict[str, Task] = field(default_factory=dict)
    completed: deque[Task] = field(default_factory=deque)
    offers: set[str] = field(default_factory=set)
    suppressed: bool = False
    disconnected_at: float | None = None
    failover_timer: asyncio.TimerHandle | None = None
    # Updates the master made (say, TASK_LOST) while the framework was away,
    # sent when it subscribes again.
    undelivered: list[TaskStatus] = field(default_factory=list)
    # Torn down, waiting for its tasks to end; unknown to everyone else.
    removing: bool = False

    @property
    def connected(self) -> bool:
        return self.outbox is not None


@dataclass(slots=True)
class OutstandingOffer:
    offer: Offer
    expiry_timer: asyncio.TimerHandle | None


class Master:
    def __init__(
        self,
        config: MasterConfig,
        clock: Callable[[], float] = time.monotonic,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.master_id = uuid.uuid4().hex[:12]
        self._clock = clock
        self._loop = loop or asyncio.get_running_loop()
        self.allocator = Allocator(clock, seed=config.seed, policy=make_policy(config.policy))
        # Raises RolesConfigError for a bad file: a master must not start half-configured.
        self.roles_config = (
            load_roles(config.roles_file) if config.roles_file else RolesConfig.default()
        )
        self._steady_shares: dict[str, Resources] | None = None
        self._apply_roles()
        self.agents: dict[str, Agent] = {}
        self.removed_agents: set[str] = set()
        self.frameworks: dict[str, Framework] = {}
        self.offers: dict[str, OutstandingOffer] = {}
        self.allocation_wanted = asyncio.Event()
        self.allocation_cycles = 0
        self.metrics = MasterMetrics(self)
        self.invariant_violations: list[str] = []
        # Agents the registry lists that have not re-registered since the restart.
        self.recovering_agents: dict[str, list[TaskEntry]] = {}
        self._recovery_timer: asyncio.TimerHandle | None = None
        self.started_at = time.time()
        self._ids = itertools.count(1)
        work_dir = config.work_dir
        self.registry = Registry(work_dir / "registry.sqlite" if work_dir else None)
        self._recover()

    def _new_id(self, kind: str) -> str:
        return f"{self.master_id}-{kind}{next(self._ids):04d}"

    def request_allocation(self) -> None:
        self.allocation_wanted.set()

    def verify(self, step: str) -> list[str]:
        """Check the invariants now; violations are logged and kept."""
        problems = invariants.check(self)
        if problems:
            self.invariant_violations.extend(f"after {step}: {p}" for p in problems)
            log.error("invariant violated", step=step, problems=problems)
        return problems

    # Recovery --------------------------------------------------------------

    def _recover(self) -> None:
        """Rebuild from the registry after a restart (rules 1, 2, 4 and 7 above).

        Offers and allocations are not restored: they follow from what agents
        report.
        """
        now = self._clock()
        window = self.config.agent_reregister_timeout
        for agent in self.registry.agents():
            if agent.removed:
                self.removed_agents.add(agent.agent_id)
            else:
                self.recovering_agents[agent.agent_id] = []
        for task in self.registry.tasks():
            self.recovering_agents.setdefault(task.agent_id, []).append(task)
        if self.recovering_agents:
            self._recovery_timer = self._loop.call_later(window, self._recovery_expired)
        for entry in self.registry.frameworks():
            info = FrameworkInfo(entry.name, entry.role, entry.failover_timeout, entry.framework_id)
            framework = Framework(
                entry.framework_id,
                info,
                outbox=None,
                registered_at=entry.registered_at,
                disconnected_at=now,
                removing=entry.removing,
            )
            self.frameworks[entry.framework_id] = framework
            self.allocator.add_framework(entry.framework_id, entry.role, connected=False)
            if not entry.removing:
                self._start_failover_timer(framework, window + entry.failover_timeout)
        if self.frameworks or self.recovering_agents:
            log.info(
                "recovered from the registry",
                frameworks=len(self.frameworks),
                removing_frameworks=sum(f.removing for f in self.frameworks.values()),
                agents=len(self.recovering_agents),
                removed_agents=len(self.removed_agents),
                grace=window,
            )
        # A removing framework with no task left to wait for is done.
        for framework in list(self.frameworks.values()):
            if framework.removing and not self._tasks_expected(framework.framework_id):
                self._forget_if_done(framework)

    def _tasks_expected(self, framework_id: str) -> bool:
        """Whether an agent still re-registering was given a task of this framework."""
        return any(
            entry.framework_id == framework_id
            for entries in self.recovering_agents.values()
            for entry in entries
        )

    @_checked
    def _recovery_expired(self) -> None:
        """Agents that did not come back are removed; their tasks are lost."""
        for agent_id, tasks in list(self.recovering_agents.items()):
            del self.recovering_agents[agent_id]
            self.registry.remove_agent(agent_id, time.time())
            self.removed_agents.add(agent_id)
            for entry in tasks:
                self._notify(
                    entry.framework_id,
                    _master_status(
                        entry.task.task_id,
                        entry.framework_id,
                        agent_id,
                        TaskState.LOST,
                        f"agent {agent_id} did not re-register after the master restarted",
                    ),
                )
            log.warning("agent did not re-register; removed", agent_id=agent_id, tasks=len(tasks))
        for framework in list(self.frameworks.values()):
            self._forget_if_done(framework)

    def _notify(self, framework_id: str, status: TaskStatus) -> None:
        """Send a master-made update now, or when the framework is back."""
        framework = self.frameworks.get(framework_id)
        if framework is None:
            return
        if framework.outbox is not None:
            framework.outbox.send(msg.Update(status))
        else:
            framework.undelivered.append(status)

    # Roles -----------------------------------------------------------------

    def _apply_roles(self) -> None:
        """Give the allocator the roles' absolute settings for the current cluster total.

        Percentages depend on the total, so this runs again whenever it changes.
        `--weights` (Mesos' flag) sets the weight of roles the file does not name.
        """
        settings = {
            role: RoleSettings(weight=weight) for role, weight in self.config.weights.items()
        }
        for path, (guarantee, limit) in self.roles_config.resolve(self.allocator.total).items():
            settings[path] = RoleSettings(self.roles_config.spec(path).weight, guarantee, limit)
        self.allocator.configure_roles(settings)
        self._steady_shares = None

    @_checked
    def reload_roles(self) -> bool:
        """Read the roles file again (on SIGHUP); an invalid file changes nothing."""
        if self.config.roles_file is None:
            log.info("no roles file to reload")
            return False
        try:
            config = load_roles(self.config.roles_file)
        except (RolesConfigError, OSError) as e:
            log.error("roles file rejected; the previous configuration stays", reason=str(e))
            return False
        self.roles_config = config
        self._apply_roles()
        log.info("roles reloaded", file=str(self.config.roles_file), roles=len(config.roles))
        self.request_allocation()
        return True

    def _share_inputs(self) -> dict[str, ShareInput]:
        tree = self.allocator.roles
        return {
            path: ShareInput(
                tree.role_weight(path), tree.role_guarantee(path), tree.role_limit(path)
            )
            for path in tree.role_paths()
        }

    def fair_shares(self) -> tuple[dict[str, Resources], dict[str, Resources]]:
        """(steady, instantaneous) fair shares of every role.

        Steady shares are cached until the configuration, the roles in use or
        the cluster total change; instantaneous ones follow activity, so they
        are computed when asked for (reading /state), not on every offer.
        """
        inputs = self._share_inputs()
        total = self.allocator.total
        if self._steady_shares is None or self._steady_shares.keys() != inputs.keys():
            self._steady_shares = compute_fair_shares(inputs, total)
        active = self.allocator.roles.active_roles()
        return self._steady_shares, compute_fair_shares(inputs, total, active)

    def _cluster_changed(self) -> None:
        self._apply_roles()

    # Frameworks ------------------------------------------------------------

    @_checked
    def subscribe(self, info: FrameworkInfo, outbox: Outbox[msg.FrameworkMessage]) -> str:
        role = info.role or DEFAULT_ROLE
        if not info.name:
            raise RegistrationRefused("INVALID_ARGUMENT", "framework name must not be empty")
        if not is_valid_role(role):
            raise RegistrationRefused("INVALID_ARGUMENT", f"invalid role {role!r}")
        if not (0 <= info.failover_timeout < float("inf")):
            raise RegistrationRefused(
                "INVALID_ARGUMENT",
                f"failover timeout must be a finite number >= 0, got {info.failover_timeout}",
            )
        info = FrameworkInfo(info.name, role, info.failover_timeout, info.framework_id)
        if info.framework_id:
            return self._resubscribe(info, outbox)
        framework_id = self._new_id("F")
        framework = Framework(framework_id, info, outbox, registered_at=time.time())
        self.registry.add_framework(
            FrameworkEntry(
                framework_id, info.name, role, info.failover_timeout, framework.registered_at
            )
        )
        self.frameworks[framework_id] = framework
        if self.allocator.add_framework(framework_id, role):
            log.info("role created on first use", role=role, weight=1.0)
        log.info("framework subscribed", framework_id=framework_id, name=info.name, role=role)
        outbox.send(msg.Subscribed(framework_id, self.config.framework_heartbeat_interval))
        self.request_allocation()
        return framework_id

    def _resubscribe(self, info: FrameworkInfo, outbox: Outbox[msg.FrameworkMessage]) -> str:
        framework = self.frameworks.get(info.framework_id)
        if framework is None or framework.removing:
            raise RegistrationRefused(
                "NOT_FOUND", f"framework {info.framework_id} is not known to this master"
            )
        if framework.info.role != info.role:
            raise RegistrationRefused(
                "INVALID_ARGUMENT",
                f"framework {info.framework_id} has role {framework.info.role!r}; "
                f"changing it to {info.role!r} is not supported",
            )
        if framework.outbox is not None:
            framework.outbox.close("another scheduler subscribed with this framework id")
            self._rescind_offers(framework)
        if framework.failover_timer is not None:
            framework.failover_timer.cancel()
            framework.failover_timer = None
        if framework.info != info:
            self.registry.add_framework(
                FrameworkEntry(
                    framework.framework_id,
                    info.name,
                    info.role,
                    info.failover_timeout,
                    framework.registered_at,
                )
            )
        framework.info = info
        framework.outbox = outbox
        framework.disconnected_at = None
        framework.suppressed = False
        self.allocator.revive(framework.framework_id)
        self.allocator.connect_framework(framework.framework_id)
        log.info("framework re-subscribed", framework_id=framework.framework_id, name=info.name)
        outbox.send(
            msg.Subscribed(framework.framework_id, self.config.framework_heartbeat_interval)
        )
        for status in framework.undelivered:
            outbox.send(msg.Update(status))
        framework.undelivered.clear()
        self.request_allocation()
        return framework.framework_id

    @_checked
    def disconnect_framework(self, framework_id: str, outbox: Outbox[Any]) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is None or framework.outbox is not outbox:
            return  # already replaced or torn down
        framework.outbox = None
        framework.disconnected_at = self._clock()
        self._rescind_offers(framework)
        self.allocator.disconnect_framework(framework_id)
        timeout = framework.info.failover_timeout
        log.info("framework disconnected", framework_id=framework_id, failover_timeout=timeout)
        self._start_failover_timer(framework, timeout)

    def _start_failover_timer(self, framework: Framework, timeout: float) -> None:
        framework_id = framework.framework_id
        framework.failover_timer = self._loop.call_later(
            timeout, self._failover_expired, framework_id
        )

    @_checked
    def _failover_expired(self, framework_id: str) -> None:
        framework = self.frameworks.get(framework_id)
        if framework is not None and not framework.connected:
            log.info("framework failover timeout expired", framework_id=framework_id)
            self._remove_framework(framework)

    @_checked
    def teardown(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        log.info("framework teardown requested", framework_id=framework_id)
        self._remove_framework(framework)

    def _remove_framework(self, framework: Framework) -> None:
        """Tear a framework down: kill its tasks, then forget it once they have ended.

        Its tasks' resources stay allocated until the agents report the tasks
        ended (or the agents are removed): freed any earlier, they would be
        offered while the processes still run, and the agent would refuse the
        launches for lack of room.
        """
        framework_id = framework.framework_id
        self._rescind_offers(framework, notify=False)
        if framework.failover_timer is not None:
            framework.failover_timer.cancel()
            framework.failover_timer = None
        if framework.outbox is not None:
            framework.outbox.close("framework torn down")
            framework.outbox = None
        self.registry.mark_framework_removing(framework_id)
        framework.removing = True
        self.allocator.disconnect_framework(framework_id)
        for task in framework.tasks.values():
            agent = self.agents.get(task.agent_id)
            if agent is not None and agent.outbox is not None:
                agent.outbox.send(msg.KillTask(framework_id, task.spec.task_id))
            # Else the agent is away: the kill goes out when it re-registers (rule 5).
            log.info(
                "killing task of removed framework",
                framework_id=framework_id,
                task_id=task.spec.task_id,
                agent_id=task.agent_id,
                agent_connected=agent is not None and agent.outbox is not None,
            )
        log.info("framework torn down", framework_id=framework_id, tasks=len(framework.tasks))
        self._forget_if_done(framework)

    def _forget_if_done(self, framework: Framework) -> None:
        """Forget a removing framework once none of its tasks can still be running.

        Tasks on agents still re-registering after a restart may come back;
        until then the framework stays (removing), so their return kills them.
        """
        framework_id = framework.framework_id
        if framework.removing and not framework.tasks and not self._tasks_expected(framework_id):
            self.registry.remove_framework(framework_id)
            self.allocator.remove_framework(framework_id)
            del self.frameworks[framework_id]
            log.info("framework removed", framework_id=framework_id)
            self.request_allocation()

    # Framework calls -------------------------------------------------------

    @_checked
    def accept(
        self,
        framework_id: str,
        offer_ids: Sequence[str],
        tasks: Sequence[TaskSpec],
        refuse_seconds: float | None,
    ) -> None:
        framework = self._framework(framework_id)
        offers = self._own_offers(framework, offer_ids)
        agent_ids = {o.offer.agent_id for o in offers}
        if len(agent_ids) != 1:
            raise CallRejected(f"offers {list(offer_ids)} span several agents {sorted(agent_ids)}")
        agent_id = agent_ids.pop()
        agent = self.agents[agent_id]
        offered = sum((o.offer.resources for o in offers), EMPTY)
        refuse = _refuse_seconds(refuse_seconds)
        wanted = self._validate_tasks(framework, agent_id, tasks)
        if not offered.contains(wanted):
            raise CallRejected(
                f"tasks need {wanted} but offers {list(offer_ids)} hold only {offered}"
            )
        if agent.outbox is None:
            raise CallRejected(f"agent {agent_id} is disconnected")

        placed = [_with_agent(spec, agent_id) for spec in tasks]
        # Recorded before any launch goes out: after a restart, a task the
        # registry knows but no agent reports is reported lost, never forgotten.
        self.registry.add_tasks(framework_id, agent_id, placed)
        for o in offers:
            self._drop_offer(o)
        self.metrics.offers_accepted(len(offers))
        for spec in placed:
            task = Task(spec, framework_id, agent_id)
            framework.tasks[spec.task_id] = task
            agent.tasks[(framework_id, spec.task_id)] = task
            agent.outbox.send(msg.LaunchTask(framework_id, spec))
            log.info(
                "launching task",
                framework_id=framework_id,
                agent_id=agent_id,
                task_id=spec.task_id,
                resources=str(spec.resources),
            )
        self.allocator.recover(framework_id, agent_id, offered - wanted, refuse)
        log.info(
            "offers accepted",
            framework_id=framework_id,
            agent_id=agent_id,
            offer_ids=list(offer_ids),
            tasks=len(tasks),
            unused=str(offered - wanted),
        )
        self.request_allocation()

    def _validate_tasks(
        self, framework: Framework, agent_id: str, tasks: Sequence[TaskSpec]
    ) -> Resources:
        seen: set[str] = set()
        wanted = EMPTY
        for spec in tasks:
            if not _ID.match(spec.task_id):
                raise CallRejected(f"invalid task id {spec.task_id!r}")
            if spec.task_id in seen:
                raise CallRejected(f"task id {spec.task_id} appears twice in the call")
            if spec.task_id in framework.tasks:
                raise CallRejected(f"task id {spec.task_id} is already in use")
            if spec.agent_id and spec.agent_id != agent_id:
                raise CallRejected(
                    f"task {spec.task_id} names agent {spec.agent_id} "
                    f"but the offers are for agent {agent_id}"
                )
            if not spec.command.strip():
                raise CallRejected(f"task {spec.task_id} has no command")
            if spec.resources.is_empty():
                raise CallRejected(f"task {spec.task_id} asks for no resources")
            seen.add(spec.task_id)
            wanted = wanted + spec.resources
        return wanted

    @_checked
    def decline(
        self, framework_id: str, offer_ids: Sequence[str], refuse_seconds: float | None
    ) -> None:
        framework = self._framework(framework_id)
        offers = self._own_offers(framework, offer_ids)
        refuse = _refuse_seconds(refuse_seconds)
        for o in offers:
            self._drop_offer(o)
            self.allocator.recover(framework_id, o.offer.agent_id, o.offer.resources, refuse)
        self.metrics.offers_declined(len(offers))
        log.info(
            "offers declined",
            framework_id=framework_id,
            offer_ids=list(offer_ids),
            refuse_seconds=refuse,
        )
        self.request_allocation()

    def kill(self, framework_id: str, task_id: str) -> None:
        framework = self._framework(framework_id)
        task = framework.tasks.get(task_id)
        if task is None:
            raise CallRejected(f"task {task_id} is not a running task of this framework")
        agent = self.agents[task.agent_id]
        if agent.outbox is None:
            raise CallRejected(f"agent {task.agent_id} of task {task_id} is disconnected")
        agent.outbox.send(msg.KillTask(framework_id, task_id))
        log.info(
            "kill requested", framework_id=framework_id, task_id=task_id, agent_id=task.agent_id
        )

    def acknowledge(self, framework_id: str, agent_id: str, task_id: str, update_id: str) -> None:
        self._framework(framework_id)
        if not update_id:
            raise CallRejected("acknowledge needs the update id")
        agent = self.agents.get(agent_id)
        if agent is None:
            raise CallRejected(f"agent {agent_id} is not known")
        if agent.outbox is not None:
            agent.outbox.send(msg.AcknowledgeUpdate(framework_id, task_id, update_id))
        log.debug(
            "update acknowledged",
            framework_id=framework_id,
            agent_id=agent_id,
            task_id=task_id,
            update_id=update_id,
        )

    def reconcile(self, framework_id: str, task_ids: Sequence[str]) -> None:
        """Answer with the latest known state of each task, as Mesos does.

        Explicit (task ids given): a task the master has never heard of is
        TASK_LOST; a task on an agent that has not yet re-registered after a
        master restart gets no answer yet (as in Mesos): the framework asks
        again later. Implicit (no ids): every running task of the framework.
        """
        framework = self._framework(framework_id)
        assert framework.outbox is not None
        if not task_ids:
            for task in framework.tasks.values():
                framework.outbox.send(msg.Update(self._latest_status(task)))
            log.info("reconciled", framework_id=framework_id, tasks=len(framework.tasks))
            return
        completed = {t.spec.task_id: t for t in framework.completed}
        pending = {
            entry.task.task_id
            for entries in self.recovering_agents.values()
            for entry in entries
            if entry.framework_id == framework_id
        }
        for task_id in task_ids:
            known = framework.tasks.get(task_id) or completed.get(task_id)
            if known is not None:
                framework.outbox.send(msg.Update(self._latest_status(known)))
            elif task_id not in pending:
                unknown = _master_status(
                    task_id, framework_id, "", TaskState.LOST, "reconciliation: task is unknown"
                )
                framework.outbox.send(msg.Update(unknown))
        log.info("reconciled", framework_id=framework_id, task_ids=list(task_ids))

    @_checked
    def revive(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        framework.suppressed = False
        self.allocator.revive(framework_id)
        log.info("offers revived", framework_id=framework_id)
        self.request_allocation()

    @_checked
    def suppress(self, framework_id: str) -> None:
        framework = self._framework(framework_id)
        framework.suppressed = True
        self.allocator.suppress(framework_id)
        log.info("offers suppressed", framework_id=framework_id)

    def _framework(self, framework_id: str) -> Framework:
        framework = self.frameworks.get(framework_id)
        if framework is None or framework.removing:
            raise CallRejected(f"framework {framework_id} is not known")
        return framework

    def _own_offers(self, framework: Framework, offer_ids: Sequence[str]) -> list[OutstandingOffer]:
        if not offer_ids:
            raise CallRejected("no offer ids given")
        if len(set(offer_ids)) != len(offer_ids):
            raise CallRejected(f"offer ids repeat: {list(offer_ids)}")
        found = []
        for offer_id in offer_ids:
            o = self.offers.get(offer_id)
            if o is None or o.offer.framework_id != framework.framework_id:
                raise CallRejected(
                    f"offer {offer_id} is not outstanding for this framework "
                    "(unknown, rescinded or already used)"
                )
            found.append(o)
        return found

    @staticmethod
    def _latest_status(task: Task) -> TaskStatus:
        last = task.status
        return TaskStatus(
            task.spec.task_id,
            task.framework_id,
            task.agent_id,
            task.state,
            message="reconciliation",
            exit_code=last.exit_code if last else None,
            timestamp=time.time(),
            source=StatusSource.MASTER,
        )

    # Offers ----------------------------------------------------------------

    @_checked
    def allocate(self) -> int:
        """Run one allocation cycle and send the resulting offers; returns their count."""
        decisions = self.allocator.allocate()
        self.allocation_cycles += 1
        by_framework: dict[str, list[Offer]] = {}
        for d in decisions:
            agent = self.agents[d.agent_id]
            offer = Offer(
                self._new_id("O"),
                d.framework_id,
                d.agent_id,
                agent.hostname,
                d.resources,
                dict(agent.attributes),
            )
            timer = None
            if self.config.offer_timeout > 0:
                timer = self._loop.call_later(
                    self.config.offer_timeout, self._offer_expired, offer.offer_id
                )
            self.offers[offer.offer_id] = OutstandingOffer(offer, timer)
            self.frameworks[d.framework_id].offers.add(offer.offer_id)
            by_framework.setdefault(d.framework_id, []).append(offer)
            log.info(
                "offer made",
                offer_id=offer.offer_id,
                framework_id=d.framework_id,
                agent_id=d.agent_id,
                resources=str(d.resources),
            )
        for framework_id, offers in by_framework.items():
            outbox = self.frameworks[framework_id].outbox
            assert outbox is not None, "the allocator offers only to connected frameworks"
            outbox.send(msg.Offers(offers))
        self.metrics.offers_made(len(decisions))
        return len(decisions)

    @_checked
    def _offer_expired(self, offer_id: str) -> None:
        o = self.offers.get(offer_id)
        if o is not None:
            log.info("offer timed out", offer_id=offer_id, framework_id=o.offer.framework_id)
            self.metrics.offers_rescinded("timeout")
            self._rescind(o)
            self.request_allocation()

    def _drop_offer(self, o: OutstandingOffer) -> None:
        del self.offers[o.offer.offer_id]
        framework = self.frameworks.get(o.offer.framework_id)
        if framework is not None:
            framework.offers.discard(o.offer.offer_id)
        if o.expiry_timer is not None:
            o.expiry_timer.cancel()

    def _rescind(self, o: OutstandingOffer, notify: bool = True) -> None:
        """Take an offer back; its resources return to the allocator unfiltered."""
        self._drop_offer(o)
        offer = o.offer
        self.allocator.recover(offer.framework_id, offer.agent_id, offer.resources)
        framework = self.frameworks.get(offer.framework_id)
        if notify and framework is not None and framework.outbox is not None:
            framework.outbox.send(msg.Rescind(offer.offer_id))
        log.info(
            "offer rescinded",
            offer_id=offer.offer_id,
            framework_id=offer.framework_id,
            agent_id=offer.agent_id,
        )

    def _rescind_offers(self, framework: Framework, notify: bool = True) -> None:
        for offer_id in list(framework.offers):
            self.metrics.offers_rescinded("framework_gone")
            self._rescind(self.offers[offer_id], notify)

    def _rescind_agent_offers(self, agent_id: str) -> None:
        for o in [o for o in self.offers.values() if o.offer.agent_id == agent_id]:
            self.metrics.offers_rescinded("agent_lost")
            self._rescind(o)

    # Agents ----------------------------------------------------------------

    @_checked
    def register_agent(
        self,
        agent_id: str,
        hostname: str,
        address: str,
        total: Resources,
        attributes: dict[str, str],
        running: Sequence[RunningTask],
        outbox: Outbox[msg.AgentMessage],
    ) -> str:
        if total.is_empty():
            raise RegistrationRefused("INVALID_ARGUMENT", "agent offers no resources")
        if agent_id in self.removed_agents:
            raise RegistrationRefused(
                "FAILED_PRECONDITION",
                f"agent {agent_id} was removed from the cluster; register as a new agent",
            )
        if agent_id and not _ID.match(agent_id):
            raise RegistrationRefused("INVALID_ARGUMENT", f"invalid agent id {agent_id!r}")
        used = sum((t.task.resources for t in running), EMPTY)
        if not total.contains(used):
            raise RegistrationRefused(
                "INVALID_ARGUMENT", f"running tasks use {used}, more than the agent's {total}"
            )
        now = self._clock()
        kills: list[msg.KillTask] = []  # sent after `Registered` (rule 3)
        if agent_id in self.agents:
            kills = self._reregister_known(self.agents[agent_id], address, running, outbox, now)
        elif agent_id in self.recovering_agents:
            self._add_agent(agent_id, hostname, address, total, attributes, outbox, now)
            kills = self._reregister_recovered(self.agents[agent_id], running)
        elif agent_id:
            raise RegistrationRefused(
                "FAILED_PRECONDITION",
                f"agent {agent_id} is not known to this master; register as a new agent",
            )
        elif running:
            raise RegistrationRefused("INVALID_ARGUMENT", "a new agent cannot have tasks")
        else:
            agent_id = self._new_id("S")
            self._add_agent(agent_id, hostname, address, total, attributes, outbox, now)
            log.info("agent registered", agent_id=agent_id, hostname=hostname, resources=str(total))
        outbox.send(msg.AgentRegistered(agent_id, self.config.agent_heartbeat_interval))
        for kill in kills:
            outbox.send(kill)
        self.request_allocation()
        return agent_id

    def _reregister_known(
        self,
        agent: Agent,
        address: str,
        running: Sequence[RunningTask],
        outbox: Outbox[msg.AgentMessage],
        now: float,
    ) -> list[msg.KillTask]:
        """An agent this master already has connects again; returns the kills it owes."""
        if agent.outbox is not None:
            agent.outbox.close("the agent connected again")
        agent.outbox = outbox
        agent.address = address
        agent.last_seen = now
        reported = {(rt.framework_id, rt.task.task_id) for rt in running}
        for key, task in list(agent.tasks.items()):
            if key not in reported:
                self._terminate(task, TaskState.LOST, "the agent does not know this task")
        for rt in running:
            if (rt.framework_id, rt.task.task_id) in agent.tasks:
                continue
            framework = self.frameworks.get(rt.framework_id)
            if framework is not None and self._completed_task(framework, rt.task.task_id):
                continue  # its end was applied; the agent still awaits the acknowledgement
            self._adopt_task(agent, rt)
        self.allocator.activate_agent(agent.agent_id)
        kills = self._kills_owed(agent)
        log.info(
            "agent re-registered", agent_id=agent.agent_id, tasks=len(running), kills=len(kills)
        )
        return kills

    def _kills_owed(self, agent: Agent) -> list[msg.KillTask]:
        """Kills for the agent's tasks whose framework is being removed (rules 4 and 5)."""
        kills = []
        for (framework_id, task_id), task in agent.tasks.items():
            framework = self.frameworks[task.framework_id]
            if framework.removing:
                kills.append(msg.KillTask(framework_id, task_id))
                log.info(
                    "killing task of removed framework",
                    framework_id=framework_id,
                    task_id=task_id,
                    agent_id=agent.agent_id,
                )
        return kills

    def _add_agent(
        self,
        agent_id: str,
        hostname: str,
        address: str,
        total: Resources,
        attributes: dict[str, str],
        outbox: Outbox[msg.AgentMessage],
        now: float,
    ) -> None:
        self.registry.admit_agent(agent_id, hostname, total, time.time())
        self.agents[agent_id] = Agent(
            agent_id,
            hostname,
            address,
            total,
            attributes,
            outbox,
            last_seen=now,
            registered_at=time.time(),
        )
        self.allocator.add_agent(agent_id, total)
        self._cluster_changed()

    def _reregister_recovered(
        self, agent: Agent, running: Sequence[RunningTask]
    ) -> list[msg.KillTask]:
        """An agent the registry knows comes back after a master restart (rule 2)."""
        expected = self.recovering_agents.pop(agent.agent_id)
        if not self.recovering_agents and self._recovery_timer is not None:
            self._recovery_timer.cancel()
        for rt in running:
            self._adopt_task(agent, rt)
        reported = {(rt.framework_id, rt.task.task_id) for rt in running}
        lost = [e for e in expected if (e.framework_id, e.task.task_id) not in reported]
        for entry in lost:
            self.registry.remove_task(entry.framework_id, entry.task.task_id)
            self._notify(
                entry.framework_id,
                _master_status(
                    entry.task.task_id,
                    entry.framework_id,
                    agent.agent_id,
                    TaskState.LOST,
                    "the agent no longer runs this task",
                ),
            )
        kills = self._kills_owed(agent)
        log.info(
            "agent re-registered after master restart",
            agent_id=agent.agent_id,
            tasks=len(running),
            lost=len(lost),
            kills=len(kills),
        )
        # Removing frameworks waiting only for this agent's lost tasks are done.
        for entry in lost:
            framework = self.frameworks.get(entry.framework_id)
            if framework is not None:
                self._forget_if_done(framework)
        return kills

    def _adopt_task(self, agent: Agent, rt: RunningTask) -> None:
        """Take in a task an agent reports that this master does not know yet.

        A task of a framework this master does not know (rule 4) is adopted
        under a stand-in removing framework, so its resources stay counted
        until the kill that follows `Registered` has ended it.
        """
        framework = self.frameworks.get(rt.framework_id)
        if framework is None:
            framework = self._stand_in(rt.framework_id)
            log.warning(
                "task of a framework this master does not know; it will be killed",
                agent_id=agent.agent_id,
                framework_id=rt.framework_id,
                task_id=rt.task.task_id,
            )
        spec = _with_agent(rt.task, agent.agent_id)
        # A task that ended while the master was away is reported with its end
        # state; to the master it runs until that (unacknowledged) update arrives.
        state = TaskState.RUNNING if rt.state.is_terminal else rt.state
        task = Task(spec, rt.framework_id, agent.agent_id, state)
        framework.tasks[spec.task_id] = task
        agent.tasks[(rt.framework_id, spec.task_id)] = task
        self.allocator.grant(rt.framework_id, agent.agent_id, spec.resources)
        self.registry.add_tasks(rt.framework_id, agent.agent_id, [spec])
        log.info(
            "task adopted from agent",
            agent_id=agent.agent_id,
            framework_id=rt.framework_id,
            task_id=spec.task_id,
            state=rt.state.value,
        )

    def _stand_in(self, framework_id: str) -> Framework:
        """A removing framework for tasks whose framework is gone, in the default role."""
        info = FrameworkInfo("(gone)", DEFAULT_ROLE, 0.0, framework_id)
        framework = Framework(
            framework_id, info, outbox=None, registered_at=time.time(), removing=True
        )
        self.registry.add_framework(
            FrameworkEntry(
                framework_id, info.name, DEFAULT_ROLE, 0.0, framework.registered_at, removing=True
            )
        )
        self.frameworks[framework_id] = framework
        self.allocator.add_framework(framework_id, DEFAULT_ROLE, connected=False)
        return framework

    def agent_heartbeat(self, agent_id: str) -> None:
        agent = self.agents.get(agent_id)
        if agent is not None:
            agent.last_seen = self._clock()

    @_checked
    def disconnect_agent(self, agent_id: str, outbox: Outbox[Any]) -> None:
        agent = self.agents.get(agent_id)
        if agent is None or agent.outbox is not outbox:
            return
        agent.outbox = None
        self.allocator.deactivate_agent(agent_id)
        self._rescind_agent_offers(agent_id)
        log.info("agent disconnected", agent_id=agent_id)

    @_checked
    def check_agent_health(self) -> list[str]:
        """Remove agents silent for longer than the agent timeout; returns their ids."""
        deadline = self._clock() - self.config.agent_timeout
        silent = [a for a in self.agents.values() if a.last_seen < deadline]
        for agent in silent:
            self.remove_agent(agent.agent_id, "the agent stopped sending heartbeats")
        return [a.agent_id for a in silent]

    @_checked
    def remove_agent(self, agent_id: str, reason: str) -> None:
        agent = self.agents[agent_id]
        self._rescind_agent_offers(agent_id)
        for task in list(agent.tasks.values()):
            self._terminate(task, TaskState.LOST, f"agent {agent_id} was removed: {reason}")
        self.allocator.remove_agent(agent_id)
        self._cluster_changed()
        del self.agents[agent_id]
        self.removed_agents.add(agent_id)
        self.registry.remove_agent(agent_id, time.time())
        if agent.outbox is not None:
            agent.outbox.close(reason)
        for framework in self.frameworks.values():
            if framework.outbox is not None:
                framework.outbox.send(msg.AgentFailure(agent_id))
        log.warning("agent removed", agent_id=agent_id, reason=reason)
        self.request_allocation()

    # Status updates --------------------------------------------------------

    @_checked
    def status_update(self, agent_id: str, status: TaskStatus) -> None:
        agent = self.agents.get(agent_id)
        if agent is None:
            return
        agent.last_seen = self._clock()
        framework = self.frameworks.get(status.framework_id)
        task = framework.tasks.get(status.task_id) if framework else None
        if framework is None or task is None:
            task = self._completed_task(framework, status.task_id) if framework else None
            if task is None or status.update_id not in task.applied_updates:
                # Nobody is left to acknowledge it: do so, so the agent stops retrying.
                if agent.outbox is not None and status.update_id:
                    agent.outbox.send(
                        msg.AcknowledgeUpdate(status.framework_id, status.task_id, status.update_id)
                    )
                log.info(
                    "update for an unknown task acknowledged by the master",
                    agent_id=agent_id,
                    framework_id=status.framework_id,
                    task_id=status.task_id,
                    state=status.state.value,
                )
                return
        elif status.update_id not in task.applied_updates:
            task.applied_updates.add(status.update_id)
            task.status = status
            log.info(
                "task status",
                framework_id=status.framework_id,
                agent_id=agent_id,
                task_id=status.task_id,
                state=status.state.value,
                exit_code=status.exit_code,
                update_id=status.update_id,
            )
            if status.state.is_terminal:
                self._finish(task, status.state)
            else:
                task.state = status.state
        if task.status is not status:  # applied before this call: the agent retried it
            self.metrics.update_retried()
        if framework is not None and framework.outbox is not None:
            framework.outbox.send(msg.Update(status))
            self.metrics.update_forwarded(status.state)
        elif (
            framework is not None
            and framework.removing
            and status.update_id
            and agent.outbox is not None
        ):  # torn down: nobody else will acknowledge it
            agent.outbox.send(
                msg.AcknowledgeUpdate(status.framework_id, status.task_id, status.update_id)
            )

    def _completed_task(self, framework: Framework, task_id: str) -> Task | None:
        return next((t for t in framework.completed if t.spec.task_id == task_id), None)

    def _terminate(self, task: Task, state: TaskState, reason: str) -> None:
        """End a task on the master's own authority and tell its framework."""
        status = _master_status(task.spec.task_id, task.framework_id, task.agent_id, state, reason)
        task.status = status
        log.info(
            "task status",
            framework_id=task.framework_id,
            agent_id=task.agent_id,
            task_id=task.spec.task_id,
            state=state.value,
            reason=reason,
        )
        self._finish(task, state)
        self._notify(task.framework_id, status)

    def _finish(self, task: Task, state: TaskState) -> None:
        """Move a task to its terminal state and give its resources back."""
        task.state = state
        self.registry.remove_task(task.framework_id, task.spec.task_id)
        framework = self.frameworks[task.framework_id]
        framework.tasks.pop(task.spec.task_id, None)
        framework.completed.append(task)
        while len(framework.completed) > self.config.completed_tasks_kept:
            framework.completed.popleft()
        agent = self.agents.get(task.agent_id)
        if agent is not None:
            agent.tasks.pop((task.framework_id, task.spec.task_id), None)
            self.allocator.recover(task.framework_id, task.agent_id, task.spec.resources)
        self.request_allocation()
        self._forget_if_done(framework)

    # Periodic --------------------------------------------------------------

    def send_framework_heartbeats(self) -> None:
        for framework in self.frameworks.values():
            if framework.outbox is not None:
                framework.outbox.send(msg.Heartbeat())

    def shutdown(self) -> None:
        """Cancel timers and close every stream (the master process is stopping)."""
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
        for o in self.offers.values():
            if o.expiry_timer is not None:
                o.expiry_timer.cancel()
        for framework in self.frameworks.values():
            if framework.failover_timer is not None:
                framework.failover_timer.cancel()
            if framework.outbox is not None:
                framework.outbox.close("master shutting down")
        for agent in self.agents.values():
            if agent.outbox is not None:
                agent.outbox.close("master shutting down")

    def tasks(self) -> Iterable[Task]:
        for framework in self.frameworks.values():
            yield from framework.tasks.values()


def _master_status(
    task_id: str, framework_id: str, agent_id: str, state: TaskState, message: str
) -> TaskStatus:
    """An update the master makes on its own authority: it needs no acknowledgement."""
    return TaskStatus(
        task_id,
        framework_id,
        agent_id,
        state,
        message,
        timestamp=time.time(),
        source=StatusSource.MASTER,
    )


def _refuse_seconds(value: float | None) -> float:
    if value is None:
        return DEFAULT_REFUSE_SECONDS
    if not (0 <= value < float("inf")):
        raise CallRejected(f"refuse_seconds must be a finite number >= 0, got {value}")
    return value


def _with_agent(spec: TaskSpec, agent_id: str) -> TaskSpec:
    if spec.agent_id == agent_id:
        return spec
    return TaskSpec(
        spec.task_id, spec.command, spec.resources, spec.name, agent_id, dict(spec.environment)
    )
