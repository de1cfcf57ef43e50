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
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent import _exit_log, _supervisor
from mesolite.agent._task_wrapper import cgroup_pids
from mesolite.agent.isolation import Container, IsolationConfig, Isolator
from mesolite.agent.tasks import TaskRunner
from mesolite.model import TaskState
from tests.support.cgroups import remove_tree
from tests.test_agent_supervisor import (
    FW,
    SUPERVISOR,
    RunnerProcess,
    alive,
    connect,
    read_messages,
    spec,
    waits_for_go,
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
    record = json.loads((work_dir / "meta" / FW / task_id / "task.json").read_text())
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
    record = json.loads((work_dir / "meta" / FW / task_id / "task.json").read_text())
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
    checkpoint = work_dir / "meta" / FW / "t0" / "task.json"
    record = json.loads(checkpoint.read_text())
    command = record["pid"]
    record.update(pid=None, pid_start_time=None, state="TASK_STARTING")
    checkpoint.write_text(json.dumps(record))

    second = make_runner(work_dir, recorder, root)
    try:
        await second.recover({})
        await recorder.wait_state("t0", TaskState.RUNNING)
        assert json.loads(checkpoint.read_text())["pid"] == command
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


def cgroups_of(pid: int) -> dict[str, str]:
    """Where `pid` is, per v1 controller (``"": ...`` for v2), as /proc says."""
    where: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            where[controller] = path
    return where


def in_cgroup(pid: int, directories: list[Path]) -> bool:
    """Whether `pid` is in each of `directories` (one per hierarchy)."""
    return all(pid in cgroup_pids([d]) for d in directories)


class HandStarted:
    """A supervisor started by hand with a cgroup of its own (an agent's, under the
    test's root), and a task cgroup made as the agent makes them."""

    def __init__(self, work_dir: Path, root: str) -> None:
        self.isolator = Isolator(IsolationConfig(cgroups_root=root), work_dir, announce=False)
        self.own = self.isolator.supervisor_cgroup()
        self.directory = work_dir / "supervisor"
        self.directory.mkdir(mode=0o700)
        options = [arg for path in self.own for arg in ("--cgroup", str(path))]
        command = [sys.executable, "-I", SUPERVISOR, str(self.directory), *options]
        subprocess.run(command, check=True, timeout=30)

    def task_cgroup(self, run: str) -> list[Path]:
        cgroup = self.isolator.create(run, {"mem": 32, "cpus": 0.1}, None).cgroup
        assert cgroup is not None
        return cgroup.paths

    def request(self, run: str, cgroups: list[Path], command: str, cwd: Path) -> dict[str, Any]:
        return {
            "op": "spawn",
            "id": int(run.removeprefix("r")),
            "run": run,
            "records": str(cwd),
            "cgroups": [str(c) for c in cgroups],
            "user": None,
            "argv": ["/bin/sh", "-c", command],
            "env": {"PATH": "/usr/bin:/bin"},
            "cwd": str(cwd),
        }


@needs_cgroups
def test_a_command_that_cannot_be_started_never_runs_and_says_why(
    work_dir: Path, root: str, tmp_path: Path
) -> None:
    hand = HandStarted(work_dir, root)
    task = hand.task_cgroup("r1")
    missing = [*task[:-1], task[-1].parent / "no-such-cgroup"]  # the last hierarchy's
    with connect(hand.directory) as sock:
        [*_, hello] = read_messages(sock, "hello")
        assert hello["spawn"] is True  # it has a cgroup of its own to come back to
        supervisor = hello["pid"]
        home = cgroups_of(supervisor)
        for request, says in [
            ({**hand.request("r1", task, "", tmp_path), "cgroups": ["relative"]}, "absolute"),
            (hand.request("r2", missing, "touch ran", tmp_path), "cannot join the cgroup"),
            (hand.request("r3", [tmp_path], "touch ran", tmp_path), "no cgroup of its own"),
            (hand.request("r4", hand.own, "touch ran", tmp_path), "the supervisor's own"),
            (
                {**hand.request("r5", task, "", tmp_path), "argv": ["/no/such/program"]},
                "cannot execute /no/such/program: No such file or directory",
            ),
            (hand.request("r6", task, "touch ran", tmp_path / "gone"), f"sandbox {tmp_path}/gone"),
        ]:
            _spawn(sock, request)
            [answer] = read_messages(sock, "spawned")
            assert says in answer.get("error", ""), (request, answer)
            # Back in its own cgroups each time, and nothing left in the task's.
            assert cgroups_of(supervisor) == home
            assert cgroup_pids(task) == set()
        assert not (tmp_path / "ran").exists()
        # And it goes on spawning: a command in its cgroups from birth, ready at once.
        _spawn(sock, hand.request("r7", task, "cat /proc/self/cgroup > ran", tmp_path))
        messages = read_messages(sock, "exited")
    assert [m["op"] for m in messages] == ["spawned", "ready", "exited"], messages
    assert messages[-1]["status"] == 0
    lines = (tmp_path / "ran").read_text()
    assert lines.count("/r1\n") == len(task), lines  # every hierarchy: the task's cgroup
    assert cgroups_of(supervisor) == home


@needs_cgroups
def test_a_supervisor_that_cannot_return_to_its_cgroup_records_the_command_and_exits(
    work_dir: Path, root: str, tmp_path: Path
) -> None:
    hand = HandStarted(work_dir, root)
    task = hand.task_cgroup("r1")
    with connect(hand.directory) as sock:
        [*_, hello] = read_messages(sock, "hello")
        supervisor, keeper = hello["pid"], hello["keeper"]
        # Its own cgroup in one hierarchy removed from outside (both moved out first).
        own = hand.own[0]
        elsewhere = own.parent / "elsewhere"
        elsewhere.mkdir()
        for pid in (supervisor, keeper):
            (elsewhere / "cgroup.procs").write_text(str(pid))
        own.rmdir()
        waits = "touch ran; while [ ! -e go ]; do sleep 0.01; done"
        _spawn(sock, hand.request("r1", task, waits, tmp_path))
        frames = _supervisor.Frames()
        messages: list[dict[str, Any]] = []
        while data := sock.recv(65536):  # it exits: the connection ends
            messages.extend(frames.feed(data))
    wait_for_exit_of(supervisor)
    spawned = _exit_log.read(hand.directory).spawned.get("r1")
    assert spawned is not None, "the command it started is named in the exit log"
    command, start_time = spawned
    assert in_cgroup(command, task), "it runs, in its cgroups"
    assert (tmp_path / "ran").exists()
    assert "cannot return to its own cgroup" in (hand.directory / _supervisor.LOG_NAME).read_text()
    # Its keeper reaps it and records its end.
    (tmp_path / "go").touch()
    deadline = time.monotonic() + 20
    while _exit_log.read(hand.directory).end_of(command, start_time) is None:
        assert time.monotonic() < deadline, "the keeper did not record the command's end"
        time.sleep(0.01)
    # As far as the socket took it before it exited, it said so too.
    assert all(m.get("pid") == command for m in messages if m["op"] != "hello"), messages


def wait_for_exit_of(pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.01)


@needs_cgroups
async def test_a_spawned_command_is_born_in_its_cgroups_as_its_user_and_the_supervisor_returns(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    runner = make_runner(work_dir, recorder, root)
    try:
        runner.launch(FW, spec("who", "id -u; id -G; cat /proc/self/cgroup"))
        final = await recorder.wait_final("who")
        assert final.state is TaskState.FINISHED, final
        assert launcher(work_dir, "who") == "spawn"
        uid, groups, *cgroups = (
            (work_dir / "sandboxes" / FW / "who" / "stdout").read_text().split("\n")
        )
        user = pwd.getpwnam(runner.isolator.task_user_name)
        assert int(uid) == user.pw_uid != os.geteuid()
        assert sorted(map(int, groups.split())) == sorted(
            os.getgrouplist(user.pw_name, user.pw_gid)
        )
        # In the run's own cgroup in every hierarchy the agent uses, not the supervisor's.
        own = runner.isolator.supervisor_cgroup()
        mine = [line for line in cgroups if line.endswith(f"/{final.run_id}")]
        assert len(mine) == len(own), cgroups
        # The supervisor went back to its own cgroup in each.
        supervisor = runner.supervisor_pid
        assert supervisor is not None and in_cgroup(supervisor, own)
    finally:
        await runner.shutdown()
        runner.close()


@needs_cgroups
async def test_a_kill_of_a_cgroup_the_supervisor_is_in_spares_it(
    work_dir: Path, recorder: Recorder, root: str
) -> None:
    runner = make_runner(work_dir, recorder, root)
    try:
        # SIGTERM ignored: the kill goes on to the cgroup (after the grace period).
        runner.launch(FW, spec("stubborn", "trap '' TERM; while :; do sleep 0.05; done"))
        await recorder.wait_state("stubborn", TaskState.RUNNING)
        supervisor = runner.supervisor_pid
        assert supervisor is not None
        record = json.loads((work_dir / "meta" / FW / "stubborn" / "task.json").read_text())
        task = Container.from_record(record["container"]).cgroup
        assert task is not None
        # As in the instant of a spawn: the supervisor in the run's cgroups.
        for directory in task.paths:
            (directory / "cgroup.procs").write_text(str(supervisor))
        runner.kill(FW, "stubborn")
        final = await recorder.wait_final("stubborn")
        assert (final.state, final.exit_code) == (TaskState.KILLED, 128 + signal.SIGKILL), final
        assert alive(supervisor), "the agent's kill of the cgroup spared the supervisor"
        assert task.pids() == {supervisor}  # the rest is dead; the removal waits (busy)
        for directory in runner.isolator.supervisor_cgroup():
            (directory / "cgroup.procs").write_text(str(supervisor))
        runner.launch(FW, spec("after", "exit 0"))  # through the same supervisor
        assert (await recorder.wait_final("after")).state is TaskState.FINISHED
        assert runner.supervisor_pid == supervisor
    finally:
        await runner.shutdown()
        runner.close()


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
