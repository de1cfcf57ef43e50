"""The pure core of the built-in workloads (mesolite/workloads/progress.py): what a job
and a service launch, count and give up on, by tables and by random runs."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesolite.model import TaskState
from mesolite.resources import Resources
from mesolite.workloads.progress import (
    JobProgress,
    ServiceProgress,
    Slot,
    SlotState,
    fit,
    new_progress,
    slot_environment,
)
from mesolite.workloads.spec import JobSpec, Restart, RestartPolicy, ServiceSpec

pytestmark = pytest.mark.unit

TASK = Resources(cpus=1, mem=100)


def job(completions: int = 5, parallelism: int = 2, retries: int = 1) -> JobProgress:
    progress = new_progress(JobSpec("j", "true", TASK, completions, parallelism, retries))
    assert isinstance(progress, JobProgress)
    return progress


def service(instances: int = 3, restart: Restart | None = None) -> ServiceProgress:
    progress = new_progress(ServiceSpec("s", "true", TASK, instances, restart or Restart()))
    assert isinstance(progress, ServiceProgress)
    return progress


def launch_all(progress: JobProgress | ServiceProgress, now: float = 0.0) -> list[str]:
    ids = []
    for slot in progress.launchable(now):
        task_id = f"t{slot.index}.{slot.launches}"
        progress.launched(slot, task_id)
        ids.append(task_id)
    return ids


def test_a_job_launches_at_most_parallelism_in_index_order() -> None:
    p = job(completions=5, parallelism=2)
    assert launch_all(p) == ["t0.0", "t1.0"]
    assert p.launchable(0) == []
    p.update("t0.0", TaskState.RUNNING, None, 1)
    assert p.launchable(0) == []
    p.update("t0.0", TaskState.FINISHED, 0, 2)
    assert [s.index for s in p.launchable(0)] == [2]


def test_a_failed_index_is_retried_then_given_up_after_retries_plus_one_tries() -> None:
    p = job(completions=1, parallelism=1, retries=2)
    for attempt in range(3):
        [task] = launch_all(p)
        assert slot_environment(p.spec, p.slots[0])["MESOLITE_JOB_ATTEMPT"] == str(attempt)
        p.update(task, TaskState.RUNNING, None, 1)
        p.update(task, TaskState.FAILED, 1, 2)
    assert p.slots[0].state is SlotState.FAILED
    assert p.slots[0].failures == 3 and p.slots[0].last_end == "TASK_FAILED exit 1"
    assert p.launchable(0) == [] and p.finished and not p.succeeded
    assert p.attempts_retried == 2


def test_a_retry_that_finishes_completes_the_index() -> None:
    p = job(completions=2, parallelism=2, retries=1)
    a, b = launch_all(p)
    p.update(a, TaskState.FAILED, 1, 1)
    p.update(b, TaskState.FINISHED, 0, 1)
    [again] = launch_all(p)
    p.update(again, TaskState.FINISHED, 0, 2)
    assert p.finished and p.succeeded and p.attempts_retried == 1


@pytest.mark.parametrize("end", [TaskState.LOST, TaskState.DROPPED, TaskState.GONE])
def test_a_task_lost_before_it_was_seen_alive_uses_no_retry(end: TaskState) -> None:
    p = job(completions=1, parallelism=1, retries=0)
    [task] = launch_all(p)
    p.update(task, TaskState.STAGING, None, 1)  # on its way: not seen alive yet
    p.update(task, end, None, 2)
    slot = p.slots[0]
    assert (slot.state, slot.failures) == (SlotState.PENDING, 0)
    [again] = launch_all(p)
    p.update(again, TaskState.RUNNING, None, 3)
    p.update(again, end, None, 4)  # lost after running: that was a try
    assert (slot.state, slot.failures) == (SlotState.FAILED, 1)


@pytest.mark.parametrize("end", [TaskState.KILLED, TaskState.ERROR, TaskState.FAILED])
def test_any_other_end_is_a_failed_try_even_before_running(end: TaskState) -> None:
    p = job(completions=1, parallelism=1, retries=0)
    [task] = launch_all(p)
    p.update(task, end, None, 1)
    assert p.slots[0].state is SlotState.FAILED


def test_updates_of_old_or_unknown_tasks_change_nothing() -> None:
    p = job(completions=1, parallelism=1, retries=1)
    [old] = launch_all(p)
    p.update(old, TaskState.FAILED, 1, 1)
    [new] = launch_all(p)
    version = p.version
    assert p.update(old, TaskState.FAILED, 1, 2) is None  # a repeat of the old end
    assert p.update("stranger", TaskState.RUNNING, None, 2) is None
    assert p.update(new, TaskState.STAGING, None, 2) is None
    assert p.version == version
    assert p.slots[0].state is SlotState.LAUNCHING and p.slots[0].task_id == new


def test_a_refused_launch_is_pending_again_without_a_try() -> None:
    p = job(completions=1, parallelism=1, retries=0)
    [task] = launch_all(p)
    assert p.not_launched(task) is p.slots[0]
    assert p.slots[0].state is SlotState.PENDING and p.slots[0].failures == 0
    assert p.not_launched(task) is None


def test_losing_the_framework_makes_live_slots_pending_without_a_try() -> None:
    p = job(completions=3, parallelism=3, retries=0)
    a, b, c = launch_all(p)
    p.update(a, TaskState.FINISHED, 0, 1)
    p.update(b, TaskState.RUNNING, None, 1)
    lost = p.lose_all()
    assert [s.index for s in lost] == [1, 2]
    assert [s.state for s in p.slots] == [SlotState.SUCCEEDED, SlotState.PENDING, SlotState.PENDING]
    assert p.update(c, TaskState.FAILED, 1, 2) is None  # the old task's end counts for nothing
    assert all(s.failures == 0 for s in p.slots)


def test_a_service_replaces_an_ended_instance_after_a_growing_back_off() -> None:
    p = service(instances=1, restart=Restart(backoff=1, factor=2, max_backoff=8))
    now = 100.0
    delays = []
    for _ in range(5):
        [task] = launch_all(p, now)
        p.update(task, TaskState.RUNNING, None, now)
        now += 0.5  # ends quickly: a crash loop
        p.update(task, TaskState.FAILED, 1, now)
        wakeup = p.next_wakeup(now)
        assert wakeup is not None and p.launchable(now) == []
        delays.append(wakeup - now)
        now = wakeup
    assert delays == [1, 2, 4, 8, 8]
    assert p.restarts == 5
    # An instance that ran max_backoff seconds resets the back-off.
    [task] = launch_all(p, now)
    p.update(task, TaskState.RUNNING, None, now)
    p.update(task, TaskState.KILLED, None, now + 8)
    assert p.next_wakeup(now + 8) == now + 8 + 1


def test_on_failure_a_service_instance_that_exits_0_is_done() -> None:
    p = service(instances=2, restart=Restart(policy=RestartPolicy.ON_FAILURE, backoff=0))
    a, b = launch_all(p)
    p.update(a, TaskState.FINISHED, 0, 1)
    p.update(b, TaskState.FAILED, 2, 1)
    assert [s.state for s in p.slots] == [SlotState.EXITED, SlotState.PENDING]
    assert [s.index for s in p.launchable(1)] == [1] and not p.finished


def test_stored_slots_come_back_as_they_were() -> None:
    p = service(instances=2)
    launch_all(p)
    p.update("t0.0", TaskState.RUNNING, None, 5)
    again = new_progress(
        p.spec, [Slot(**{f: getattr(s, f) for f in Slot.__slots__}) for s in p.slots], p.counters()
    )
    assert again.live_task_ids() == ["t0.0", "t1.0"]
    assert again.launchable(10) == []
    assert again.update("t1.0", TaskState.FAILED, 1, 6) is again.slots[1]
    with pytest.raises(ValueError, match="expected slots 0 to 1"):
        new_progress(p.spec, p.slots[:1])


def test_fit() -> None:
    assert fit(Resources(cpus=3.5, mem=1000), TASK, 10) == 3
    assert fit(Resources(cpus=3.5, mem=150), TASK, 10) == 1
    assert fit(Resources(cpus=8, mem=8000), TASK, 2) == 2
    assert fit(Resources(mem=8000), TASK, 2) == 0


# Random runs --------------------------------------------------------------------

ENDS = [TaskState.FINISHED, TaskState.FAILED, TaskState.KILLED, TaskState.LOST, TaskState.ERROR]
LIVE = [TaskState.STAGING, TaskState.STARTING, TaskState.RUNNING]


@settings(max_examples=300, deadline=None)
@given(
    completions=st.integers(1, 8),
    parallelism=st.integers(1, 4),
    retries=st.integers(0, 3),
    steps=st.lists(
        st.tuples(st.integers(0, 100), st.sampled_from([*ENDS, *LIVE, None])), max_size=120
    ),
)
def test_a_job_never_exceeds_parallelism_nor_its_retries(
    completions: int,
    parallelism: int,
    retries: int,
    steps: list[tuple[int, TaskState | None]],
) -> None:
    """Random launches, updates (repeats and strangers included) and refusals: never
    more than `parallelism` live; an index runs at most retries + 1 counted tries; a
    done index never runs again; a job whose every index is done is finished."""
    p = job(completions, parallelism, retries)
    tries: Counter[int] = Counter()
    every: list[str] = []
    done: dict[int, SlotState] = {}
    for pick, state in steps:
        launch_all(p)
        every.extend(t for t in p.live_task_ids() if t not in every)
        live = p.live_task_ids()
        assert len(live) <= parallelism
        if not every:
            continue
        task_id = every[pick % len(every)]
        slot = next((s for s in p.slots if s.task_id == task_id), None)
        before = slot.state if slot else None
        if state is None:
            p.not_launched(task_id)
        else:
            changed = p.update(task_id, state, None, float(pick))
            if (
                changed is not None
                and state.is_terminal
                and not (before is SlotState.LAUNCHING and state in (TaskState.LOST,))
            ):
                tries[changed.index] += 1
        for s in p.slots:
            if s.index in done:
                assert s.state is done[s.index], "a done index changed"
            elif s.state.done:
                done[s.index] = s.state
            assert s.failures <= retries + 1
            assert tries[s.index] <= retries + 1
        assert p.finished == (len(done) == completions)
        # What the progress keeps as it goes is what its slots say.
        for kind in SlotState:
            assert p.count(kind) == sum(s.state is kind for s in p.slots)
        assert p.live_task_ids() == [s.task_id for s in p.slots if s.state.live]
        pending = [s for s in p.slots if s.state is SlotState.PENDING]
        room = parallelism - sum(s.state.live for s in p.slots)
        assert p.launchable(0) == pending[: max(room, 0)]
