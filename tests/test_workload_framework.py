"""A built-in workload framework against a scripted master (tests/test_sdk_fake_master.py):
after a restart it launches nothing until the master has answered for every task its
store says may be live, and it asks again for those still unanswered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mesolite.framework_sdk import ConnectionConfig
from mesolite.model import Offer, StatusSource, TaskState, TaskStatus
from mesolite.resources import Resources
from mesolite.workloads import RunnerConfig, WorkloadRunner
from mesolite.workloads.progress import Slot, SlotState
from mesolite.workloads.spec import WorkloadKind
from mesolite.workloads.store import WorkloadRecord, WorkloadStore
from tests.test_sdk_fake_master import FakeMaster, fake_master
from tests.waiting import wait_for_condition

JOB = """\
[job]
name = "j"
command = "true"
resources = { cpus = 1, mem = 10 }
completions = 3
parallelism = 2
"""
RUNNING_TASK = "j.0.0-aaaaaaaa"


def stored_job(path: Path) -> None:
    """What a runner that launched index 0, then died, left on disk."""
    store = WorkloadStore(path)
    record = WorkloadRecord("j", WorkloadKind.JOB, "j.toml", JOB, None, 1.0, framework_id="fw-1")
    store.add(record, [Slot(0, SlotState.RUNNING, RUNNING_TASK, 0, 1, 2.0), Slot(1), Slot(2)])
    store.close()


@asynccontextmanager
async def restarted_runner(tmp_path: Path) -> AsyncIterator[tuple[FakeMaster, WorkloadRunner]]:
    path = tmp_path / "workloads.sqlite"
    stored_job(path)
    async with fake_master() as master:
        runner = WorkloadRunner(
            RunnerConfig(path, connection=ConnectionConfig(reconnect_initial=0.05))
        )
        await runner.start(master.address)
        try:
            yield master, runner
        finally:
            await runner.close()


def offer(n: int) -> Offer:
    return Offer(f"O{n}", "fw-1", "A1", "host", Resources(cpus=8, mem=1000))


def status(task_id: str, state: TaskState, update_id: str = "") -> TaskStatus:
    source = StatusSource.AGENT if update_id else StatusSource.MASTER
    return TaskStatus(task_id, "fw-1", "A1", state, update_id=update_id, source=source)


async def handled(master: FakeMaster, marker: str) -> None:
    """Everything sent before now has been through the framework's callbacks: an update
    sent last is acknowledged only after its `on_update` (callbacks run in order)."""
    master.send_update(status(f"marker-{marker}", TaskState.RUNNING, update_id=marker))
    await wait_for_condition(
        lambda: any(a.update_id == marker for a in master.calls_of("acknowledge")),
        what=f"the acknowledgement of {marker}",
    )


async def test_nothing_is_launched_before_every_stored_task_is_answered_for(
    tmp_path: Path,
) -> None:
    async with restarted_runner(tmp_path) as (master, runner):
        await wait_for_condition(
            lambda: (
                [list(r.task_ids) for r in master.calls_of("reconcile")].count([RUNNING_TASK]) == 1
            ),
            what="an explicit reconciliation of the stored task",
        )
        # Offers before the answer: index 1 could be launched (parallelism 2), but the
        # framework does not know yet whether index 0 still runs. It holds them.
        master.send_offers(offer(1))
        await handled(master, "u1")
        assert master.calls_of("accept") == [] and master.calls_of("decline") == []
        framework = runner.workloads["j"].framework
        assert framework is not None and not framework.reconciled

        # The answer: index 0 finished while nobody listened. Now both others launch at
        # once, on the offer held.
        master.send_update(status(RUNNING_TASK, TaskState.FINISHED))
        await wait_for_condition(lambda: master.calls_of("accept") != [], what="a launch")
        [accept] = master.calls_of("accept")
        assert list(accept.offer_ids) == ["O1"]
        assert [t.name for t in accept.tasks] == ["j[1]", "j[2]"]
        assert framework.reconciled
        progress = runner.workloads["j"].progress
        assert progress is not None and progress.slots[0].state is SlotState.SUCCEEDED


async def test_tasks_still_unanswered_are_asked_about_again(tmp_path: Path) -> None:
    """The master defers its answers while agents re-register: the framework asks again
    (after 2 s, then less and less often) and still launches nothing."""
    async with restarted_runner(tmp_path) as (master, _):

        def asks() -> int:
            return [list(r.task_ids) for r in master.calls_of("reconcile")].count([RUNNING_TASK])

        await wait_for_condition(lambda: asks() == 1, what="the first question")
        master.send_offers(offer(1))
        await wait_for_condition(lambda: asks() == 2, timeout=10, what="the question again")
        assert master.calls_of("accept") == []
        master.send_update(status(RUNNING_TASK, TaskState.RUNNING))
        await wait_for_condition(lambda: master.calls_of("accept") != [], what="a launch")
        [accept] = master.calls_of("accept")
        assert [t.name for t in accept.tasks] == ["j[1]"]  # index 0 runs: room for one
