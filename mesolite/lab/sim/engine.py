"""The simulator: the real master core and allocator, driven in virtual time, no network.

A `Simulation` builds a `Master` (`master/master.py`) on `VirtualTimers` and an
in-memory registry, registers the workload's agents, and plays its jobs:

- each job is a framework that subscribes at its arrival time; offered
  resources, it launches every pending task that fits (its groups in order),
  returning the rest unfiltered, and declines an offer that fits none with the
  workload's `refuse_seconds`; with nothing pending it suppresses offers, and
  when its last task has ended it tears itself down;
- each agent runs what it is told to: a task ends (TASK_FINISHED) `duration`
  seconds after its launch, a killed one at once (TASK_KILLED);
- allocation cycles run as the master process runs them (`master/server.py`):
  every `allocation_interval`, and promptly (after `REACTION` seconds) when the
  core asks for one (`allocation_wanted`: resources were freed or returned).

Every message the core sends is delivered in order before the next timer
fires, so frameworks and agents answer in zero virtual time. Under the `slots`
policy a task asks for whole slots (`SlotsPolicy.slot`, 1 CPU + 2 GB), as many
as its most slot-hungry resource needs, rounded up: Hadoop's slots, without
their overcommit. What a task really uses (its group's `resources`) is what the
utilization and dominant shares count.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mesolite.errors import MesoliteError
from mesolite.lab.sim.virtual_time import VirtualTimers
from mesolite.lab.sim.workload import Job, SimWorkload, TaskGroup
from mesolite.master import messages as msg
from mesolite.master.master import Master, MasterConfig
from mesolite.master.policies.slots import SlotsPolicy
from mesolite.master.preemption import starvation
from mesolite.master.registry import Registry
from mesolite.model import FrameworkInfo, Offer, TaskSpec, TaskState, TaskStatus
from mesolite.resources import EMPTY, Resources

REACTION = 0.2  # seconds from "allocation wanted" to the prompt cycle (see the module)


class WorkloadCannotRun(MesoliteError, ValueError):
    """The workload could never finish on its cluster (a task fits no agent, or tasks
    never end and no end time is set)."""


@dataclass(frozen=True, slots=True)
class JobResult:
    name: str
    role: str
    tasks: int
    arrival: float
    started: float | None  # first launch
    finished: float | None  # last task ended (None: not by the end)

    @property
    def completion(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass(frozen=True, slots=True)
class SimSample:
    time: float
    used: dict[str, float]  # fraction of the cluster's total each resource in use by tasks
    allocated: dict[str, float]  # fraction the allocator holds (tasks as asked, and offers)
    running: int
    active_jobs: int


@dataclass(slots=True)
class SimResult:
    policy: str
    total: Resources
    jobs: list[JobResult]
    samples: list[SimSample]
    shares: list[tuple[float, str, float]]  # (time, role, dominant share of what it uses)
    offers: int = 0
    declines: int = 0
    cycles: int = 0
    launched: int = 0
    wall_seconds: float = 0.0
    end_time: float = 0.0
    invariant_violations: list[str] = field(default_factory=list)
    # (time the framework was told, role it was taken from, role it was for, agent)
    preemptions: list[tuple[float, str, str, str]] = field(default_factory=list)
    # Launches by a role on an agent it lost a task to preemption on, within the
    # master's preemption hold, while the role it was taken for was still starved:
    # (time, role, agent, the role it was for). Empty when preemption does not thrash.
    given_back: list[tuple[float, str, str, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Task:
    task_id: str
    group: TaskGroup
    request: Resources
    duration: float


@dataclass(slots=True)
class _Pending:
    """`count` tasks of one group still to launch (`task_ids`: ids to reuse first, of
    tasks that were killed and run again, each for its `durations`)."""

    group: TaskGroup
    request: Resources
    count: int
    task_ids: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Job:
    job: Job
    framework_id: str = ""
    pending: deque[_Pending] = field(default_factory=deque)
    running: dict[str, _Task] = field(default_factory=dict)
    ended: int = 0
    started: float | None = None
    finished: float | None = None
    suppressed: bool = False


class _Peer:
    """An outbox whose messages the simulation delivers, in order, as soon as the core's
    call that queued them has returned."""

    def __init__(self, deliver: Callable[[object], None], queue: deque[Callable[[], None]]):
        self._deliver = deliver
        self._queue = queue

    def send(self, message: object) -> None:
        self._queue.append(lambda: self._deliver(message))

    def close(self, reason: str = "") -> None:
        pass


class Simulation:
    def __init__(
        self,
        workload: SimWorkload,
        policy: str = "drf",
        *,
        seed: int = 0,
        check_invariants: bool = False,
    ) -> None:
        self.workload = workload
        self.policy = policy
        settings = workload.settings
        self._queue: deque[Callable[[], None]] = deque()
        self.timers = VirtualTimers(start=0.0, after_each=self._settle)
        config = MasterConfig(
            allocation_interval=settings.allocation_interval,
            offer_timeout=max(30.0, 10 * settings.allocation_interval),
            policy=policy,
            seed=seed,
            roles_file=settings.roles_file,
            preemption=settings.preemption,
            preemption_grace=settings.preemption_grace,
            packing=settings.packing,
            reservations=settings.reservations,
            check_invariants=check_invariants,
            max_frameworks=len(workload.jobs) + 1,
            max_agents=sum(g.count for g in workload.agents) + 1,
            max_roles=len({j.role for j in workload.jobs}) + 10,
            max_completed_frameworks=1,
            max_completed_tasks_per_framework=1,
        )
        self.master = Master(
            config,
            timers=self.timers,
            clock=self.timers,
            wall_clock=self.timers,
            registry=Registry(None),
        )
        policy_object = self.master.allocator.policy
        self._slot = policy_object.slot if isinstance(policy_object, SlotsPolicy) else None
        self._jobs = [_Job(j) for j in workload.jobs]
        self._by_framework: dict[str, _Job] = {}
        self._agent_ids: list[str] = []
        self._ids = itertools.count(1)
        self._used = EMPTY
        self._role_used: dict[str, Resources] = {}
        self._prompt_pending = False
        self._unfinished = len(self._jobs)
        # (role, agent) -> (when a task of the role there was preempted, for which role)
        self._taken: dict[tuple[str, str], tuple[float, str]] = {}
        self.result = SimResult(policy, workload.total, [], [], [])
        self._check(workload)

    # Setting up ------------------------------------------------------------

    def request_for(self, resources: Resources) -> Resources:
        """What a task of this shape asks the master for (whole slots under `slots`)."""
        if self._slot is None:
            return resources
        slots = max(
            (math.ceil(resources.get_amount(n) / self._slot.get_amount(n)) for n in self._slot),
            default=1,
        )
        request = self._slot
        for _ in range(max(1, slots) - 1):
            request = request + self._slot
        extra = Resources({n: resources.get_amount(n) for n in resources if n not in self._slot})
        return request + extra

    def _check(self, workload: SimWorkload) -> None:
        shapes = [g.resources for g in workload.agents]
        for job in workload.jobs:
            for group in job.groups:
                request = self.request_for(group.resources)
                if not any(shape.contains(request) for shape in shapes):
                    raise WorkloadCannotRun(
                        f"job {job.name}: a task asking {request} fits no agent"
                        + (f" (its {group.resources} in whole slots)" if self._slot else "")
                    )
                if math.isinf(group.duration) and workload.settings.end is None:
                    raise WorkloadCannotRun(
                        f"job {job.name}: its tasks never end, so the simulation needs an end"
                    )

    # Running ---------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        settings = self.workload.settings
        for i, group in enumerate(self.workload.agents):
            for k in range(group.count):
                self._add_agent(f"a{i}-{k}", group.resources)
        for job in self._jobs:
            self.timers.call_later(job.job.arrival, self._arrive, job)
        self.timers.call_later(0.0, self._tick)
        self.timers.call_later(0.0, self._sample)
        end = settings.end
        while self._unfinished or (end is not None and self.timers.now < end):
            due = self.timers.next_due()
            if due is None or (end is not None and due > end):
                break
            self.timers.advance(due - self.timers.now)
        if end is not None and self.timers.now < end:
            self.timers.advance(end - self.timers.now)
        self._record_sample()
        r = self.result
        r.end_time = self.timers.now
        r.cycles = self.master.allocation_cycles
        r.jobs = [
            JobResult(j.job.name, j.job.role, j.job.tasks, j.job.arrival, j.started, j.finished)
            for j in self._jobs
        ]
        r.invariant_violations = list(self.master.invariant_violations)
        r.wall_seconds = time.perf_counter() - started
        return r

    def _settle(self) -> None:
        """Deliver every queued message, then ask for a prompt cycle if one is wanted."""
        while self._queue:
            self._queue.popleft()()
        if self.master.allocation_wanted.is_set() and not self._prompt_pending:
            self._prompt_pending = True
            self.timers.call_later(REACTION, self._prompt)

    def _tick(self) -> None:
        self._allocate()
        self.timers.call_later(self.workload.settings.allocation_interval, self._tick)

    def _prompt(self) -> None:
        self._prompt_pending = False
        if self.master.allocation_wanted.is_set():
            self._allocate()

    def _allocate(self) -> None:
        self.master.allocation_wanted.clear()
        self.result.offers += self.master.allocate()
        self.master.check_preemption()

    def _sample(self) -> None:
        self._record_sample()
        self.timers.call_later(self.workload.settings.sample_interval, self._sample)

    def _record_sample(self) -> None:
        now = self.timers.now
        total = self.workload.total
        allocated = EMPTY
        for agent_id in self._agent_ids:
            allocated = allocated + self.master.allocator.agent_allocated(agent_id)
        self.result.samples.append(
            SimSample(
                now,
                _fractions(self._used, total),
                _fractions(allocated, total),
                sum(len(j.running) for j in self._jobs),
                sum(1 for j in self._jobs if j.framework_id and j.finished is None),
            )
        )
        for role, used in self._role_used.items():
            if not used.is_empty():
                self.result.shares.append((now, role, max(_fractions(used, total).values())))

    # Agents ----------------------------------------------------------------

    def _add_agent(self, name: str, total: Resources) -> None:
        holder: list[str] = []
        peer = _Peer(lambda m: self._agent_message(holder[0], m), self._queue)
        agent_id = self.master.register_agent("", name, "127.0.0.1:1", total, {}, (), peer)
        holder.append(agent_id)
        self._agent_ids.append(agent_id)
        self._settle()

    def _agent_message(self, agent_id: str, message: object) -> None:
        if isinstance(message, msg.LaunchTask):
            job = self._by_framework[message.framework_id]
            task = job.running[message.task.task_id]
            if not math.isinf(task.duration):
                self.timers.call_later(
                    task.duration, self._task_ended, agent_id, job, task, TaskState.FINISHED
                )
        elif isinstance(message, msg.KillTask):
            job = self._by_framework[message.framework_id]
            task_or_none = job.running.get(message.task_id)
            if task_or_none is not None:
                self._task_ended(agent_id, job, task_or_none, TaskState.KILLED)

    def _task_ended(self, agent_id: str, job: _Job, task: _Task, state: TaskState) -> None:
        if job.running.get(task.task_id) is not task:
            return  # already ended (killed before its end came)
        status = TaskStatus(
            task.task_id,
            job.framework_id,
            agent_id,
            state,
            timestamp=self.timers.now,
            update_id=f"u{next(self._ids)}",
        )
        self.master.status_update(agent_id, status)

    # Frameworks ------------------------------------------------------------

    def _arrive(self, job: _Job) -> None:
        for group in job.job.groups:
            job.pending.append(_Pending(group, self.request_for(group.resources), group.count))
        peer = _Peer(lambda m: self._framework_message(job, m), self._queue)
        info = FrameworkInfo(job.job.name, job.job.role)
        job.framework_id = self.master.subscribe(info, peer)
        self._by_framework[job.framework_id] = job
        self._declare(job)

    def _framework_message(self, job: _Job, message: object) -> None:
        if isinstance(message, msg.Offers):
            for offer in message.offers:
                self._answer(job, offer)
        elif isinstance(message, msg.Update):
            self._updated(job, message.status)
        elif isinstance(message, msg.Preemption):  # the job waits for the kill
            now = self.timers.now
            self.result.preemptions.append((now, job.job.role, message.for_role, message.agent_id))
            self._taken[(job.job.role, message.agent_id)] = (now, message.for_role)

    def _answer(self, job: _Job, offer: Offer) -> None:
        if (
            job.framework_id not in self.master.frameworks
            or offer.offer_id not in self.master.offers
        ):
            return
        free = offer.resources
        tasks: list[_Task] = []
        for pending in job.pending:
            while pending.count and free.contains(pending.request):
                pending.count -= 1
                if pending.task_ids:
                    task_id, duration = pending.task_ids.pop(), pending.durations.pop()
                else:
                    task_id = f"t{next(self._ids)}"
                    duration = pending.group.duration_of(pending.group.count - pending.count - 1)
                tasks.append(_Task(task_id, pending.group, pending.request, duration))
                free = free - pending.request
        if tasks:
            job.pending = deque(p for p in job.pending if p.count)
        if not tasks:
            self.master.decline(
                job.framework_id, [offer.offer_id], self.workload.settings.refuse_seconds
            )
            self.result.declines += 1
            return
        specs = [TaskSpec(t.task_id, "sim", t.request) for t in tasks]
        self.master.accept(job.framework_id, [offer.offer_id], specs, refuse_seconds=0)
        now = self.timers.now
        self._check_given_back(job.job.role, offer.agent_id, now)
        if job.started is None:
            job.started = now
        for t in tasks:
            job.running[t.task_id] = t
            self._use(job, t.group.resources)
        self.result.launched += len(tasks)
        self._declare(job)
        if not job.pending and not job.suppressed:
            job.suppressed = True
            self.master.suppress(job.framework_id)

    def _check_given_back(self, role: str, agent_id: str, now: float) -> None:
        taken = self._taken.get((role, agent_id))
        if taken is None:
            return
        when, for_role = taken
        if now - when > self.master.config.preemption_grace + self.master.config.preemption_hold:
            del self._taken[(role, agent_id)]
            return
        state = self.master.role_states().get(for_role)
        if state is not None and state.wants:
            below_g, below_f = starvation(
                state, self.master.allocator.total, self.master.allocator.policy
            )
            if below_g or below_f:
                self.result.given_back.append((now, role, agent_id, for_role))

    def _declare(self, job: _Job) -> None:
        """With `demand` on, tell the master what the job still waits for."""
        if not self.workload.settings.demand or job.finished is not None:
            return
        counts: dict[Resources, int] = {}
        for p in job.pending:
            if p.count:
                counts[p.request] = counts.get(p.request, 0) + p.count
        self.master.declare_demand(job.framework_id, list(counts.items()))

    def _updated(self, job: _Job, status: TaskStatus) -> None:
        if status.update_id:
            self.master.acknowledge(
                job.framework_id, status.agent_id, status.task_id, status.update_id
            )
        if not status.state.is_terminal:
            return
        task = job.running.pop(status.task_id, None)
        if task is None:
            return
        self._use(job, task.group.resources, release=True)
        if status.state is TaskState.FINISHED:
            job.ended += 1
        else:  # killed or lost before its end: it runs again, from the start
            job.pending.appendleft(
                _Pending(task.group, task.request, 1, [task.task_id], [task.duration])
            )
            self._declare(job)
            if job.suppressed:
                job.suppressed = False
                self.master.revive(job.framework_id)
        if job.ended == job.job.tasks and job.finished is None:
            job.finished = self.timers.now
            self._unfinished -= 1
            self.master.teardown(job.framework_id)

    def _use(self, job: _Job, resources: Resources, release: bool = False) -> None:
        role = job.job.role
        held = self._role_used.get(role, EMPTY)
        if release:
            self._used = self._used - resources
            self._role_used[role] = held - resources
        else:
            self._used = self._used + resources
            self._role_used[role] = held + resources


def _fractions(amounts: Resources, total: Resources) -> dict[str, float]:
    return {
        name: amounts.get_amount(name) / total.get_amount(name)
        for name in total
        if total.get_amount(name) > 0
    }


def simulate(
    workload: SimWorkload, policy: str = "drf", *, seed: int = 0, check_invariants: bool = False
) -> SimResult:
    """Run `workload` under `policy` on the real master core; see the module docstring."""
    return Simulation(workload, policy, seed=seed, check_invariants=check_invariants).run()
