"""Sandboxes of ended tasks are removed after the gc delay, sooner as the disk fills,
never while their task is live: the policy on plain data (`agent/gc_policy.py`), the
passes on real directories (`agent/_sandbox_gc.py`), and a real agent."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesolite.agent import GcConfig
from mesolite.agent._sandbox_gc import TRASH_DIR, SandboxGc, scan
from mesolite.agent.gc_policy import WEEK, EndedSandbox, allowed_age, plan
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.v1.common_pb2 import TASK_FINISHED, TaskInfo
from tests.cluster import LocalCluster
from tests.raw_client import Call, RawFramework, resources
from tests.recording import RecordingFramework, running
from tests.support.checkpoints import checkpoint_at
from tests.waiting import wait_for_condition

DAY = 86400.0
CONFIG = GcConfig(delay=WEEK, disk_watermark=0.9, interval=60.0)


# The policy, on plain data ----------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("usage", "age"),
    [
        (0.0, WEEK),  # an empty disk: the whole delay
        (0.45, WEEK / 2),  # half way to the watermark: half of it
        (0.81, WEEK / 10),
        (0.9, 0.0),  # at the watermark: no age at all
        (0.99, 0.0),
        (1.5, 0.0),  # nonsense in, still no age
        (-0.2, WEEK),
    ],
)
def test_the_allowed_age_shrinks_as_the_disk_fills(usage: float, age: float) -> None:
    assert allowed_age(CONFIG, usage) == pytest.approx(age)


@pytest.mark.unit
def test_a_pass_removes_the_old_and_keeps_the_live_and_the_young() -> None:
    now = 100 * DAY
    sandboxes = [
        EndedSandbox(("f", "old"), now - 8 * DAY),
        EndedSandbox(("f", "older"), now - 9 * DAY),
        EndedSandbox(("f", "live-and-old"), now - 30 * DAY),
        EndedSandbox(("f", "young"), now - 2 * DAY),
        EndedSandbox(("f", "exactly-due"), now - WEEK),
        EndedSandbox(("f", "from-the-future"), now + DAY),  # a clock that went back
    ]
    decided = plan(sandboxes, {("f", "live-and-old")}, now, 0.0, CONFIG)
    assert [s.key[1] for s in decided.remove] == ["older", "old", "exactly-due"]  # oldest first
    assert decided.allowed_age == WEEK
    assert decided.next_pass == CONFIG.interval  # the young one is days away

    # The disk fills to 72%: the allowed age is a fifth of a week, 1.4 days.
    decided = plan(sandboxes, {("f", "live-and-old")}, now, 0.72, CONFIG)
    assert {s.key[1] for s in decided.remove} == {"older", "old", "exactly-due", "young"}
    # At the watermark everything goes at once, but the live task's sandbox.
    decided = plan(sandboxes, {("f", "live-and-old")}, now, 0.9, CONFIG)
    assert {s.key[1] for s in decided.remove} == {s.key[1] for s in sandboxes} - {"live-and-old"}


@pytest.mark.unit
def test_the_next_pass_comes_when_the_next_sandbox_is_due() -> None:
    config = GcConfig(delay=10.0, disk_watermark=0.9, interval=60.0)
    decided = plan([EndedSandbox(("f", "t"), 997.0)], set(), 1000.0, 0.0, config)
    assert decided.remove == () and decided.next_pass == pytest.approx(7.0)


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(
    ages=st.lists(st.floats(-DAY, 30 * DAY), max_size=30),
    live=st.sets(st.integers(0, 29)),
    usage=st.floats(0.0, 1.0),
    delay=st.floats(0.0, 30 * DAY),
    watermark=st.floats(0.05, 1.0),
)
def test_a_pass_never_removes_a_live_sandbox_and_removes_exactly_the_due_ones(
    ages: list[float], live: set[int], usage: float, delay: float, watermark: float
) -> None:
    config = GcConfig(delay=delay, disk_watermark=watermark, interval=60.0)
    now = 1e9
    sandboxes = [EndedSandbox(("f", str(i)), now - age) for i, age in enumerate(ages)]
    live_keys = {("f", str(i)) for i in live}
    decided = plan(sandboxes, live_keys, now, usage, config)
    removed = {s.key for s in decided.remove}
    limit = allowed_age(config, usage)
    assert not removed & live_keys
    for s in sandboxes:
        due = max(now - s.written_at, 0) >= limit and s.key not in live_keys
        assert (s.key in removed) == due
    assert 0 < decided.next_pass <= config.interval or not sandboxes


@pytest.mark.unit
def test_a_config_out_of_range_is_refused() -> None:
    bad: list[dict[str, float]] = [
        {"delay": -1.0},
        {"delay": float("nan")},
        {"disk_watermark": 0.0},
        {"disk_watermark": 1.5},
        {"interval": 0.0},
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            GcConfig(**fields)


# The passes, on real directories ------------------------------------------------------


def make_task_dirs(work_dir: Path, framework_id: str, task_id: str, written_at: float) -> Path:
    """A task's sandbox (with output) and records, last written at `written_at`."""
    sandbox = work_dir / "sandboxes" / framework_id / task_id
    records = work_dir / "meta" / framework_id / task_id
    (sandbox / "out").mkdir(parents=True)
    (sandbox / "stdout").write_text("hello\n")
    records.mkdir(parents=True)
    (records / "task.json").write_text("{}")
    os.utime(sandbox, (written_at, written_at))
    os.utime(records / "task.json", (written_at, written_at))
    return sandbox


@pytest.mark.unit
async def test_passes_remove_due_sandboxes_with_their_records(tmp_path: Path) -> None:
    now = 1_000_000.0
    make_task_dirs(tmp_path, "f1", "old", now - 8 * DAY)
    make_task_dirs(tmp_path, "f1", "running", now - 20 * DAY)
    make_task_dirs(tmp_path, "f1", "young", now - DAY)
    make_task_dirs(tmp_path, "f2", "old", now - 9 * DAY)
    os.chmod(tmp_path / "sandboxes" / "f2" / "old" / "out", 0o500)  # a task left it read-only
    assert {(s.key, s.written_at) for s in scan(tmp_path)} >= {(("f1", "old"), now - 8 * DAY)}
    live = {("f1", "running")}
    usage = [0.0]
    gc = SandboxGc(tmp_path, CONFIG, lambda: live, disk_usage=lambda _: usage[0], clock=lambda: now)

    decided = await gc.collect()
    assert {s.key for s in decided.remove} == {("f1", "old"), ("f2", "old")}
    left = {(p.parent.name, p.name) for p in (tmp_path / "sandboxes").glob("*/*")}
    assert left == {("f1", "running"), ("f1", "young")}
    assert {(p.parent.name, p.name) for p in (tmp_path / "meta").glob("*/*")} == left
    assert not (tmp_path / "sandboxes" / "f2").exists()  # its framework's directory too
    assert list((tmp_path / TRASH_DIR).iterdir()) == []

    usage[0] = 0.95  # the disk fills: the young one goes, the running one stays
    decided = await gc.collect()
    assert [s.key for s in decided.remove] == [("f1", "young")]
    assert [p.name for p in (tmp_path / "sandboxes" / "f1").iterdir()] == ["running"]
    assert gc.removed == 3


@pytest.mark.unit
async def test_a_task_launched_again_since_the_scan_keeps_its_sandbox(tmp_path: Path) -> None:
    """The liveness check is made again, on the loop, right before the removal."""
    now = 1_000_000.0
    make_task_dirs(tmp_path, "f", "again", now - 30 * DAY)
    calls = 0

    def live() -> set[tuple[str, str]]:
        nonlocal calls
        calls += 1
        return set() if calls == 1 else {("f", "again")}  # launched between scan and removal

    gc = SandboxGc(tmp_path, CONFIG, live, disk_usage=lambda _: 0.0, clock=lambda: now)
    await gc.collect()
    assert (tmp_path / "sandboxes" / "f" / "again" / "stdout").exists()


@pytest.mark.unit
async def test_ages_come_from_the_disk_so_a_restarted_agent_goes_on(tmp_path: Path) -> None:
    now = 1_000_000.0
    make_task_dirs(tmp_path, "f", "t", now - 5 * DAY)
    first = SandboxGc(tmp_path, CONFIG, set, disk_usage=lambda _: 0.0, clock=lambda: now)
    assert (await first.collect()).remove == ()
    # The agent restarts three days later; nothing was kept in memory.
    later = SandboxGc(tmp_path, CONFIG, set, disk_usage=lambda _: 0.0, clock=lambda: now + 3 * DAY)
    assert [s.key for s in (await later.collect()).remove] == [("f", "t")]
    assert not (tmp_path / "sandboxes" / "f" / "t").exists()


# A real agent --------------------------------------------------------------------------


async def test_a_real_agent_removes_an_ended_tasks_sandbox_and_keeps_a_running_ones(
    tmp_path: Path,
) -> None:
    gc = GcConfig(delay=1.0, disk_watermark=1.0, interval=0.2)
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:512", gc=gc)
        fw = RecordingFramework("gc")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            small = Resources(cpus=0.5, mem=32)
            tasks = [TaskSpec("quick", "echo done", small), TaskSpec("long", "sleep 60", small)]
            await fw.launch(offer, tasks)
            await fw.wait_state("quick", TaskState.FINISHED)
            await fw.wait_state("long", TaskState.RUNNING)
            assert fw.framework_id is not None
            quick = agent.sandbox_path(fw.framework_id, "quick")
            long = agent.sandbox_path(fw.framework_id, "long")
            records = agent.records_path(fw.framework_id, "quick")

            await wait_for_condition(
                lambda: not quick.exists() and not records.exists(),
                timeout=30,
                what="the ended task's sandbox and records to be removed",
            )
            assert (long / "stdout").exists()  # live: kept, though older than the delay


async def test_a_task_whose_end_is_not_acknowledged_keeps_its_sandbox(tmp_path: Path) -> None:
    """Its end must still reach the framework (a restarted agent reports it from its
    records): older than one that goes, it stays."""
    gc = GcConfig(delay=1.0, disk_watermark=1.0, interval=0.2)
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:512", gc=gc)
        async with RawFramework(cluster.address, name="forgetful") as fw:

            def launch(task_id: str, offer_id: str) -> None:
                task = TaskInfo(task_id=task_id, command="true", resources=resources(cpus=0.5))
                fw.send(Call(accept=Call.Accept(offer_ids=[offer_id], tasks=[task])))

            def ended(task_id: str) -> bool:
                records = agent.records_path(fw.framework_id, task_id)
                with contextlib.suppress(OSError, ValueError):
                    return str(checkpoint_at(records)["state"]) == "TASK_FINISHED"
                return False

            offer = (await fw.next_event("offers")).offers.offers[0]
            launch("unacked", offer.offer_id)
            await wait_for_condition(lambda: ended("unacked"), what="the first task to end")
            offer = (await fw.next_event("offers")).offers.offers[0]
            launch("acked", offer.offer_id)
            acked = agent.sandbox_path(fw.framework_id, "acked")
            while True:  # acknowledge the second task's updates only
                status = (await fw.next_event("update")).update.status
                if status.task_id == "acked":
                    fw.acknowledge(status)
                    if status.state == TASK_FINISHED:
                        break
            await wait_for_condition(
                lambda: not acked.exists(), timeout=30, what="the acknowledged task's sandbox to go"
            )
            assert (agent.sandbox_path(fw.framework_id, "unacked") / "stdout").exists()
            assert ended("unacked")
