"""The agent: one long-lived AgentGateway.Connect stream to the master, and the
tasks the master launches over it.

What the master can rely on:

* The first message on every stream is `register`: an empty agent id when the
  agent is new; otherwise the id it was given, with the tasks it still runs
  and, in their end state, those whose terminal update is not yet
  acknowledged (they hold no resources).
  After `registered` the agent sends a heartbeat every heartbeat interval.
* Every task transition becomes a status update with a fresh `update_id`,
  source AGENT. Per task, only the oldest unacknowledged update is in flight;
  it is re-sent with jittered backoff until the master sends `acknowledge` for
  it, and all pending updates are re-sent after every (re-)registration
  (`agent/_status_reporter.py`).
* How the stream ended decides what happens next:
  - FAILED_PRECONDITION (this agent id was removed): the agent kills all its
    tasks, drops their pending updates, forgets its id (deleting its
    checkpoint) and registers as new.
  - INVALID_ARGUMENT, UNAUTHENTICATED or PERMISSION_DENIED before `registered`:
    the registration was refused; `run()` raises `AgentRegistrationError` (after
    killing any tasks). A TLS handshake the master refuses (say, a certificate
    from another CA) ends as UNAVAILABLE, and the agent keeps trying.
  - anything else (UNAVAILABLE, a clean end, ...): the tasks keep running and
    the agent reconnects with jittered backoff, forever.

The agent survives its own SIGKILL (Mesos' agent recovery, with checkpointing).
Everything it needs is in its work dir (0711: tasks pass through it, none lists it):

    agent.json               its agent id, written once the master gave it one (0600)
    status_updates.jsonl     updates not yet acknowledged (`agent._journal`, 0600)
    sandboxes/<framework_id>/<task_id>/{stdout,stderr,...}
                             one per task, owned by the task's user, 0700, under
                             directories tasks may pass but not list (`agent.tasks`)
    tasks.jsonl              its checkpoints of its tasks (`agent._task_log`, 0600)
    meta/<framework_id>/<task_id>/{exit.json,wrapper.json}
                             a task wrapper's records, 0700 (`agent.tasks`)
    gc-trash/                sandboxes and records being deleted (`agent._sandbox_gc`)
    supervisor/{socket,supervisor.log}
                             the supervisor that forks task wrappers and outlives the
                             agent (`agent._supervisor`), 0700, its socket 0600

The sandboxes and records of ended tasks are removed after `--gc-delay`, sooner as
the disk fills (`agent/gc_policy.py`), never while the task is live.

Each update is journaled (fsynced) before it is first sent. A task outlives
the agent under its wrapper process, which records the command's exit status,
forked by the agent's supervisor, which outlives the agent too.
On start, before registering, the agent reads its id back, replays the journal
and recovers its tasks (re-attaching to those still running, reporting how the
others ended), then registers under the old id with the tasks it runs plus
those whose end the master may not have heard of, reported in their end
state: the master frees them and forwards the journaled updates that follow,
with their original update ids, the end last. Started without an id, the agent kills whatever a
previous agent left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
import structlog

from mesolite.agent import _wire as wire
from mesolite.agent._checkpoint import (
    AGENT_FILE,
    forget_agent_id,
    load_agent_id,
    save_agent_id,
    secure_work_dir,
)
from mesolite.agent._journal import JOURNAL_FILE
from mesolite.agent._sandbox_gc import SandboxGc
from mesolite.agent._status_reporter import StatusReporter
from mesolite.agent._stream import Outbox, StreamEnd, heartbeats, read_event
from mesolite.agent._stream import ended as stream_ended
from mesolite.agent._task_log import TASK_LOG_FILE
from mesolite.agent.config import AgentConfig
from mesolite.agent.errors import AgentError, AgentRegistrationError
from mesolite.agent.isolation import Isolator
from mesolite.agent.tasks import TaskRunner
from mesolite.grpc_utils import create_channel
from mesolite.masters import QUICK_RETRY, MasterList, leader_hint, parse_masters
from mesolite.model import RunningTask, TaskSpec, TaskState
from mesolite.resources import Resources
from mesolite.stream_writer import in_batches
from mesolite.v1 import agent_pb2, agent_pb2_grpc

log = structlog.get_logger(__name__)

# Used when the master's `registered` carries no usable interval.
DEFAULT_HEARTBEAT_INTERVAL = 5.0
_OUTBOX_SIZE = 256
ACTIVITY_LOG_PERIOD = 10.0  # seconds between the agent's activity lines, as the master's
# A busy stream waits this long after a write for more calls to send in one batch.
_LINGER = 0.02
_HALF_CLOSE_WAIT = 1.0  # how long a stopping agent waits for the master to end the stream
# The master refused this agent: registering again the same way cannot succeed.
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


class Agent:
    """A mesolite agent: ``async with Agent(config) as agent:`` or ``await agent.run()``.

    Its settings are one `AgentConfig` (`agent/config.py`).
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._master = config.master
        self._masters = MasterList(parse_masters(config.master))  # HA: h1:5050,h2:5050
        self._total = config.resources
        self._hostname = config.hostname
        self._address = config.address
        self._attributes = dict(config.attributes)
        self._reconnect = config.reconnect_backoff
        self._registration_timeout = config.registration_timeout
        self._stop_timeout = config.stop_timeout
        self._work_dir = Path(config.work_dir).absolute()
        self._agent_id: str | None = None
        self._saved_agent_id: str | None = None
        self._reporter = StatusReporter(
            self._work_dir, config.status_retry, agent_id=lambda: self._agent_id
        )
        self._runner = TaskRunner(
            self._work_dir,
            self._reporter.report_transition,
            kill_grace_period=config.kill_grace_period,
            isolator=Isolator(config.isolation, self._work_dir),
        )
        self._gc = SandboxGc(self._work_dir, config.gc, self._runner.live_keys)
        self._registered = asyncio.Event()
        self._stopping = asyncio.Event()
        self._done = asyncio.Event()
        self._started = False
        self._error: Exception | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._outbox: Outbox | None = None

    # Public surface.

    @property
    def agent_id(self) -> str | None:
        """The id the master gave this agent; kept while disconnected, None when new."""
        return self._agent_id

    @property
    def total_resources(self) -> Resources:
        return self._total

    def running_tasks(self) -> list[RunningTask]:
        return self._runner.running_tasks()

    def sandbox_path(self, framework_id: str, task_id: str) -> Path:
        return self._runner.sandbox_path(framework_id, task_id)

    def records_path(self, framework_id: str, task_id: str) -> Path:
        """Where a task's wrapper keeps its records (`exit.json`, `wrapper.json`); the
        agent's checkpoints of its tasks are in its task log (`agent/_task_log.py`)."""
        return self._runner.records_path(framework_id, task_id)

    async def wait_registered(self) -> str:
        """Wait until the agent is registered on the current stream; returns its id.

        Registration is re-armed whenever the stream is lost. Raises the run's
        error (or `AgentError`) if the agent stops first. Bound the wait with
        `asyncio.timeout()`.
        """
        waiters = [
            asyncio.ensure_future(self._registered.wait()),
            asyncio.ensure_future(self._done.wait()),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if self._registered.is_set() and self._agent_id:
            return self._agent_id
        raise self._error or AgentError("the agent has stopped")

    async def run(self) -> None:
        """Connect, register and serve the master until `stop()`; kills all tasks on the way out."""
        if self._started:
            raise RuntimeError("an Agent can run only once")
        self._started = True
        journal = asyncio.create_task(self._reporter.run(), name="mesolite-agent-journal")
        log.info(
            "agent starting",
            master=self._master,
            hostname=self._hostname,
            total=str(self._total),
            work_dir=str(self._work_dir),
        )
        gc: asyncio.Task[None] | None = None
        activity: asyncio.Task[None] | None = None
        try:
            await self._recover()
            # After recovery: the runner knows which tasks are live (never collected).
            gc = asyncio.create_task(self._gc.run(), name="mesolite-agent-gc")
            activity = asyncio.create_task(self._log_activity(), name="mesolite-agent-activity")
            await self._serve()
        except Exception as e:
            self._error = e
            raise
        finally:
            for helper in (gc, activity):
                if helper is not None:
                    helper.cancel()
                    await asyncio.gather(helper, return_exceptions=True)
            self._registered.clear()
            await self._runner.shutdown()
            # What the tasks' ends reported must be on disk for the next start.
            await self._reporter.flush()
            journal.cancel()
            await asyncio.gather(journal, return_exceptions=True)
            await asyncio.to_thread(self._runner.close)
            self._done.set()
            log.info("agent stopped", agent_id=self._agent_id)

    async def _log_activity(self) -> None:
        """One info line a period with how many tasks started, ran and ended (each is
        logged at debug), if any did."""
        while True:
            await asyncio.sleep(ACTIVITY_LOG_PERIOD)
            if counts := self._runner.take_activity():
                log.info("activity", agent_id=self._agent_id, **counts)

    async def stop(self) -> None:
        """Ask `run()` to finish and wait until it has. Safe to call more than once."""
        self._stopping.set()
        if self._started:
            await self._done.wait()

    async def __aenter__(self) -> Agent:
        self._run_task = asyncio.create_task(self.run(), name="mesolite-agent")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)
        if exc is None and self._error is not None:
            raise self._error

    # Recovery: what a previous agent process left in the work dir.

    async def _recover(self) -> None:
        await asyncio.to_thread(
            secure_work_dir, self._work_dir, (AGENT_FILE, JOURNAL_FILE, TASK_LOG_FILE)
        )
        self._agent_id = self._saved_agent_id = await asyncio.to_thread(
            load_agent_id, self._work_dir
        )
        _bind_agent_id(self._agent_id)
        await self._runner.recover(await self._reporter.recover())
        running, ended = self._runner.running_tasks(), self._runner.ended_tasks()
        log.info(
            "recovered from the work dir",
            agent_id=self._agent_id,
            tasks=len(running),
            ended_unacknowledged=len(ended),
            pending_updates=len(self._reporter),
        )
        if self._agent_id is None and (running or ended or len(self._reporter)):
            # Their master knew them under an id we no longer have.
            log.warning("no agent id checkpointed: killing what a previous agent left behind")
            await self._forget_identity()

    # The connection loop.

    async def _serve(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            # A new channel for every attempt, so that our backoff alone decides when to
            # try again: a channel whose connection failed fails calls at once until gRPC's
            # own reconnect backoff has passed, and each such failure would cost another
            # of our delays (agents came back after a master restart only after the
            # re-registration window had closed, and lost their tasks).
            channel = create_channel(self._masters.current, self.config.tls, self.config.token)
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            session = asyncio.create_task(self._session(stub), name="mesolite-agent-stream")
            stopping = asyncio.create_task(self._stopping.wait())
            try:
                await asyncio.wait({session, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not session.done():
                    await self._close(session)
                    return
            except BaseException:
                session.cancel()
                await asyncio.gather(session, return_exceptions=True)
                raise
            finally:
                stopping.cancel()
                await channel.close()
            end = session.result()
            if end.registered:
                failures = 0
                self._masters.connected()
            await self._after_stream(end)
            if self._masters.failed(end.leader):
                delay = self._reconnect.delay(failures)
                failures += 1
            else:
                delay = QUICK_RETRY  # the leader a standby named, or the next master
            log.info(
                "reconnecting to the master",
                agent_id=self._agent_id,
                master=self._masters.current,
                delay=round(delay, 3),
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()

    async def _after_stream(self, end: StreamEnd) -> None:
        bound = log.bind(agent_id=self._agent_id, code=end.code.name, details=end.details)
        if end.code == grpc.StatusCode.FAILED_PRECONDITION:
            bound.warning("master removed this agent; killing its tasks to register as new")
            await self._forget_identity()
        elif end.code in _REFUSED and not end.registered:
            bound.error("master refused the registration")
            raise AgentRegistrationError(
                f"master {self._master} refused the registration: {end.details}"
            )
        else:
            bound.warning("lost the master; tasks keep running")

    async def _forget_identity(self) -> None:
        await self._runner.shutdown()
        # The master no longer knows these tasks: their updates could not be
        # delivered. The reset waits for the updates just reported (KILLED).
        self._runner.forget_ended()
        await self._reporter.forget()
        try:
            await asyncio.to_thread(forget_agent_id, self._work_dir)
        except OSError as e:
            log.error("could not delete the agent id checkpoint", error=str(e))
        self._agent_id = self._saved_agent_id = None
        _bind_agent_id(None)

    async def _close(self, session: asyncio.Task[StreamEnd]) -> None:
        """Stop requested while connected: let the master hear how the tasks ended."""
        if self._registered.is_set():
            log.info("stopping: killing tasks and flushing their updates", agent_id=self._agent_id)
            await self._runner.shutdown()
            acked = asyncio.create_task(self._reporter.wait_acknowledged())
            await asyncio.wait(
                {acked, session}, timeout=self._stop_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            acked.cancel()
            if pending := len(self._reporter):
                log.warning("stopping with unacknowledged updates", count=pending)
            if self._outbox is not None and not session.done():
                # Half-close, so the master sees the agent leave, not a broken stream.
                self._outbox.close()
                await asyncio.wait({session}, timeout=_HALF_CLOSE_WAIT)
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)

    # One stream.

    async def _session(self, stub: Any) -> StreamEnd:
        call = stub.Connect()
        outbox = Outbox(_OUTBOX_SIZE)
        self._outbox = outbox
        # Once the master says it reads batches (Registered.batches), the calls waiting
        # together go out as one message, and a busy stream lingers to fill them.
        reads_batches = False

        def grouped(calls: list[agent_pb2.AgentCall]) -> list[agent_pb2.AgentCall]:
            if not reads_batches or len(calls) == 1:
                return calls
            return list(in_batches(calls, wire.batch_call))

        helpers = [asyncio.create_task(outbox.write_to(call, grouped, _LINGER))]
        registered = False
        try:
            tasks = self._registration_tasks()
            log.info("registering", agent_id=self._agent_id, master=self._master, tasks=len(tasks))
            await outbox.put(
                wire.register_call(
                    agent_id=self._agent_id or "",
                    hostname=self._hostname,
                    address=self._address,
                    total=self._total,
                    attributes=self._attributes,
                    tasks=tasks,
                    isolation=self._runner.isolator.mode.value,
                    task_user=self._runner.isolator.task_user_name,
                )
            )
            try:
                async with asyncio.timeout(self._registration_timeout):
                    event = await self._await_registered(call)
            except TimeoutError:
                return StreamEnd(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer to register", False)
            if event is None:
                return await stream_ended(call, registered)
            reads_batches = event.batches
            await self._on_registered(event)
            registered = True
            interval = event.heartbeat_interval
            if interval <= 0:
                interval = DEFAULT_HEARTBEAT_INTERVAL
            usage = self._runner.sample_usage
            helpers.append(asyncio.create_task(heartbeats(outbox, interval, usage)))
            helpers.append(asyncio.create_task(self._reporter.send(outbox)))
            while (msg := await read_event(call)) is not None:
                for each in wire.events_from_proto(msg):
                    self._handle(each)
            return await stream_ended(call, registered)
        except grpc.aio.AioRpcError as e:
            leader = leader_hint(e.trailing_metadata())
            return StreamEnd(e.code(), e.details() or "", registered, leader)
        finally:
            self._registered.clear()
            self._outbox = None
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            call.cancel()

    async def _await_registered(self, call: Any) -> wire.Registered | None:
        """Read until `registered` (None if the stream ends first).

        The master sends `registered` first. Should anything come before it,
        the stream is not dropped (that would only repeat the same exchange):
        kills and acknowledgements are safe to apply at any time and are
        applied; a launch is refused (reported TASK_FAILED), since this agent
        has no confirmed identity yet to run it under.
        """
        while (message := await read_event(call)) is not None:
            for event in wire.events_from_proto(message):
                if isinstance(event, wire.Registered) and event.agent_id:
                    return event
                log.error(
                    "the master broke the protocol order: event before `registered`",
                    agent_id=self._agent_id,
                    got=str(event),
                )
                if isinstance(event, wire.LaunchTask):
                    self._reporter.report(
                        event.framework_id,
                        event.task.task_id,
                        TaskState.FAILED,
                        "launch sent before the agent was registered",
                    )
                elif isinstance(event, wire.KillTask | wire.Acknowledge):
                    self._handle(event)
        return None

    def _registration_tasks(self) -> list[RunningTask]:
        """The running tasks, then those whose end is not acknowledged yet.

        An ended task is reported, with its end state, so that a master that has
        not heard of its end does not mark it LOST: it holds no resources, and its
        updates, the end last, are forwarded when they come.
        """
        return self._runner.running_tasks() + self._runner.ended_tasks()

    async def _on_registered(self, event: wire.Registered) -> None:
        if self._agent_id and event.agent_id != self._agent_id:
            # The master did not take us back under our old id, so it does not
            # expect our tasks either.
            log.error(
                "master answered re-registration with a new id; killing old tasks",
                agent_id=self._agent_id,
                new_agent_id=event.agent_id,
            )
            await self._forget_identity()
        self._agent_id = event.agent_id
        _bind_agent_id(self._agent_id)
        if self._saved_agent_id != self._agent_id:
            # Before anything else happens under this id, so a restart uses it.
            try:
                await asyncio.to_thread(save_agent_id, self._work_dir, self._agent_id)
                self._saved_agent_id = self._agent_id
            except OSError as e:
                log.error(
                    "could not checkpoint the agent id", agent_id=self._agent_id, error=str(e)
                )
        self._reporter.resend_all()
        self._registered.set()
        log.info(
            "registered",
            agent_id=self._agent_id,
            heartbeat_interval=event.heartbeat_interval,
            tasks=len(self._runner.running_tasks()),
            pending_updates=len(self._reporter),
        )

    def _handle(self, event: wire.Event | None) -> None:
        if isinstance(event, wire.LaunchTask):
            self._launch(event.framework_id, event.task, event.user)
        elif isinstance(event, wire.KillTask):
            log.info(
                "kill requested by master",
                agent_id=self._agent_id,
                framework_id=event.framework_id,
                task_id=event.task_id,
            )
            self._runner.kill(event.framework_id, event.task_id)
        elif isinstance(event, wire.Acknowledge):
            run_id = self._reporter.acknowledge(event)
            if run_id is not None:  # a task's end: the runner can forget that run
                self._runner.acknowledged_end(event.framework_id, event.task_id, run_id)
        elif isinstance(event, wire.InvalidLaunch):
            log.warning(
                "launch with an invalid task",
                agent_id=self._agent_id,
                framework_id=event.framework_id,
                task_id=event.task_id,
                reason=event.reason,
            )
            self._reporter.report(event.framework_id, event.task_id, TaskState.FAILED, event.reason)
        else:
            log.warning("unexpected event from the master ignored", event=str(event))

    def _launch(self, framework_id: str, task: TaskSpec, user: str) -> None:
        bound = log.bind(agent_id=self._agent_id, framework_id=framework_id, task_id=task.task_id)
        if self._runner.is_active(framework_id, task.task_id):
            bound.warning("duplicate launch ignored: task is already active")
            return
        if self._stopping.is_set():
            self._reporter.report(
                framework_id, task.task_id, TaskState.FAILED, "the agent is stopping"
            )
            return
        used = self._runner.used()
        if not self._total.contains(used + task.resources):
            reason = (
                f"insufficient resources on agent: task needs {task.resources}, "
                f"free {self._total - used}"
            )
            bound.warning("launch refused", reason=reason)
            self._reporter.report(framework_id, task.task_id, TaskState.FAILED, reason)
            return
        # At debug: the task runner logs the task starting, with its resources.
        bound.debug("launching task", resources=str(task.resources), user=user or None)
        self._runner.launch(framework_id, task, user)


def _bind_agent_id(agent_id: str | None) -> None:
    # For the task runner's lines too. Context variables are per asyncio task
    # and copied into the tasks it creates, so agents sharing a process (tests)
    # keep their own ids; tasks created earlier keep the id they started with.
    structlog.contextvars.bind_contextvars(agent_id=agent_id)
