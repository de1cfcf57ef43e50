"""The agent's status updates, from a task's transition to the master's acknowledgement.

Every transition becomes an update with a fresh `update_id`, source AGENT. It is
journaled (fsynced, `agent/_journal.py`) before it is first sent. Per task, only the
oldest unacknowledged update is in flight; it is re-sent with jittered backoff until the
master relays the framework's acknowledgement (`agent/_updates.py`), and every pending
update is re-sent after each (re-)registration. An acknowledgement is journaled too, so
that a restarted agent, replaying the journal, re-sends only what is still pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

from mesolite.agent import _wire as wire
from mesolite.agent._journal import JOURNAL_FILE, Ack, JournalWriter, PendingUpdate, UpdateJournal
from mesolite.agent._stream import Outbox
from mesolite.agent._task_records import TaskTransition
from mesolite.agent._updates import StatusUpdates
from mesolite.backoff import Backoff
from mesolite.model import StatusSource, TaskState, TaskStatus

log = structlog.get_logger("mesolite.agent.agent")


class StatusReporter:
    """The agent's pending status updates: journaled, sent, re-sent until acknowledged.

    `agent_id` gives the id the updates are made under (None while the agent has none).
    `len()` is the number of updates not yet acknowledged.
    """

    def __init__(self, work_dir: Path, retry: Backoff, agent_id: Callable[[], str | None]) -> None:
        self._agent_id = agent_id
        self._updates = StatusUpdates(retry)
        self._journal = UpdateJournal(work_dir / JOURNAL_FILE)
        self._writer = JournalWriter(self._journal, self._on_durable)
        self._run_of_update: dict[str, str] = {}  # update id -> task run, while pending
        self._changed = asyncio.Event()
        self._acked = asyncio.Event()

    def __len__(self) -> int:
        return len(self._updates) + self._writer.backlog

    async def run(self) -> None:
        """Write the journal; runs until cancelled (after `flush()`, to lose nothing)."""
        await self._writer.run()

    async def flush(self) -> None:
        """Wait until every update and acknowledgement so far is on disk."""
        await self._writer.flush()

    async def recover(self) -> dict[tuple[str, str], TaskTransition]:
        """Replay the journal: its updates are pending again. Returns, per task, the
        terminal transition among them, for the task runner's `recover()`."""
        try:
            pending = await asyncio.to_thread(self._journal.load)
        except OSError as e:
            log.error("could not read the status update journal", error=str(e))
            pending = []
        ends: dict[tuple[str, str], TaskTransition] = {}
        for update in pending:
            status = update.status
            self._updates.add(status)
            self._run_of_update[status.update_id] = update.run_id
            if status.state.is_terminal:
                ends[(status.framework_id, status.task_id)] = TaskTransition(
                    status.framework_id,
                    status.task_id,
                    status.state,
                    status.message,
                    status.exit_code,
                    update.run_id,
                    status.reason,
                )
        return ends

    def report_transition(self, t: TaskTransition) -> asyncio.Future[None]:
        """The task runner's status callback."""
        return self.report(
            t.framework_id, t.task_id, t.state, t.message, t.exit_code, t.run_id, t.reason
        )

    def report(
        self,
        framework_id: str,
        task_id: str,
        state: TaskState,
        message: str = "",
        exit_code: int | None = None,
        run_id: str = "",
        reason: str = "",
    ) -> asyncio.Future[None]:
        """Journal a new update; it is queued for sending once durable (`_on_durable`).
        The future resolves then."""
        status = TaskStatus(
            task_id=task_id,
            framework_id=framework_id,
            agent_id=self._agent_id() or "",
            state=state,
            message=message,
            exit_code=exit_code,
            timestamp=time.time(),
            update_id=uuid.uuid4().hex,
            source=StatusSource.AGENT,
            reason=reason,
        )
        # Per update at debug: the task runner logs each transition at info.
        log.debug(
            "status update",
            agent_id=self._agent_id(),
            framework_id=framework_id,
            task_id=task_id,
            update_id=status.update_id,
            state=state.value,
            exit_code=exit_code,
            reason=message,
            limitation=reason or None,
        )
        self._run_of_update[status.update_id] = run_id
        return self._writer.submit(PendingUpdate(status, run_id))

    def acknowledge(self, ack: wire.Acknowledge) -> str | None:
        """Drop the acknowledged update. Returns the task run whose end it was, if it
        was a terminal update: the task runner can forget that run."""
        bound = log.bind(
            agent_id=self._agent_id(),
            framework_id=ack.framework_id,
            task_id=ack.task_id,
            update_id=ack.update_id,
        )
        acked = self._updates.acknowledge(ack.framework_id, ack.task_id, ack.update_id)
        if acked is None:
            bound.info("acknowledgement for no pending update ignored")
            return None
        bound.debug("status update acknowledged", state=acked.state.value)
        # Not waited for: a lost ack record only means one re-send after a restart.
        self._writer.submit(Ack(ack.framework_id, ack.task_id, ack.update_id))
        run_id = self._run_of_update.pop(ack.update_id, "")
        self._changed.set()
        self._acked.set()
        return run_id if acked.state.is_terminal else None

    def resend_all(self) -> None:
        """Make every pending update due now, e.g. after registering."""
        self._updates.resend_all()

    async def forget(self) -> None:
        """Drop every pending update, journal included, once the updates already
        reported are written: the master no longer knows their tasks."""
        await self._writer.reset()
        self._updates.clear()
        self._run_of_update.clear()

    async def wait_acknowledged(self) -> None:
        """Wait until no update is pending."""
        while True:
            self._acked.clear()
            if not len(self):
                return
            await self._acked.wait()

    async def send(self, outbox: Outbox) -> None:
        """Send the updates that are due, on one stream, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            # Cleared before looking, so a change made while we send is not missed.
            self._changed.clear()
            for status in self._updates.take_due(loop.time()):
                log.debug(
                    "sending status update",
                    agent_id=self._agent_id(),
                    framework_id=status.framework_id,
                    task_id=status.task_id,
                    update_id=status.update_id,
                    state=status.state.value,
                )
                latest = self._updates.latest_state(status)
                await outbox.put(wire.status_update_call(status, latest))
            next_due = self._updates.next_due()
            timeout = None if next_due is None else max(0.0, next_due - loop.time())
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation
            # that comes as the event is set, and the session's end would then wait
            # forever for this task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def _on_durable(self, update: PendingUpdate) -> None:
        self._updates.add(update.status)
        self._changed.set()
