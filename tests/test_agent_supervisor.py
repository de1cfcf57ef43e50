"""The agent's supervisor (`agent/_supervisor.py`): real supervisor processes forking
real wrappers; agents (task runners in a process of their own) and supervisors
SIGKILLed while tasks run and end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent import _supervisor
from mesolite.agent._cgroups import scope_name
from mesolite.agent._procs import process_start_time
from mesolite.agent.isolation import SUPERVISOR_CGROUP, IsolationConfig, Isolator
from mesolite.agent.tasks import SUPERVISOR_DIR, TaskRunner
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.cgroups import leftover, remove_tree
from tests.support.checkpoints import all_checkpoints, checkpoint_at, overwrite_checkpoint
from tests.test_agent_tasks import Recorder
from tests.test_isolation import CGROUPS
from tests.waiting import wait_for_condition, within

FW = "fw-1"
ROOT = Path(__file__).resolve().parent.parent
SUPERVISOR = str(Path(_supervisor.__file__).absolute())


def alive(pid: int) -> bool:
    return process_start_time(pid) is not None


def pids_of(directory: Path) -> list[int]:
    """Live processes whose command line names `directory` (supervisors started on it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(directory).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


@pytest.fixture
def work_dir(tmp_path: Path) -> Iterator[Path]:
    """A work dir; every supervisor started on it and every task wrapper it recorded
    is killed afterwards."""
    yield tmp_path
    for record in all_checkpoints(tmp_path):
        with contextlib.suppress(KeyError, TypeError):
            pid = record["pid"]
            if isinstance(pid, int):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
    for pid in pids_of(tmp_path / SUPERVISOR_DIR):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def runner(work_dir: Path, recorder: Recorder) -> AsyncIterator[TaskRunner]:
    runner = TaskRunner(work_dir, recorder, kill_grace_period=0.3)
    yield runner
    await runner.shutdown()


def spec(task_id: str, command: str) -> TaskSpec:
    return TaskSpec(task_id, command, Resources(cpus=0.1, mem=32))


def waits_for_go(code: int) -> str:
    return f"while [ ! -e go ]; do sleep 0.01; done; exit {code}"


class RunnerProcess:
    """`tests/support/runner_process.py`: a task runner in its own process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.supervisor = 0

    @classmethod
    async def start(
        cls, work_dir: Path, commands: list[str], cgroups_root: str | None = None
    ) -> RunnerProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.runner_process",
            *(["--cgroups", cgroups_root] if cgroups_root is not None else []),
            str(work_dir),
            *commands,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        runner = cls(process)
        assert process.stdout is not None
        while True:
            line = (await within(process.stdout.readline(), 30, "the runner's tasks")).decode()
            assert line, "the runner process ended"
            if line.startswith("running "):
                runner.supervisor = int(line.split()[1])
                return runner

    async def sigkill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert await within(self.process.wait(), 10) == -signal.SIGKILL


async def test_a_killed_agent_gets_every_status_of_the_tasks_that_ended_meanwhile(
    work_dir: Path, recorder: Recorder
) -> None:
    codes = list(range(12))
    first = await RunnerProcess.start(work_dir, [waits_for_go(code) for code in codes])
    # Half the tasks end just before the agent dies, the others just after.
    for i in codes[::2]:
        (work_dir / "sandboxes" / FW / f"t{i}" / "go").touch()
    await first.sigkill()
    for i in codes[1::2]:
        (work_dir / "sandboxes" / FW / f"t{i}" / "go").touch()
    assert alive(first.supervisor), "the supervisor outlives the agent"

    second = TaskRunner(work_dir, recorder)
    try:
        await second.recover({})
        assert second.supervisor_pid == first.supervisor  # the same one, reconnected
        for i in codes:
            final = await recorder.wait_final(f"t{i}")
            assert (final.state, final.exit_code) == (
                TaskState.FINISHED if i == 0 else TaskState.FAILED,
                i,
            ), final
        # New tasks go on through the same supervisor.
        second.launch(FW, spec("later", "exit 0"))
        assert (await recorder.wait_final("later")).state is TaskState.FINISHED
        assert second.supervisor_pid == first.supervisor
    finally:
        await second.shutdown()
    await wait_for_condition(lambda: not alive(first.supervisor), what="the supervisor to exit")


async def test_a_wrapper_caught_before_it_recorded_its_pid_is_found_through_the_supervisor(
    work_dir: Path, recorder: Recorder
) -> None:
    first = await RunnerProcess.start(work_dir, [waits_for_go(4)])
    await first.sigkill()
    # As if the agent had died before checkpointing the pid, and the wrapper before
    # writing wrapper.json: only the supervisor knows it.
    records = work_dir / "meta" / FW / "t0"
    record = checkpoint_at(records)
    wrapper = record["pid"]
    record.update(pid=None, pid_start_time=None, state="TASK_STARTING")
    overwrite_checkpoint(records, record)
    (records / "wrapper.json").unlink()

    second = TaskRunner(work_dir, recorder)
    try:
        await second.recover({})
        await recorder.wait_state("t0", TaskState.RUNNING)
        assert checkpoint_at(records)["pid"] == wrapper
        (work_dir / "sandboxes" / FW / "t0" / "go").touch()
        final = await recorder.wait_final("t0")
        assert (final.state, final.exit_code) == (TaskState.FAILED, 4)
    finally:
        await second.shutdown()


async def test_tasks_outlive_a_killed_supervisor_with_their_real_statuses(
    runner: TaskRunner, recorder: Recorder, work_dir: Path
) -> None:
    for i in range(4):
        runner.launch(FW, spec(f"t{i}", waits_for_go(10 + i)))
    for i in range(4):
        await recorder.wait_state(f"t{i}", TaskState.RUNNING)
    supervisor = runner.supervisor_pid
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    await wait_for_condition(lambda: not alive(supervisor), what="the supervisor to die")
    for i in range(4):
        (work_dir / "sandboxes" / FW / f"t{i}" / "go").touch()
    for i in range(4):
        final = await recorder.wait_final(f"t{i}")
        assert (final.state, final.exit_code) == (TaskState.FAILED, 10 + i), final
    # The next launch starts a new supervisor.
    runner.launch(FW, spec("after", "exit 0"))
    assert (await recorder.wait_final("after")).state is TaskState.FINISHED
    assert runner.supervisor_pid not in (None, supervisor)


async def test_a_kill_of_a_task_still_works_after_its_supervisor_died(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch(FW, spec("long", "sleep 60"))
    await recorder.wait_state("long", TaskState.RUNNING)
    supervisor = runner.supervisor_pid
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    await wait_for_condition(lambda: not alive(supervisor), what="the supervisor to die")
    runner.kill(FW, "long")
    final = await recorder.wait_final("long")
    assert (final.state, final.exit_code) == (TaskState.KILLED, 128 + signal.SIGTERM)


# The socket: who may use it, and what it takes.


@pytest.fixture
def supervisor_dir(work_dir: Path) -> Iterator[Path]:
    """A supervisor started by hand on `work_dir`/supervisor (killed afterwards)."""
    directory = work_dir / SUPERVISOR_DIR
    directory.mkdir(mode=0o700)
    subprocess.run([sys.executable, "-I", SUPERVISOR, str(directory)], check=True, timeout=30)
    yield directory


def connect(directory: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.connect(_supervisor.socket_address(fd))
    finally:
        os.close(fd)
    return sock


def read_messages(sock: socket.socket, until: str) -> list[dict[str, Any]]:
    frames = _supervisor.Frames()
    messages: list[dict[str, Any]] = []
    while not messages or messages[-1]["op"] != until:
        data = sock.recv(65536)
        assert data, f"the connection ended before {until!r}"
        messages.extend(frames.feed(data))
    return messages


def await_text(path: Path, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in {path} within {timeout} s"
        time.sleep(0.01)


def test_the_socket_is_the_agents_alone(supervisor_dir: Path) -> None:
    address = supervisor_dir / _supervisor.SOCKET_NAME
    assert address.stat().st_mode & 0o777 == 0o600
    assert supervisor_dir.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another user to connect as")
def test_another_user_who_reaches_the_socket_is_refused(supervisor_dir: Path) -> None:
    # Even with the directory and the socket opened up, the kernel's word on who
    # connects (SO_PEERCRED) decides.
    os.chmod(supervisor_dir, 0o711)
    os.chmod(supervisor_dir / _supervisor.SOCKET_NAME, 0o666)
    nobody = pwd.getpwnam("nobody")
    # Through an open directory: the test's own tmp dir is closed to nobody.
    directory_fd = os.open(supervisor_dir, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # the child: only system calls until it exits
        code = 2
        try:
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            sock.connect(_supervisor.socket_address(directory_fd))
            code = 0 if sock.recv(65536) == b"" else 1  # 0: closed without a word
        finally:
            os._exit(code)
    os.close(directory_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    log = (supervisor_dir / _supervisor.LOG_NAME).read_text()
    assert f"refused a connection from uid {nobody.pw_uid}" in log
    # The supervisor is still there for its agent.
    with connect(supervisor_dir) as sock:
        assert read_messages(sock, "hello")[-1]["op"] == "hello"


@pytest.mark.parametrize(
    "sent",
    [
        struct.pack(">I", _supervisor.MAX_FRAME + 1),  # a frame over the limit
        struct.pack(">I", 5) + b"nope!",  # not JSON
        _supervisor.encode({"op": "explode"}),  # no such request
        _supervisor.encode(
            {"op": "launch", "id": 1, "records": "/r", "options": [], "argv": ["true"]}
        ),  # a launch without its two file descriptors
    ],
)
def test_a_request_that_breaks_the_protocol_ends_the_connection_and_nothing_else(
    supervisor_dir: Path, sent: bytes
) -> None:
    with connect(supervisor_dir) as sock:
        read_messages(sock, "hello")
        sock.sendall(sent)
        # Closed; reset if what was sent is left unread.
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(65536) == b""
    log = supervisor_dir / _supervisor.LOG_NAME
    # With no agent and no wrapper left, it exits; it did nothing else.
    await_text(log, "no agent and no task left: exiting")
    assert "protocol error" in log.read_text()
    assert "spawned" not in log.read_text()


def test_a_launch_the_wrapper_cannot_run_is_refused_with_a_reason(
    supervisor_dir: Path, tmp_path: Path
) -> None:
    with connect(supervisor_dir) as sock, open(os.devnull, "wb") as devnull:
        read_messages(sock, "hello")
        request = {
            "op": "launch",
            "id": 7,
            "records": str(tmp_path),
            "options": ["--rlimit", "nosuch=1"],
            "argv": ["true"],
            "env": {},
            "cwd": str(tmp_path),
        }
        fds = [devnull.fileno(), devnull.fileno()]
        sock.sendmsg(
            [_supervisor.encode(request)],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("2i", *fds))],
        )
        [answer] = read_messages(sock, "spawned")
        assert answer["id"] == 7 and "cannot run" in answer["error"]


def test_frames_are_cut_whole_whatever_the_reads() -> None:
    data = _supervisor.encode({"op": "a"}) + _supervisor.encode({"op": "b", "x": [1, 2]})
    frames = _supervisor.Frames()
    got = [m for i in range(len(data)) for m in frames.feed(data[i : i + 1])]
    assert got == [{"op": "a"}, {"op": "b", "x": [1, 2]}]
    with pytest.raises(_supervisor.FrameError):
        _supervisor.encode({"op": "big", "x": "y" * _supervisor.MAX_FRAME})


@pytest.mark.skipif(not CGROUPS, reason="the agent cannot create cgroups here")
async def test_the_supervisor_runs_in_its_own_session_and_cgroup(
    work_dir: Path, recorder: Recorder
) -> None:
    root = f"mesolite-test-sup-{uuid.uuid4().hex[:10]}"
    isolator = Isolator(IsolationConfig(cgroups_root=root), work_dir, announce=False)
    runner = TaskRunner(work_dir, recorder, isolator=isolator)
    try:
        runner.launch(FW, spec("t", "sleep 30"))
        await recorder.wait_state("t", TaskState.RUNNING)
        supervisor = runner.supervisor_pid
        assert supervisor is not None
        # Its session is its keeper's (its parent, the subreaper of what it spawns).
        keeper = int(Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert os.getsid(supervisor) == keeper == os.getsid(keeper) != os.getsid(0)
        cgroups = Path(f"/proc/{supervisor}/cgroup").read_text()
        ours = Path("/proc/self/cgroup").read_text()
        expected = f"/{root}/{scope_name(work_dir)}/{SUPERVISOR_CGROUP}"
        memory = [line for line in cgroups.splitlines() if "memory" in line.split(":")[1]]
        assert memory and memory[0].endswith(expected), cgroups
        assert expected not in ours
        await runner.shutdown()
        # Gone with the last task, and its cgroup with it: only the agent's scope is left.
        await wait_for_condition(lambda: not alive(supervisor), what="the supervisor to exit")
        assert {p.name for p in leftover(root)} <= {root, scope_name(work_dir)}
    finally:
        await runner.shutdown()
        runner.close()
        remove_tree(root)
