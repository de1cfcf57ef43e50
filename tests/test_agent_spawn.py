"""Commands the supervisor spawns itself (`agent/_supervisor.py`, with cgroups): their
real exit statuses survive an agent's SIGKILL, the supervisor's, and both, through the
exit log (`agent/_exit_log.py`), whose group commit writes every end before one fsync.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent import _exit_log, _supervisor
from mesolite.agent._task_log import TASK_LOG_FILE
from mesolite.agent.isolation import IsolationConfig, Isolator
from mesolite.agent.tasks import TaskRunner
from mesolite.model import TaskState
from tests.support.cgroups import remove_tree
from tests.support.checkpoints import checkpoint_at, overwrite_checkpoint
from tests.support.spawn_shim import shim as shim  # the fixture: the C helper, the sh shim
from tests.support.spawn_shim import shim_binary as shim_binary
from tests.test_agent_supervisor import (
    FW,
    RunnerProcess,
    alive,
    connect,
    read_messages,
    spec,
    waits_for_go,
)
from tests.test_agent_supervisor import (
    supervisor_dir as supervisor_dir,  # the fixture: a supervisor started by hand
)
from tests.test_agent_supervisor import (
    work_dir as work_dir,  # the fixture, with its clean-up
)
from tests.test_agent_tasks import Recorder
from tests.test_isolation import CGROUPS
from tests.waiting import wait_for_condition

pytestmark = pytest.mark.integration
needs_cgroups = pytest.mark.skipif(not CGROUPS, reason="the agent cannot create cgroups here")


@pytest.fixture
def root() -> Iterator[str]:
    """A cgroups root of the test's own, emptied and removed afterwards."""
    name = f"mesolite-test-spawn-{uuid.uuid4().hex[:10]}"
    yield name
    remove_tree(name)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def make_runner(work_dir: Path, recorder: Recorder, root: str) -> TaskRunner:
    isolator = Isolator(IsolationConfig(cgroups_root=root), work_dir, announce=False)
    return TaskRunner(work_dir, recorder, kill_grace_period=0.3, isolator=isolator)


def go(work_dir: Path, task_id: str) -> None:
    (work_dir / "sandboxes" / FW / task_id / "go").touch()


def checkpoint_pid(work_dir: Path, task_id: str) -> int:
    record = checkpoint_at(work_dir / "meta" / FW / task_id)
    pid = record["pid"]
    assert isinstance(pid, int)
    return pid


def pidfds_held() -> set[int]:
    """The processes this process holds a pidfd on (their fdinfo names them)."""
    pids = set()
    for info in Path("/proc/self/fdinfo").iterdir():
        try:
            text = info.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pid:"):
                pids.add(int(line.split()[1]))
    return pids


def launcher(work_dir: Path, task_id: str) -> str:
    record = checkpoint_at(work_dir / "meta" / FW / task_id)
    return str(record["launcher"])


@needs_cgroups
async def test_a_killed_agent_gets_every_spawned_commands_real_status(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    codes = list(range(8))
    first = await RunnerProcess.start(work_dir, [waits_for_go(code) for code in codes], root)
    assert {launcher(work_dir, f"t{i}") for i in codes} == {"spawn"}
    for i in codes[::2]:  # these end about as the agent dies, the others after
        go(work_dir, f"t{i}")
    await first.sigkill()
    for i in codes[1::2]:
        go(work_dir, f"t{i}")
    assert alive(first.supervisor), "the supervisor outlives the agent"

    second = make_runner(work_dir, recorder, root)
    try:
        await second.recover({})
        assert second.supervisor_pid == first.supervisor  # the same one, reconnected
        for i in codes:
            final = await recorder.wait_final(f"t{i}")
            expected = TaskState.FINISHED if i == 0 else TaskState.FAILED
            assert (final.state, final.exit_code) == (expected, i), final
    finally:
        await second.shutdown()
        second.close()


@needs_cgroups
async def test_the_starting_checkpoint_is_on_disk_before_the_command_is_spawned(
    work_dir: Path, recorder: Recorder, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that dies once the command exists must find the run (and its cgroup) in
    its task log, even after a crash of the machine: fsynced before the spawn."""
    task_log = work_dir / TASK_LOG_FILE
    synced: list[bytes] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == str(task_log):
            synced.append(task_log.read_bytes())

    monkeypatch.setattr(os, "fsync", fsync)
    runner = make_runner(work_dir, recorder, root)
    seen: list[dict[str, Any]] = []
    real_spawn = runner._supervisor.spawn

    async def spawn(**request: Any) -> Any:
        on_disk = [json.loads(line) for line in (synced[-1] if synced else b"").splitlines()]
        seen.extend(r for r in on_disk if r["task"]["task_id"] == "t")
        return await real_spawn(**request)

    monkeypatch.setattr(runner._supervisor, "spawn", spawn)
    try:
        runner.launch(FW, spec("t", "true"))
        assert (await recorder.wait_final("t")).state is TaskState.FINISHED
    finally:
        await runner.shutdown()
        runner.close()
    assert [r["state"] for r in seen] == ["TASK_STARTING"]
    assert seen[0]["container"]["cgroup"]["dirs"], "and which cgroup it has"


@needs_cgroups
async def test_a_spawned_command_starts_with_no_signal_ignored_and_no_stray_fd(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    runner = make_runner(work_dir, recorder, root)
    try:
        runner.launch(FW, spec("sig", "grep SigIgn /proc/$$/status; ls /proc/$$/fd"))
        final = await recorder.wait_final("sig")
        assert final.state is TaskState.FINISHED, final
        assert launcher(work_dir, "sig") == "spawn"
        # Python ignores SIGPIPE and SIGXFSZ: `yes | head` would never end if the
        # command did too. (glibc's posix_spawn leaves its own two internal signals,
        # 32 and 33, ignored: only glibc uses them, and it sets their handlers itself.)
        stdout = (work_dir / "sandboxes" / FW / "sig" / "stdout").read_text()
        label, mask, *fds = stdout.split()
        ignored = {n + 1 for n in range(64) if int(mask, 16) >> n & 1}
        assert label == "SigIgn:" and ignored <= {32, 33}, stdout
        assert fds == ["0", "1", "2"], stdout  # nothing of the supervisor's leaks in
    finally:
        await runner.shutdown()
        runner.close()


@needs_cgroups
async def test_with_spawning_off_a_wrapper_confines_the_command_as_before(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    # Where the supervisor cannot spawn (no setpriv), a wrapper starts a task with a
    # cgroup: its command, not the wrapper, joins the cgroup and takes the task user.
    isolator = Isolator(IsolationConfig(cgroups_root=root), work_dir, announce=False)
    runner = TaskRunner(work_dir, recorder, isolator=isolator, spawn=False)
    try:
        runner.launch(FW, spec("w", "id -u; cat /proc/$$/cgroup"))
        final = await recorder.wait_final("w")
        assert final.state is TaskState.FINISHED, final
        assert launcher(work_dir, "w") == "wrapper"
        uid, *cgroups = (work_dir / "sandboxes" / FW / "w" / "stdout").read_text().split()
        assert int(uid) == pwd.getpwnam(isolator.task_user_name).pw_uid != os.geteuid()
        memory = [line for line in cgroups if "memory" in line.split(":")[1]]
        # The task's own cgroup (named by its run), not the supervisor's.
        assert memory and f"/{root}/" in memory[0] and final.run_id in memory[0], cgroups
    finally:
        await runner.shutdown()
        runner.close()


@needs_cgroups
async def test_spawned_commands_outlive_a_killed_supervisor_with_their_real_statuses(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    runner = make_runner(work_dir, recorder, root)
    try:
        for i in range(4):
            runner.launch(FW, spec(f"t{i}", waits_for_go(20 + i)))
        for i in range(4):
            await recorder.wait_state(f"t{i}", TaskState.RUNNING)
        assert launcher(work_dir, "t0") == "spawn"
        supervisor = runner.supervisor_pid
        assert supervisor is not None
        os.kill(supervisor, signal.SIGKILL)
        await wait_for_condition(lambda: not alive(supervisor), what="the supervisor to die")
        # The agent waits for each command (a pidfd), not for its end in the log alone.
        commands = {checkpoint_pid(work_dir, f"t{i}") for i in range(4)}
        await wait_for_condition(lambda: commands <= pidfds_held(), what="a pidfd on each command")
        for i in range(4):
            go(work_dir, f"t{i}")
        # Its keeper reaped them and wrote their ends to the exit log.
        for i in range(4):
            final = await recorder.wait_final(f"t{i}")
            assert (final.state, final.exit_code) == (TaskState.FAILED, 20 + i), final
        runner.launch(FW, spec("after", "exit 0"))  # a new supervisor starts
        assert (await recorder.wait_final("after")).state is TaskState.FINISHED
        assert runner.supervisor_pid not in (None, supervisor)
    finally:
        await runner.shutdown()
        runner.close()


@needs_cgroups
async def test_ends_while_both_the_agent_and_its_supervisor_are_dead_are_not_lost(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    first = await RunnerProcess.start(work_dir, [waits_for_go(30 + i) for i in range(3)], root)
    os.kill(first.supervisor, signal.SIGKILL)
    await wait_for_condition(lambda: not alive(first.supervisor), what="the supervisor to die")
    await first.sigkill()
    for i in range(3):
        go(work_dir, f"t{i}")
    second = make_runner(work_dir, recorder, root)
    try:
        await second.recover({})
        for i in range(3):
            final = await recorder.wait_final(f"t{i}")
            assert (final.state, final.exit_code) == (TaskState.FAILED, 30 + i), final
    finally:
        await second.shutdown()
        second.close()


@needs_cgroups
async def test_a_command_whose_pid_was_not_checkpointed_is_found_in_the_exit_log(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    first = await RunnerProcess.start(work_dir, [waits_for_go(4)], root)
    os.kill(first.supervisor, signal.SIGKILL)  # no supervisor left to list it
    await wait_for_condition(lambda: not alive(first.supervisor), what="the supervisor to die")
    await first.sigkill()
    # As if the agent had died before it checkpointed the command's pid.
    records = work_dir / "meta" / FW / "t0"
    record = checkpoint_at(records)
    command = record["pid"]
    record.update(pid=None, pid_start_time=None, state="TASK_STARTING")
    overwrite_checkpoint(records, record)

    second = make_runner(work_dir, recorder, root)
    try:
        await second.recover({})
        await recorder.wait_state("t0", TaskState.RUNNING)
        assert checkpoint_at(records)["pid"] == command
        go(work_dir, "t0")
        final = await recorder.wait_final("t0")
        assert (final.state, final.exit_code) == (TaskState.FAILED, 4), final
    finally:
        await second.shutdown()
        second.close()


def _spawn(sock: socket.socket, request: dict[str, Any]) -> None:
    with open(os.devnull, "wb") as devnull:
        fds = [devnull.fileno(), devnull.fileno()]
        sock.sendmsg(
            [_supervisor.encode(request)],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("2i", *fds))],
        )


def test_a_command_that_cannot_join_its_cgroup_never_runs_and_says_why(
    shim: str, supervisor_dir: Path, tmp_path: Path
) -> None:
    request = {
        "op": "spawn",
        "id": 1,
        "run": "r1",
        "records": str(tmp_path),
        "cgroups": [str(tmp_path / "no-such-cgroup")],
        "user": None,
        "argv": ["/bin/sh", "-c", "touch ran"],
        "env": {},
        "cwd": str(tmp_path),
    }
    with connect(supervisor_dir) as sock:
        read_messages(sock, "hello")
        _spawn(sock, {**request, "id": 0, "cgroups": ["relative"]})  # refused: not a path
        [refused] = read_messages(sock, "spawned")
        assert "error" in refused and "absolute" in refused["error"]
        _spawn(sock, request)
        frames = _supervisor.Frames()
        messages: list[dict[str, Any]] = []
        while not any(m["op"] == "exited" for m in messages):
            data = sock.recv(65536)
            assert data, "the connection ended before the command did"
            messages.extend(frames.feed(data))
    [spawned] = [m for m in messages if m["op"] == "spawned"]
    [exited] = [m for m in messages if m["op"] == "exited"]
    assert not [m for m in messages if m["op"] == "ready"]  # it never ran
    assert exited["pid"] == spawned["pid"] and "cannot join the cgroup" in exited["error"]
    assert not (tmp_path / "ran").exists()
    end = _exit_log.read(supervisor_dir).end_of(spawned["pid"], spawned["start_time"])
    assert end is not None and "cannot join the cgroup" in end["error"]


# The exit log itself.


def test_group_commit_writes_every_end_then_fsyncs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _exit_log.ExitLogWriter(tmp_path)
    path = tmp_path / _exit_log.EXITS_NAME
    lines_at_fsync: list[int] = []
    fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        lines_at_fsync.append(path.read_bytes().count(b"\n"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)  # the os module `_exit_log` calls
    spawned = {"op": "spawned", "run": "r", "records": "/x", "pid": 9, "start_time": 1}
    writer.add(spawned, durable=False)
    for i in range(50):
        writer.add(_exit_log.exit_record(1000 + i, 7, i << 8), durable=True)
    assert lines_at_fsync == [] and path.read_bytes() == b""  # nothing before the commit
    writer.commit()
    assert lines_at_fsync == [51]  # one fsync, after all of the batch was written
    log = _exit_log.read(tmp_path)
    assert all((log.end_of(1000 + i, 7) or {}).get("exit_code") == i for i in range(50))
    assert log.spawned == {"r": (9, 1)}
    writer.add({**spawned, "run": "s", "pid": 10}, durable=False)
    writer.commit()  # a live process named: written, not fsynced
    assert lines_at_fsync == [51]
    # A crash in the middle of an append: the torn line is skipped, the rest kept.
    with path.open("ab") as f:
        f.write(b'{"op":"exited","pid":')
    torn = _exit_log.read(tmp_path)
    assert len(torn.exits) == 50 and set(torn.spawned) == {"r", "s"}


def test_the_log_rotates_and_both_generations_are_read(tmp_path: Path) -> None:
    writer = _exit_log.ExitLogWriter(tmp_path, rotate_lines=10)
    for i in range(25):
        writer.add(_exit_log.exit_record(i, 1, 0), durable=True)
        writer.commit()
    writer.close()
    assert (tmp_path / _exit_log.EXITS_NAME).read_bytes().count(b"\n") < 10
    ends = _exit_log.read(tmp_path).exits
    assert sorted(pid for pid, _ in ends) == list(range(10, 25))
    # A writer reopened on the same log goes on counting from what is there.
    again = _exit_log.ExitLogWriter(tmp_path, rotate_lines=10)
    for i in range(25, 31):
        again.add(_exit_log.exit_record(i, 1, 0), durable=True)
        again.commit()
    again.close()
    assert sorted(pid for pid, _ in _exit_log.read(tmp_path).exits) == list(range(20, 31))
