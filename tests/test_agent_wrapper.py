"""The task wrapper as the agent runs it: a real process, in a new session, by path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent import _task_wrapper
from mesolite.agent._procs import process_start_time
from mesolite.files import write_json_atomically
from tests.waiting import wait_for_condition, within

WRAPPER = str(Path(_task_wrapper.__file__).absolute())

Spawn = Callable[..., Any]


class Wrapper:
    """A running wrapper, its readiness pipe and its sandbox."""

    def __init__(self, process: asyncio.subprocess.Process, sandbox: Path, ready: int) -> None:
        self.process = process
        self.sandbox = sandbox
        self._ready = ready

    async def command_pid(self) -> int | None:
        """What the wrapper writes on its ready fd: the command's pid (then its own), or
        None at end of file."""
        data = await asyncio.to_thread(os.read, self._ready, 64)
        os.close(self._ready)
        if not data:
            return None
        command, wrapper = (int(pid) for pid in data.split())
        assert wrapper == self.process.pid
        return command

    def exit_record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads((self.sandbox / "exit.json").read_text())
        return record


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Spawn]:
    """Starts wrappers like the agent does; kills what is left of them afterwards."""
    started: list[Wrapper] = []

    async def start(*argv: str, new_session: bool = True) -> Wrapper:
        read, write = os.pipe()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            WRAPPER,
            str(tmp_path),
            "--ready-fd",
            str(write),
            "--",
            *argv,
            cwd=tmp_path,
            start_new_session=new_session,
            pass_fds=(write,),
        )
        os.close(write)
        wrapper = Wrapper(process, tmp_path, read)
        started.append(wrapper)
        return wrapper

    yield start
    for wrapper in started:
        if wrapper.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(wrapper.process.pid, signal.SIGKILL)
            await wrapper.process.wait()


async def test_records_the_exit_code_then_ends_its_group(spawn: Spawn) -> None:
    wrapper = await spawn("/bin/sh", "-c", "exit 7")
    command = await wrapper.command_pid()
    # A group leader ends its group, itself included, once the status is on disk.
    assert await within(wrapper.process.wait(), 10) == -signal.SIGKILL
    record = wrapper.exit_record()
    assert record["exit_code"] == 7
    assert record["pid"] == command
    assert "signal" not in record and record["finished"] > 0
    # No temp files left behind.
    assert sorted(p.name for p in wrapper.sandbox.iterdir()) == ["exit.json", "wrapper.json"]


async def test_records_the_signal_that_ended_the_command(spawn: Spawn) -> None:
    wrapper = await spawn("/bin/sh", "-c", "kill -KILL $$")
    await within(wrapper.process.wait(), 10)
    record = wrapper.exit_record()
    assert record["signal"] == signal.SIGKILL
    assert "exit_code" not in record


async def test_forwards_sigterm_to_the_command(spawn: Spawn) -> None:
    wrapper = await spawn("sleep", "30")
    command = await wrapper.command_pid()
    assert command is not None

    wrapper.process.send_signal(signal.SIGTERM)  # the wrapper alone, not its group
    await within(wrapper.process.wait(), 10)
    assert wrapper.exit_record()["signal"] == signal.SIGTERM
    assert process_start_time(command) is None


async def test_a_command_that_ignores_sigterm_keeps_running(spawn: Spawn, tmp_path: Path) -> None:
    wrapper = await spawn("/bin/sh", "-c", "trap '' TERM; echo ready > ready; sleep 30")
    await wrapper.command_pid()
    await wait_for_condition(lambda: (tmp_path / "ready").exists(), what="the trap to be set")

    wrapper.process.send_signal(signal.SIGTERM)
    # The wrapper survives the forwarded SIGTERM and keeps waiting; only
    # SIGKILL of the group (the agent's escalation) ends both.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(wrapper.process.wait()), 0.3)
    os.killpg(wrapper.process.pid, signal.SIGKILL)
    assert await within(wrapper.process.wait(), 10) == -signal.SIGKILL
    assert not (tmp_path / "exit.json").exists()


async def test_processes_the_command_left_behind_die_with_it(spawn: Spawn, tmp_path: Path) -> None:
    wrapper = await spawn("/bin/sh", "-c", "sleep 30 & echo $! > background; exit 0")
    await within(wrapper.process.wait(), 10)
    assert wrapper.exit_record()["exit_code"] == 0
    background = int((tmp_path / "background").read_text())
    await wait_for_condition(
        lambda: process_start_time(background) is None, what="the background sleep to die"
    )


async def test_a_command_that_cannot_start_is_recorded_as_an_error(spawn: Spawn) -> None:
    wrapper = await spawn("/nonexistent/command")
    assert await wrapper.command_pid() is None  # end of file: it never started
    await within(wrapper.process.wait(), 10)
    record = wrapper.exit_record()
    assert "No such file or directory" in record["error"]


async def test_outside_a_group_it_leads_it_exits_with_the_command(spawn: Spawn) -> None:
    # Run like this (not a group leader), it must not kill its caller's group.
    wrapper = await spawn("/bin/sh", "-c", "exit 5", new_session=False)
    assert await within(wrapper.process.wait(), 10) == 5
    assert wrapper.exit_record()["exit_code"] == 5


def test_a_signal_before_the_command_starts_is_kept_for_it() -> None:
    forward = _task_wrapper._Forwarder()
    forward(signal.SIGTERM, None)
    assert forward.early == [signal.SIGTERM]
    forward.reaped = True
    forward(signal.SIGTERM, None)  # after the reap the pid may be another process's
    assert forward.early == [signal.SIGTERM]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert _task_wrapper.main(["sandbox", "true"]) == 2
    assert _task_wrapper.main(["sandbox", "--ready-fd", "x", "--", "true"]) == 2
    assert "usage" in capsys.readouterr().err


def test_json_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_json_atomically(target, {"a": 1})
    write_json_atomically(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
