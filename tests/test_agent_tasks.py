"""The task runner against real subprocesses."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mesolite.agent.tasks import TaskRunner, TaskTransition
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.checkpoints import checkpoint_at
from tests.support.exits import exit_record
from tests.waiting import wait_for_condition

FW = "fw-1"
GRACE = 0.3


class Recorder:
    def __init__(self) -> None:
        self.transitions: list[TaskTransition] = []

    def __call__(self, transition: TaskTransition) -> None:
        self.transitions.append(transition)

    def states(self, task_id: str) -> list[TaskState]:
        return [t.state for t in self.transitions if t.task_id == task_id]

    def final(self, task_id: str) -> TaskTransition | None:
        ended = [t for t in self.transitions if t.task_id == task_id and t.state.is_terminal]
        return ended[-1] if ended else None

    async def wait_state(self, task_id: str, state: TaskState) -> None:
        await wait_for_condition(
            lambda: state in self.states(task_id), timeout=10, what=f"{task_id} {state.value}"
        )

    async def wait_final(self, task_id: str) -> TaskTransition:
        await wait_for_condition(
            lambda: self.final(task_id) is not None, timeout=10, what=f"{task_id} to end"
        )
        final = self.final(task_id)
        assert final is not None
        return final


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def runner(tmp_path: Path, recorder: Recorder) -> AsyncIterator[TaskRunner]:
    runner = TaskRunner(tmp_path, recorder, kill_grace_period=GRACE)
    yield runner
    await runner.shutdown()


def task(task_id: str, command: str, **environment: str) -> TaskSpec:
    return TaskSpec(
        task_id=task_id,
        command=command,
        resources=Resources(cpus=0.5, mem=32),
        environment=environment,
    )


def checkpoint(runner: TaskRunner, task_id: str) -> dict[str, object]:
    return checkpoint_at(runner.records_path(FW, task_id))


def group_alive(pgid: int) -> bool:
    """True while a live (not zombie) process is in process group `pgid`."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            return True
    return False


async def test_finished_task_captures_output_and_checkpoint(
    runner: TaskRunner, recorder: Recorder
) -> None:
    assert runner.launch(FW, task("t1", "echo hello; echo oops >&2"))
    final = await recorder.wait_final("t1")

    assert recorder.states("t1") == [TaskState.STARTING, TaskState.RUNNING, TaskState.FINISHED]
    assert final.exit_code == 0
    sandbox = runner.sandbox_path(FW, "t1")
    assert (sandbox / "stdout").read_text() == "hello\n"
    assert (sandbox / "stderr").read_text() == "oops\n"
    # Checkpointed once the end is reported (and, in the agent, journaled).
    await wait_for_condition(lambda: "exit_code" in checkpoint(runner, "t1"), what="the end")
    record = checkpoint(runner, "t1")
    assert record["framework_id"] == FW
    assert record["state"] == "TASK_FINISHED"
    assert record["exit_code"] == 0
    assert isinstance(record["pid"], int)
    assert record["task"] == {
        "task_id": "t1",
        "name": "",
        "command": "echo hello; echo oops >&2",
        "resources": {"cpus": 0.5, "mem": 32.0},
        "agent_id": "",
        "environment": {},
    }
    assert runner.running_tasks() == []


async def test_nonzero_exit_fails_with_exit_code(runner: TaskRunner, recorder: Recorder) -> None:
    runner.launch(FW, task("t1", "exit 3"))
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.FAILED
    assert final.exit_code == 3


async def test_unknown_command_fails(runner: TaskRunner, recorder: Recorder) -> None:
    runner.launch(FW, task("t1", "no-such-command-mesolite-test"))
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.FAILED
    assert final.exit_code == 127
    assert "not found" in (runner.sandbox_path(FW, "t1") / "stderr").read_text()


async def test_command_that_cannot_start_fails_with_message(
    tmp_path: Path, recorder: Recorder
) -> None:
    runner = TaskRunner(tmp_path, recorder, shell="/nonexistent/sh")
    runner.launch(FW, task("t1", "true"))
    final = await recorder.wait_final("t1")
    assert recorder.states("t1") == [TaskState.STARTING, TaskState.FAILED]
    assert "could not start" in final.message
    assert final.exit_code is None


async def test_task_environment_and_working_directory(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch(FW, task("t1", 'echo "$MESOLITE_TASK_ID $FOO"; pwd', FOO="bar"))
    await recorder.wait_final("t1")
    sandbox = runner.sandbox_path(FW, "t1")
    assert (sandbox / "stdout").read_text().splitlines() == ["t1 bar", str(sandbox)]


async def test_kill_sends_sigterm(runner: TaskRunner, recorder: Recorder) -> None:
    runner.launch(FW, task("t1", "sleep 30"))
    await recorder.wait_state("t1", TaskState.RUNNING)
    assert [t.task.task_id for t in runner.running_tasks()] == ["t1"]

    runner.kill(FW, "t1")
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.KILLED
    assert "SIGTERM" in final.message
    assert final.exit_code == 143
    assert runner.running_tasks() == []


async def test_kill_escalates_to_sigkill_after_grace(
    runner: TaskRunner, recorder: Recorder
) -> None:
    # The ignored TERM is inherited by `sleep`, so only SIGKILL ends the group.
    runner.launch(FW, task("t1", "trap '' TERM; echo ready; sleep 30"))
    stdout = runner.sandbox_path(FW, "t1") / "stdout"
    await wait_for_condition(lambda: stdout.exists() and "ready" in stdout.read_text())
    await wait_for_condition(
        lambda: checkpoint(runner, "t1")["state"] == "TASK_RUNNING", what="the checkpoint"
    )
    pid = checkpoint(runner, "t1")["pid"]
    assert isinstance(pid, int)

    runner.kill(FW, "t1")
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.KILLED
    assert "SIGKILL" in final.message
    assert final.exit_code == 137
    await wait_for_condition(lambda: not group_alive(pid), what="the process group to die")


async def test_processes_left_behind_die_with_the_task(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch(FW, task("t1", "sleep 30 &"))
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.FINISHED
    pid = checkpoint(runner, "t1")["pid"]
    assert isinstance(pid, int)
    await wait_for_condition(lambda: not group_alive(pid), what="the background child to die")


async def test_duplicate_launch_is_ignored(runner: TaskRunner, recorder: Recorder) -> None:
    assert runner.launch(FW, task("t1", "sleep 30"))
    await recorder.wait_state("t1", TaskState.RUNNING)
    assert not runner.launch(FW, task("t1", "echo other"))
    assert recorder.states("t1") == [TaskState.STARTING, TaskState.RUNNING]
    assert len(runner.running_tasks()) == 1


async def test_kill_of_unknown_task_is_a_noop(runner: TaskRunner, recorder: Recorder) -> None:
    runner.kill(FW, "nope")
    assert recorder.transitions == []


async def test_kill_while_starting_reports_killed(runner: TaskRunner, recorder: Recorder) -> None:
    runner.launch(FW, task("t1", "sleep 30"))
    runner.kill(FW, "t1")
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.KILLED
    assert recorder.states("t1")[0] is TaskState.STARTING


async def test_invalid_task_id_fails_without_a_sandbox(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    assert not runner.launch(FW, task("../escape", "true"))
    assert recorder.states("../escape") == [TaskState.FAILED]
    assert not (tmp_path / "sandboxes" / "escape").exists()


async def test_shutdown_kills_every_task(runner: TaskRunner, recorder: Recorder) -> None:
    for task_id in ("t1", "t2"):
        runner.launch(FW, task(task_id, "sleep 30"))
        await recorder.wait_state(task_id, TaskState.RUNNING)

    await runner.shutdown()
    assert runner.running_tasks() == []
    for task_id in ("t1", "t2"):
        final = recorder.final(task_id)
        assert final is not None and final.state is TaskState.KILLED


async def test_a_task_id_can_run_again_after_it_ended(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch(FW, task("t1", "exit 1"))
    first = await recorder.wait_final("t1")
    records = runner.records_path(FW, "t1")
    first_end = exit_record(records)
    assert first_end is not None and first_end["exit_code"] == 1

    runner.launch(FW, task("t1", "sleep 30"))
    await wait_for_condition(
        lambda: recorder.states("t1").count(TaskState.RUNNING) == 2, what="the second run"
    )
    # The first run's status is gone: a restarted agent must not take it for this run's.
    assert exit_record(records) is None
    record = checkpoint(runner, "t1")
    assert record["state"] == "TASK_RUNNING"
    assert record["run_id"] != first.run_id


async def test_a_sandbox_is_last_written_as_its_task_ends(
    runner: TaskRunner, recorder: Recorder
) -> None:
    """Its garbage collection counts its age from then (`agent/gc_policy.py`), also when
    the task wrote nothing into it after it started."""
    runner.launch(FW, task("t1", "sleep 0.6"))
    await recorder.wait_state("t1", TaskState.RUNNING)
    running_at = time.time()
    await recorder.wait_final("t1")
    assert runner.sandbox_path(FW, "t1").stat().st_mtime > running_at + 0.3


async def test_transitions_are_counted_for_one_activity_line(
    runner: TaskRunner, recorder: Recorder
) -> None:
    for task_id, command in (("a", "exit 0"), ("b", "exit 0"), ("c", "exit 2")):
        runner.launch(FW, task(task_id, command))
    for task_id in "abc":
        await recorder.wait_final(task_id)
    assert runner.take_activity() == {
        "tasks_starting": 3,
        "tasks_running": 3,
        "tasks_finished": 2,
        "tasks_failed": 1,
    }
    assert runner.take_activity() == {}  # counted again from nothing
