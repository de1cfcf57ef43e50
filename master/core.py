"""The master's core: its state, its effects, and what every concern shares.

The master is a plain state machine. `MasterCore` holds the state (records of
agents, frameworks, tasks and offers in `master/state.py`, the allocator, the
registry) and the effects it was given (`master/effects.py`: timers, clocks,
the registry, and each peer's outbox). The concerns that change the state are
mixins over it, one module each, read top to bottom:

    master/frameworks.py      subscribe, fail over, tear down; the history of ended ones
    master/operator.py        what operators do: tear a framework down, kill a task
    master/offers.py          allocate, accept, decline, rescind
    master/agents.py          register, re-register, health, removal
    master/status_updates.py  updates, kills, acknowledgements, reconciliation
    master/recovery.py        rebuilding after a restart (and its rules)
    master/role_settings.py   roles file, weights, fair shares

and `master/master.py` composes them into `Master`. Every public method is
synchronous, so each call is atomic on the event loop; it validates first
(`master/validation.py`), raising `CallRejected` or `RegistrationRefused`
before it changes anything, then applies the change and queues messages on
the peers' outboxes. What one concern asks of another is declared here as an
abstract method, so each module says what it needs.

Which framework gets which resources is the allocator's decision (pure,
`master/allocator.py`); the core tells it what happened and turns its
decisions into offers.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from mesolite.master import invariants
from mesolite.master import messages as msg
from mesolite.master.acl import AclError, Acls, Action, load_acls, may_run_tasks_as
from mesolite.master.activity import Activity
from mesolite.master.allocator import Allocator
from mesolite.master.config import MasterConfig
from mesolite.master.effects import Cancellable, Clock, RegistryStore, Timers
from mesolite.master.errors import CallRejected
from mesolite.master.fair_levels import InstantShares
from mesolite.master.fair_share import ShareInput
from mesolite.master.leadership import Leadership, SoleLeadership
from mesolite.master.metrics import MasterMetrics
from mesolite.master.policies import make_policy
from mesolite.master.registry import Registry, TaskEntry
from mesolite.master.role_config import RolesConfig, load_roles
from mesolite.master.state import AgentRecord, FrameworkRecord, OfferRecord, TaskRecord
from mesolite.model import StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources

log = structlog.get_logger("mesolite.master")

_Method = TypeVar("_Method", bound=Callable[..., Any])


def checked(method: _Method) -> _Method:
    """After the method returns, verify the invariants if the master is in test mode."""

    @functools.wraps(method)
    def wrapper(self: MasterCore, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if self.config.check_invariants:
            self.verify(method.__name__)
        return result

    return wrapper  # type: ignore[return-value]


class MasterCore(abc.ABC):
    def __init__(
        self,
        config: MasterConfig,
        *,
        timers: Timers,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        registry: RegistryStore | None = None,
        master_id: str | None = None,
    ) -> None:
        """`clock` is the monotonic clock `timers` count in; `wall_clock` stamps updates.

        Without `registry`, the SQLite registry in `config.work_dir` (in memory
        when that is None).
        """
        self.config = config
        self.master_id = master_id or uuid.uuid4().hex[:12]
        self._clock = clock
        self._wall_clock = wall_clock
        self._timers = timers
        self.allocator = Allocator(
            clock,
            seed=config.seed,
            policy=make_policy(config.policy),
            packing=config.packing,
            reservations=config.reservations,
        )
        # Raises RolesConfigError for a bad file: a master must not start half-configured.
        self.roles_config = (
            load_roles(config.roles_file) if config.roles_file else RolesConfig.default()
        )
        self._steady_shares: dict[str, Resources] | None = None
        # Raises AclError for a bad file, for the same reason. None: no authorization.
        self.acls: Acls | None = load_acls(config.acls_file) if config.acls_file else None
        self.agents: dict[str, AgentRecord] = {}
        # Agent ids, the one heard from longest ago first (see `_heard_from`).
        self._by_last_seen: OrderedDict[str, None] = OrderedDict()
        # Refused if they come back; the newest `max_removed_agents`, oldest first.
        self.removed_agents: dict[str, None] = {}
        self.frameworks: dict[str, FrameworkRecord] = {}
        # Frameworks that ended (removed once their last task ended), each with its
        # ended tasks: the newest `max_completed_frameworks`, oldest first. In memory
        # only, as in Mesos: a restarted master starts with none.
        self.completed_frameworks: dict[str, FrameworkRecord] = {}
        self.offers: dict[str, OfferRecord] = {}
        self.allocation_wanted = asyncio.Event()
        self.allocation_cycles = 0
        self.metrics = MasterMetrics()  # its state's gauges: read from a snapshot per scrape
        self.activity = Activity()  # counted, logged as one line a period (log_activity)
        self.invariant_violations: list[str] = []
        # Agents the registry lists that have not re-registered since the restart.
        self.recovering_agents: dict[str, list[TaskEntry]] = {}
        self.recovering_principals: dict[str, str | None] = {}  # who registered each
        # (framework id, task id) -> agent id, for the tasks of those agents.
        self.recovering_placements: dict[tuple[str, str], str] = {}
        self._recovery_timer: Cancellable | None = None
        self.started_at = wall_clock()
        self._ids = itertools.count(1)
        if registry is None:
            work_dir = config.work_dir
            registry = Registry(work_dir / "registry.sqlite" if work_dir else None)
        self.registry = registry
        # Whether this master leads (master/leadership.py): the process shell sets an HA
        # master's election here; every edge that acts asks it.
        self.leadership: Leadership = SoleLeadership()
        self._start()

    @abc.abstractmethod
    def _start(self) -> None:
        """Configure the roles and recover from the registry (`master/master.py`)."""

    def now(self) -> float:
        """The core's monotonic clock (what its timers count in)."""
        return self._clock()

    def wall_time(self) -> float:
        """The wall clock the core stamps updates with."""
        return self._wall_clock()

    def _new_id(self, kind: str) -> str:
        return f"{self.master_id}-{kind}{next(self._ids):04d}"

    def request_allocation(self) -> None:
        self.allocation_wanted.set()

    def log_reservations(self) -> None:
        """Log and count the reservations the allocator made and ended since the last call
        (it does no I/O itself): one line each, with the ids."""
        for event in self.allocator.take_reservation_events():
            r = event.reservation
            if event.outcome is None:
                log.info(
                    "agent reserved",
                    agent_id=r.agent_id,
                    framework_id=r.framework_id,
                    shape=r.shape,
                )
            else:
                log.info(
                    "reservation ended",
                    agent_id=r.agent_id,
                    framework_id=r.framework_id,
                    shape=r.shape,
                    outcome=event.outcome,
                    held_seconds=round(event.held, 3),
                )
            self.metrics.reservation(event.outcome or "made")

    def log_activity(self) -> None:
        """One info line with the offers, launches and updates since the last one (each
        is logged at debug); nothing if nothing happened."""
        if counts := self.activity.take():
            log.info("activity", **counts)

    def verify(self, step: str) -> list[str]:
        """Check the invariants now; violations are logged and kept."""
        problems = invariants.check(self)
        if problems:
            self.invariant_violations.extend(f"after {step}: {p}" for p in problems)
            log.error("invariant violated", step=step, problems=problems)
        return problems

    # Shared by every concern -------------------------------------------------

    def authorized(self, action: Action, principal: str | None, obj: str | None = None) -> bool:
        """Whether the ACLs let `principal` do `action` (on `obj`); all is allowed without."""
        allowed = self.acls is None or self.acls.allows(action, principal, obj)
        if not allowed:
            log.warning("not authorized", action=action.value, principal=principal, object=obj)
        return allowed

    def may_run_tasks_as(self, principal: str | None, user: str) -> bool:
        """Whether a framework of `principal` may run its tasks as `user` (the ACLs'
        `run_tasks`; "" for the agents' --task-user is always allowed, root only where
        an ACL entry names it, `master/acl.py`)."""
        allowed = may_run_tasks_as(self.acls, principal, user)
        if not allowed:
            log.warning(
                "not authorized", action=Action.RUN_TASKS.value, principal=principal, object=user
            )
        return allowed

    def _heard_from(self, agent: AgentRecord) -> None:
        """The agent is alive now. Its id moves to the end of `_by_last_seen`, which so
        stays in the order of `last_seen` (the clock only goes forward): the health
        check reads only the agents that are silent too long, and the first that is not."""
        agent.last_seen = self._clock()
        self._by_last_seen[agent.agent_id] = None
        self._by_last_seen.move_to_end(agent.agent_id)

    def _mark_removed(self, agent_id: str) -> None:
        """Remember a removed agent, forgetting the oldest beyond the bound. A forgotten
        one that comes back is refused as unknown, and registers anew just the same."""
        self.removed_agents[agent_id] = None
        while len(self.removed_agents) > self.config.max_removed_agents:
            oldest = next(iter(self.removed_agents))
            del self.removed_agents[oldest]
            self.registry.forget_removed_agent(oldest)

    def reload_acls(self) -> bool:
        """Read the ACL file again (on SIGHUP); an invalid file changes nothing."""
        if self.config.acls_file is None:
            return False
        try:
            self.acls = load_acls(self.config.acls_file)
        except AclError as e:
            log.error("ACL file rejected; the previous ACLs stay", reason=str(e))
            return False
        log.info("ACLs reloaded", file=str(self.config.acls_file))
        self._end_streams_no_longer_allowed()
        return True

    def _end_streams_no_longer_allowed(self) -> None:
        """After new ACLs, a framework or agent whose principal may no longer do what it
        subscribed or registered for loses its stream (its next attempt is refused)."""
        for framework in self.frameworks.values():
            role = framework.info.role
            allowed = self.authorized(
                Action.REGISTER_FRAMEWORKS, framework.principal, role
            ) and self.may_run_tasks_as(framework.principal, framework.info.user)
            if framework.outbox is not None and not allowed:
                log.warning(
                    "ending a framework's stream: the ACLs no longer allow it",
                    framework_id=framework.framework_id,
                )
                framework.outbox.close("the ACLs no longer allow this framework")
        for agent in self.agents.values():
            allowed = self.authorized(Action.REGISTER_AGENTS, agent.principal)
            if agent.outbox is not None and not allowed:
                log.warning(
                    "ending an agent's stream: the ACLs no longer allow it", agent_id=agent.agent_id
                )
                agent.outbox.close("the ACLs no longer allow this agent")

    def _framework(self, framework_id: str) -> FrameworkRecord:
        """A live framework, for a call made on its behalf."""
        framework = self.frameworks.get(framework_id)
        if framework is None or framework.removing:
            raise CallRejected(f"framework {framework_id} is not known")
        return framework

    def _notify(self, framework_id: str, status: TaskStatus) -> None:
        """Send a master-made update now, or when the framework is back."""
        framework = self.frameworks.get(framework_id)
        if framework is None:
            return
        if framework.outbox is not None:
            framework.outbox.send(msg.Update(status))
        else:
            framework.undelivered.append(status)

    def _master_status(
        self, task_id: str, framework_id: str, agent_id: str, state: TaskState, message: str
    ) -> TaskStatus:
        """An update the master makes on its own authority: it needs no acknowledgement."""
        return TaskStatus(
            task_id,
            framework_id,
            agent_id,
            state,
            message,
            timestamp=self._wall_clock(),
            source=StatusSource.MASTER,
        )

    # What one concern asks of another ------------------------------------------

    @abc.abstractmethod
    def _start_failover_timer(self, framework: FrameworkRecord, timeout: float) -> None:
        """master/frameworks.py"""

    @abc.abstractmethod
    def _forget_if_done(self, framework: FrameworkRecord) -> None:
        """master/frameworks.py"""

    @abc.abstractmethod
    def _remove_framework(self, framework: FrameworkRecord, reason: str) -> None:
        """master/frameworks.py"""

    @abc.abstractmethod
    def _rescind_offers(self, framework: FrameworkRecord, notify: bool = True) -> None:
        """master/offers.py"""

    @abc.abstractmethod
    def _rescind_agent_offers(self, agent_id: str) -> None:
        """master/offers.py"""

    @abc.abstractmethod
    def _terminate(self, task: TaskRecord, state: TaskState, reason: str) -> None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _completed_task(self, framework: FrameworkRecord, task_id: str) -> TaskRecord | None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _remember_completed(self, framework: FrameworkRecord, task: TaskRecord) -> None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _end_early(self, task: TaskRecord, state: TaskState) -> None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _end_delivered(self, framework: FrameworkRecord, task: TaskRecord) -> None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _answer_deferred_reconciliations(self) -> None:
        """master/status_updates.py"""

    @abc.abstractmethod
    def _tasks_expected(self, framework_id: str) -> bool:
        """master/recovery.py"""

    @abc.abstractmethod
    def _stop_recovering(self, agent_id: str) -> list[TaskEntry]:
        """master/recovery.py"""

    @abc.abstractmethod
    def _cluster_changed(self) -> None:
        """master/role_settings.py"""

    @abc.abstractmethod
    def _share_inputs(self) -> dict[str, ShareInput]:
        """master/role_settings.py"""

    @abc.abstractmethod
    def instantaneous_fair_shares(self) -> InstantShares:
        """master/role_settings.py"""

    @abc.abstractmethod
    def _preempted_ended(self, task: TaskRecord) -> float:
        """master/preemptions.py: how long to keep a preempted task's resources from
        its framework on its agent (0 if it was not preempted)."""

    @abc.abstractmethod
    def _preemption_kills_owed(self, agent_id: str) -> list[msg.KillTask]:
        """master/preemptions.py"""

    @abc.abstractmethod
    def _as_preempted(self, status: TaskStatus) -> TaskStatus:
        """master/preemptions.py"""

    @abc.abstractmethod
    def role_demands(self) -> dict[str, Resources]:
        """master/demand.py"""

    @abc.abstractmethod
    def _revocable(self, framework_id: str, offered: Resources) -> Resources:
        """master/preemptions.py"""


def with_agent(spec: TaskSpec, agent_id: str) -> TaskSpec:
    """The task as placed on `agent_id`."""
    if spec.agent_id == agent_id:
        return spec
    return TaskSpec(
        spec.task_id, spec.command, spec.resources, spec.name, agent_id, dict(spec.environment)
    )
