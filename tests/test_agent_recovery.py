"""The task runner finding tasks again after an agent restart: sandboxes laid out on
disk as a killed agent leaves them, with real wrapper processes where a task lives on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from mesolite import convert
from mesolite.agent import _task_wrapper
from mesolite.agent._checkpoint import AGENT_FILE
from mesolite.agent._journal import JOURNAL_FILE, PendingUpdate, UpdateJournal
from mesolite.agent._procs import process_start_time
from mesolite.agent._task_log import read_checkpoints
from mesolite.agent.tasks import WRAPPER_FILE, TaskRunner, TaskTransition
from mesolite.model import RunningTask, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from tests.test_agent_gateway import FakeMaster, fake_master_server, make_agent
from tests.test_agent_gateway import task as gateway_task
from tests.test_agent_tasks import Recorder
from tests.waiting import wait_for_condition, within

FW = "fw-1"
GRACE = 0.3
WRAPPER = str(Path(_task_wrapper.__file__).absolute())


def spec(task_id: str) -> TaskSpec:
    return TaskSpec(task_id, f"run {task_id}", Resources(cpus=0.5, mem=32))


def lay_out(
    work_dir: Path,
    task_id: str,
    *,
    pid: int | None,
    start_time: int | None = None,
    state: str = "TASK_RUNNING",
    killing: bool = False,
    run_id: str = "run-1",
    exit_record: dict[str, Any] | None = None,
) -> Path:
    """A sandbox as an agent killed with SIGKILL leaves it."""
    sandbox = work_dir / "sandboxes" / FW / task_id
    sandbox.mkdir(parents=True, exist_ok=True)
    task = spec(task_id)
    record = {
        "framework_id": FW,
        "task": {
            "task_id": task_id,
            "name": "",
            "command": task.command,
            "resources": task.resources.to_dict(),
            "agent_id": "",
            "environment": {},
        },
        "run_id": run_id,
        "pid": pid,
        "pid_start_time": start_time,
        "started": 1.0,
        "state": state,
        "killing": killing,
    }
    (sandbox / "task.json").write_text(json.dumps(record))
    if exit_record is not None:
        (sandbox / "exit.json").write_text(json.dumps(exit_record))
    return sandbox


def gone_pid() -> tuple[int, int]:
    """A pid and start time naming no live process: this test's own pid, whose start
    time does not match, as after pid reuse. (So nothing real can be signalled.)"""
    start_time = process_start_time(os.getpid())
    assert start_time is not None
    return os.getpid(), start_time + 1


def checkpoint(sandbox: Path) -> dict[str, Any]:
    """The task's checkpoint: in the task log, where recovery moves the one laid out
    (before recovery, that one)."""
    logged = read_checkpoints(sandbox.parent.parent.parent)
    record = logged.get((sandbox.parent.name, sandbox.name))
    if record is None:
        assert (sandbox / "task.json").exists()
        record = json.loads((sandbox / "task.json").read_text())
    return record


async def wait_checkpointed(sandbox: Path, state: str) -> dict[str, Any]:
    """The checkpoint once it says `state`: it follows the reported transition."""
    await wait_for_condition(lambda: checkpoint(sandbox)["state"] == state, what=state)
    return checkpoint(sandbox)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def runner(tmp_path: Path, recorder: Recorder) -> AsyncIterator[TaskRunner]:
    runner = TaskRunner(tmp_path, recorder, kill_grace_period=GRACE)
    yield runner
    await runner.shutdown()


StartWrapper = Callable[[str, str], Awaitable[Path]]


@pytest.fixture
async def live_task(tmp_path: Path) -> AsyncIterator[StartWrapper]:
    """Starts a real wrapper for a task, as a previous agent did, and checkpoints it."""
    processes: list[asyncio.subprocess.Process] = []

    async def start(task_id: str, command: str) -> Path:
        sandbox = lay_out(tmp_path, task_id, pid=None)
        read, write = os.pipe()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            WRAPPER,
            str(sandbox),
            "--ready-fd",
            str(write),
            "--",
            "/bin/sh",
            "-c",
            command,
            cwd=sandbox,
            start_new_session=True,
            pass_fds=(write,),
        )
        os.close(write)
        processes.append(process)
        assert await asyncio.to_thread(os.read, read, 64)  # the command runs
        os.close(read)
        lay_out(tmp_path, task_id, pid=process.pid, start_time=process_start_time(process.pid))
        return sandbox

    yield start
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def test_task_that_ended_while_the_agent_was_down_reports_its_exit_code(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    pid, start_time = gone_pid()
    sandbox = lay_out(tmp_path, "t1", pid=pid, start_time=start_time, exit_record={"exit_code": 3})

    await runner.recover({})
    final = await recorder.wait_final("t1")

    assert recorder.states("t1") == [TaskState.FAILED]
    assert (final.exit_code, final.message, final.run_id) == (
        3,
        "command exited with status 3",
        "run-1",
    )
    record = await wait_checkpointed(sandbox, "TASK_FAILED")
    assert record["exit_code"] == 3
    # Until its end is acknowledged, the master is told about it on registration.
    assert runner.ended_tasks() == [RunningTask(FW, spec("t1"), TaskState.FAILED)]
    runner.acknowledged_end(FW, "t1", "another-run")
    assert runner.ended_tasks() != []
    runner.acknowledged_end(FW, "t1", "run-1")
    assert runner.ended_tasks() == []


@pytest.mark.parametrize(
    ("exit_record", "killing", "state", "exit_code", "message"),
    [
        ({"exit_code": 0}, False, TaskState.FINISHED, 0, "command exited with status 0"),
        ({"signal": 9}, False, TaskState.FAILED, 137, "command terminated by SIGKILL"),
        (
            {"signal": 15},
            True,
            TaskState.KILLED,
            143,
            "killed on request: command terminated by SIGTERM",
        ),
        (
            None,
            False,
            TaskState.FAILED,
            None,
            "the task's wrapper died while the agent was down",
        ),
        (
            None,
            True,
            TaskState.KILLED,
            None,
            "killed on request: the task's wrapper died while the agent was down",
        ),
        (
            {"error": "no such file"},
            False,
            TaskState.FAILED,
            None,
            "could not start the command: no such file",
        ),
    ],
)
async def test_how_a_task_ended_while_the_agent_was_down(
    runner: TaskRunner,
    recorder: Recorder,
    tmp_path: Path,
    exit_record: dict[str, Any] | None,
    killing: bool,
    state: TaskState,
    exit_code: int | None,
    message: str,
) -> None:
    pid, start_time = gone_pid()
    lay_out(
        tmp_path, "t1", pid=pid, start_time=start_time, killing=killing, exit_record=exit_record
    )
    await runner.recover({})
    final = await recorder.wait_final("t1")
    assert (final.state, final.exit_code, final.message) == (state, exit_code, message)
    assert recorder.states("t1") == [state]


async def test_task_whose_wrapper_never_started_is_lost(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    """The agent died before starting the wrapper: the command never ran. Not
    FAILED (nothing failed), but LOST (Mesos: DROPPED, LOST for frameworks that
    are not partition-aware): the framework may launch it again."""
    lay_out(tmp_path, "t1", pid=None, state="TASK_STARTING")
    await runner.recover({})
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.LOST
    assert final.message == "the agent stopped before the task could start"
    assert runner.ended_tasks() == [RunningTask(FW, spec("t1"), TaskState.LOST)]


async def test_a_wrapper_that_has_not_recorded_its_pid_yet_is_found(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper, tmp_path: Path
) -> None:
    """The agent died after starting the wrapper and before anyone recorded its pid
    (the wrapper, slow to start on a loaded machine, had not written wrapper.json
    yet): the restarted agent finds the wrapper by its command line, not LOST."""
    sandbox = await live_task("t1", "sleep 30")
    pid = checkpoint(sandbox)["pid"]
    (sandbox / WRAPPER_FILE).unlink()
    lay_out(tmp_path, "t1", pid=None, state="TASK_STARTING")
    await runner.recover({})
    await recorder.wait_state("t1", TaskState.RUNNING)
    assert runner.running_tasks() == [RunningTask(FW, spec("t1"), TaskState.RUNNING)]
    assert checkpoint(sandbox)["pid"] == pid
    runner.kill(FW, "t1")
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.KILLED
    assert process_start_time(pid) is None


async def test_an_older_agents_checkpoints_move_into_the_task_log_once(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    """Its `task.json` files (here in the sandbox, its oldest layout) are read, written
    to the task log and removed: a restarted agent after it reads only the log, and
    does not report the end a second time."""
    pid, start_time = gone_pid()
    sandbox = lay_out(tmp_path, "t1", pid=pid, start_time=start_time, exit_record={"exit_code": 3})
    await runner.recover({})
    assert (await recorder.wait_final("t1")).exit_code == 3
    await wait_for_condition(
        lambda: read_checkpoints(tmp_path).get((FW, "t1"), {}).get("state") == "TASK_FAILED",
        what="the end in the task log",
    )
    assert not (sandbox / "task.json").exists()
    assert read_checkpoints(tmp_path)[(FW, "t1")]["records"] == str(sandbox)

    again = Recorder()
    restarted = TaskRunner(tmp_path, again)
    try:
        await restarted.recover({})
        assert again.transitions == [] and restarted.running_tasks() == []
    finally:
        await restarted.shutdown()


async def test_an_end_already_journaled_is_not_reported_again(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    # The agent journaled the end, then died before checkpointing it.
    pid, start_time = gone_pid()
    sandbox = lay_out(tmp_path, "t1", pid=pid, start_time=start_time, exit_record={"exit_code": 3})
    end = TaskTransition(FW, "t1", TaskState.FAILED, "command exited with status 3", 3, "run-1")

    await runner.recover({(FW, "t1"): end})

    assert recorder.transitions == []
    assert runner.running_tasks() == []
    assert runner.ended_tasks() == [RunningTask(FW, spec("t1"), TaskState.FAILED)]
    record = checkpoint(sandbox)
    assert (record["state"], record["exit_code"]) == ("TASK_FAILED", 3)


async def test_an_end_journaled_for_an_earlier_run_does_not_count(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    pid, start_time = gone_pid()
    lay_out(tmp_path, "t1", pid=pid, start_time=start_time, exit_record={"exit_code": 0})
    earlier = TaskTransition(FW, "t1", TaskState.FAILED, "", 1, "run-0")
    await runner.recover({(FW, "t1"): earlier})
    final = await recorder.wait_final("t1")
    assert final.state is TaskState.FINISHED and final.run_id == "run-1"


async def test_ended_tasks_stay_quiet(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    lay_out(tmp_path, "done", pid=1234, state="TASK_FINISHED")  # acknowledged long ago
    (tmp_path / "sandboxes" / FW / "broken").mkdir()
    (tmp_path / "sandboxes" / FW / "broken" / "task.json").write_text("{not json")
    lay_out(tmp_path, "odd", pid=None)
    (tmp_path / "sandboxes" / FW / "odd" / "task.json").write_text('{"framework_id": 7}')

    await runner.recover({})
    assert runner.running_tasks() == []
    assert runner.ended_tasks() == []
    assert recorder.transitions == []


async def test_a_live_task_is_reattached_and_its_end_is_seen(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper
) -> None:
    sandbox = await live_task("t1", "while [ ! -e go ]; do sleep 0.02; done; exit 4")

    await runner.recover({})
    assert runner.running_tasks() == [RunningTask(FW, spec("t1"), TaskState.RUNNING)]
    assert runner.is_active(FW, "t1")

    (sandbox / "go").touch()
    final = await recorder.wait_final("t1")
    assert (final.state, final.exit_code) == (TaskState.FAILED, 4)
    assert recorder.states("t1") == [TaskState.FAILED]  # no second RUNNING
    await wait_checkpointed(sandbox, "TASK_FAILED")


async def test_a_live_task_caught_starting_is_reported_running(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper, tmp_path: Path
) -> None:
    # The agent died after checkpointing the wrapper's pid, before TASK_RUNNING.
    sandbox = await live_task("t1", "sleep 30")
    record = checkpoint(sandbox)
    lay_out(
        tmp_path,
        "t1",
        pid=record["pid"],
        start_time=record["pid_start_time"],
        state="TASK_STARTING",
    )
    await runner.recover({})
    await recorder.wait_state("t1", TaskState.RUNNING)
    assert runner.running_tasks() == [RunningTask(FW, spec("t1"), TaskState.RUNNING)]
    assert checkpoint(sandbox)["state"] == "TASK_RUNNING"


async def test_a_reattached_task_can_be_killed(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper
) -> None:
    sandbox = await live_task("t1", "sleep 30")
    pid = checkpoint(sandbox)["pid"]
    await runner.recover({})

    runner.kill(FW, "t1")
    final = await recorder.wait_final("t1")
    assert (final.state, final.exit_code) == (TaskState.KILLED, 143)
    assert "SIGTERM" in final.message
    assert process_start_time(pid) is None


async def test_a_kill_under_way_is_resumed_up_to_sigkill(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper, tmp_path: Path
) -> None:
    sandbox = await live_task("t1", "trap '' TERM; echo ready > ready; sleep 30")
    await wait_for_condition(lambda: (sandbox / "ready").exists(), what="the trap to be set")
    record = checkpoint(sandbox)
    lay_out(tmp_path, "t1", pid=record["pid"], start_time=record["pid_start_time"], killing=True)

    await runner.recover({})
    final = await within(recorder.wait_final("t1"))
    assert (final.state, final.exit_code) == (TaskState.KILLED, 137)
    assert "SIGKILL" in final.message


async def test_shutdown_kills_reattached_tasks(
    runner: TaskRunner, recorder: Recorder, live_task: StartWrapper
) -> None:
    sandbox = await live_task("t1", "sleep 30")
    await runner.recover({})
    await runner.shutdown()
    final = recorder.final("t1")
    assert final is not None and final.state is TaskState.KILLED
    assert checkpoint(sandbox)["state"] == "TASK_KILLED"


async def test_the_end_is_checkpointed_only_once_it_is_durable(tmp_path: Path) -> None:
    durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reported: list[TaskTransition] = []

    def on_status(t: TaskTransition) -> asyncio.Future[None] | None:
        reported.append(t)
        return durable if t.state.is_terminal else None

    runner = TaskRunner(tmp_path, on_status)
    runner.launch(FW, TaskSpec("t1", "exit 2", Resources(cpus=0.5, mem=32)))
    await wait_for_condition(lambda: any(t.state.is_terminal for t in reported), what="the end")
    records = runner.records_path(FW, "t1")
    # Journaling is slow: meanwhile a restarted agent would find the task unfinished
    # (and then its end in the journal, or no end at all and report it itself).
    assert checkpoint(records)["state"] == "TASK_RUNNING"
    durable.set_result(None)
    await wait_for_condition(
        lambda: checkpoint(records)["state"] == "TASK_FAILED", what="the final checkpoint"
    )
    await runner.shutdown()


async def test_checkpoint_records_what_recovery_needs(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch(FW, TaskSpec("t1", "sleep 30", Resources(cpus=0.5, mem=32)))
    await recorder.wait_state("t1", TaskState.RUNNING)
    record = checkpoint(runner.records_path(FW, "t1"))
    assert record["pid_start_time"] == process_start_time(record["pid"])
    assert record["run_id"] == recorder.transitions[0].run_id != ""
    assert record["killing"] is False
    assert os.getpgid(record["pid"]) == record["pid"]  # the wrapper leads the task's group
    runner.kill(FW, "t1")
    await recorder.wait_final("t1")
    assert checkpoint(runner.records_path(FW, "t1"))["killing"] is True


# The agent: identity, journal and tasks across a restart, against a fake master.


def journal_pending(work_dir: Path) -> list[str]:
    return [u.status.update_id for u in UpdateJournal(work_dir / JOURNAL_FILE).load()]


async def test_the_next_agent_on_the_work_dir_keeps_the_id_and_resends_updates(
    tmp_path: Path,
) -> None:
    async with fake_master_server(FakeMaster()) as master:
        master.should_ack = lambda status: False
        first = make_agent(master, tmp_path, stop_timeout=0.1)
        async with first:
            assert await within(first.wait_registered()) == "agent-1"
            assert json.loads((tmp_path / AGENT_FILE).read_text())["agent_id"] == "agent-1"
            master.launch(gateway_task("t1", "true"))
            starting = await master.wait_state("t1", TaskState.STARTING)
            await wait_for_condition(
                lambda: not first.running_tasks(), what="the task to end unacknowledged"
            )
        assert len(journal_pending(tmp_path)) == 3  # STARTING, RUNNING, FINISHED

        master.should_ack = lambda status: True
        second = make_agent(master, tmp_path)
        async with second:
            register = (await master.wait_streams(2)).register
            assert register.agent_id == "agent-1"
            # Ended, end unacknowledged: reported in its end state (it holds nothing).
            [reported] = [convert.running_task_from_proto(t) for t in register.tasks]
            assert (reported.task.task_id, reported.state) == ("t1", TaskState.FINISHED)
            await master.wait_state("t1", TaskState.FINISHED)
            after_restart = [r.status for r in master.updates if r.stream == 1]
            assert after_restart[0].update_id == starting.update_id  # the same update
            assert [s.state for s in after_restart] == [
                TaskState.STARTING,
                TaskState.RUNNING,
                TaskState.FINISHED,
            ]
            await wait_for_condition(
                lambda: journal_pending(tmp_path) == [], what="the journal to empty"
            )


async def test_refused_id_kills_recovered_tasks_and_registers_as_new(
    tmp_path: Path, live_task: StartWrapper
) -> None:
    sandbox = await live_task("t1", "sleep 30")
    pid = checkpoint(sandbox)["pid"]
    (tmp_path / AGENT_FILE).write_text(json.dumps({"agent_id": "agent-old"}))
    UpdateJournal(tmp_path / JOURNAL_FILE).append(
        [PendingUpdate(TaskStatus("t1", FW, "agent-old", TaskState.RUNNING, update_id="u1"))]
    )
    async with fake_master_server(FakeMaster()) as master:
        master.refuse_next = (grpc.StatusCode.FAILED_PRECONDITION, "agent-old was removed")
        agent = make_agent(master, tmp_path)
        async with agent:
            first = (await master.wait_streams(1)).register
            assert first.agent_id == "agent-old"
            assert [t.task.task_id for t in first.tasks] == ["t1"]
            second = (await master.wait_streams(2)).register
            assert (second.agent_id, list(second.tasks)) == ("", [])
            assert await within(agent.wait_registered()) == "agent-1"
            assert process_start_time(pid) is None
            assert json.loads((tmp_path / AGENT_FILE).read_text())["agent_id"] == "agent-1"
            assert journal_pending(tmp_path) == []
            assert master.updates == []  # nothing of the old identity was sent


async def test_without_an_id_what_is_left_behind_is_killed(
    tmp_path: Path, live_task: StartWrapper
) -> None:
    sandbox = await live_task("t1", "sleep 30")
    pid = checkpoint(sandbox)["pid"]
    async with fake_master_server(FakeMaster()) as master:
        agent = make_agent(master, tmp_path)
        async with agent:
            register = (await master.wait_streams(1)).register
            assert (register.agent_id, list(register.tasks)) == ("", [])
            assert process_start_time(pid) is None
            assert checkpoint(sandbox)["state"] == "TASK_KILLED"


async def test_task_caught_starting_is_found_by_the_pid_its_wrapper_wrote(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path
) -> None:
    # The agent died after spawning the wrapper but before checkpointing its pid;
    # the wrapper recorded itself and, later, the command's real exit status.
    pid, start_time = gone_pid()
    sandbox = lay_out(
        tmp_path,
        "t1",
        pid=None,
        state="TASK_STARTING",
        exit_record={"exit_code": 3, "pid": 1, "finished": 2.0},
    )
    (sandbox / "wrapper.json").write_text(json.dumps({"pid": pid, "start_time": start_time}))
    await runner.recover({})
    final = await recorder.wait_final("t1")
    assert (final.state, final.exit_code) == (TaskState.FAILED, 3)
    assert checkpoint(sandbox)["pid"] == pid
