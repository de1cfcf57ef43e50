"""A framework for tests that records everything the master sends it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from mesolite.framework_sdk import (
    ConnectionConfig,
    Framework,
    Offer,
    TaskState,
    TaskStatus,
    TlsConfig,
)
from tests.waiting import wait_for_condition

# Reconnect fast: tests restart masters and cut connections.
FAST_RECONNECT = ConnectionConfig(reconnect_initial=0.05, reconnect_max=0.5)


class RecordingFramework(Framework):
    def __init__(
        self,
        name: str = "recorder",
        role: str = "*",
        failover_timeout: float = 0.0,
        framework_id: str | None = None,
        id_file: Path | None = None,
        *,
        tls: TlsConfig | None = None,
        token: str | None = None,
        user: str | None = None,
    ) -> None:
        super().__init__(
            name,
            role,
            failover_timeout,
            framework_id,
            id_file,
            connection=FAST_RECONNECT,
            tls=tls,
            token=token,
            user=user,
        )
        self.offers: list[tuple[float, Offer]] = []  # (monotonic time, offer)
        self.updates: list[TaskStatus] = []
        self.errors: list[tuple[str, str]] = []
        self.rescinded: list[str] = []
        self.lost_agents: list[str] = []
        self.subscriptions = 0

    async def on_subscribed(self, framework_id: str, resubscribed: bool) -> None:
        self.subscriptions += 1

    async def on_offers(self, offers: list[Offer]) -> None:
        now = time.monotonic()
        self.offers.extend((now, o) for o in offers)

    async def on_update(self, status: TaskStatus) -> None:
        self.updates.append(status)

    async def on_error(self, message: str, call_id: str) -> None:
        self.errors.append((message, call_id))

    async def on_rescind(self, offer_id: str) -> None:
        self.rescinded.append(offer_id)

    async def on_agent_lost(self, agent_id: str) -> None:
        self.lost_agents.append(agent_id)

    # Waiting helpers -------------------------------------------------------

    async def next_offer(self, after: int = 0, agent_id: str | None = None) -> Offer:
        """The first offer received at index >= `after` (for `agent_id`, if given)."""

        def found() -> Offer | None:
            for _, o in self.offers[after:]:
                if o.offer_id in self.outstanding_offers and agent_id in (None, o.agent_id):
                    return o
            return None

        await wait_for_condition(lambda: found() is not None, what=f"an offer to {self.name}")
        offer = found()
        assert offer is not None
        return offer

    def states(self, task_id: str) -> list[TaskState]:
        return [u.state for u in self.updates if u.task_id == task_id]

    async def wait_state(self, task_id: str, state: TaskState, timeout: float = 20.0) -> None:
        await wait_for_condition(
            lambda: state in self.states(task_id), timeout, f"task {task_id} to reach {state.value}"
        )


@contextlib.asynccontextmanager
async def running(framework: Framework, master: str) -> AsyncIterator[Framework]:
    """Run a framework in the background until the block ends; wait for SUBSCRIBED."""
    task = asyncio.create_task(framework.run(master))
    try:
        await wait_for_condition(
            lambda: framework.connected or task.done(), what=f"{framework.name} to subscribe"
        )
        if task.done():
            task.result()
        yield framework
    finally:
        await framework.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
