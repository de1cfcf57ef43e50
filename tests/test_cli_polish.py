"""The command line as a user meets it: `--help` shows every default; agents are told
apart by id when they share a host name; a closed pipe and Ctrl-C end a command
quietly, as command-line tools do (141 and 130, no traceback). Real subprocesses."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mesolite.cli import build_parser
from mesolite.framework_sdk import Resources, TaskState
from mesolite.snapshot import TaskSnapshot
from mesolite.views import render_agents, render_tasks
from tests.cluster import LocalCluster
from tests.support.snapshots import agent, empty_snapshot
from tests.test_cli_views import _env, lines_with, text
from tests.waiting import within

QUIET = ("Traceback", "Exception ignored", "BrokenPipeError", "KeyboardInterrupt")


def _parsers(
    parser: argparse.ArgumentParser, name: str = "mesolite"
) -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command, by its command line."""
    found = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                found |= _parsers(child, f"{name} {sub}")
    return found


def _shows_a_default(action: argparse.Action) -> bool:
    default = action.default
    if not action.option_strings or default in (None, argparse.SUPPRESS):
        return False
    return not isinstance(default, bool) and default not in ("", (), [], {})


@pytest.mark.unit
def test_help_shows_every_default() -> None:
    parsers = _parsers(build_parser())
    assert {"mesolite master", "mesolite agent", "mesolite teardown", "mesolite kill"} <= set(
        parsers
    )
    checked = 0
    for command, parser in parsers.items():
        for action in parser._actions:
            if not _shows_a_default(action):
                continue
            checked += 1
            formatter = parser._get_formatter()  # as --help formats this option
            formatter.add_argument(action)
            shown = formatter.format_help()
            assert "default" in shown, f"{command} {action.option_strings[-1]}: {shown}"
    assert checked > 40
    master = " ".join(parsers["mesolite master"].format_help().split())
    for shown in (
        "(default: 5050)",
        "(default: 1.0)",
        "(default: 50)",
        "(default: 1000)",
        "(default: drf)",
    ):
        assert shown in master, shown
    agent_help = " ".join(parsers["mesolite agent"].format_help().split())
    assert "(default: 1w)" in agent_help and "(default: 0.9)" in agent_help
    assert "(default: None)" not in master and "(default: False)" not in master


@pytest.mark.unit
def test_two_agents_on_one_host_are_told_apart() -> None:
    state = empty_snapshot(
        agents=(replace(agent("a-0001"), hostname="vm"), replace(agent("a-0002"), hostname="vm")),
        tasks=(
            TaskSnapshot("t1", "", "f1", "a-0001", TaskState.RUNNING, Resources(cpus=1)),
            TaskSnapshot("t2", "", "f1", "a-0002", TaskState.RUNNING, Resources(cpus=1)),
        ),
    )
    tasks = text(render_tasks(state))
    [first] = lines_with(tasks, "t1 ")
    [second] = lines_with(tasks, "t2 ")
    assert "a-0001" in first and "vm" in first and "a-0002" not in first
    assert "a-0002" in second and "vm" in second
    agents = text(render_agents(state))
    assert "a-0001" in lines_with(agents, "a-0001")[0] and "vm" in lines_with(agents, "a-0002")[0]


# Closed pipes and Ctrl-C, as real processes ---------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "mesolite.cli", *args]


async def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:1;mem:256", name="piped")
        master = cluster.server.http_address

        # The reader is gone before the command writes: its first write fails.
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            process = await asyncio.create_subprocess_exec(
                *_cli("agents", "--json", "--master", master),
                stdout=write_end,
                stderr=asyncio.subprocess.PIPE,
                env=_env(),
            )
        finally:
            os.close(write_end)
        _, err = await within(process.communicate(), 60, "mesolite agents into a closed pipe")
        assert process.returncode == 141, err.decode()
        assert not any(word in err.decode() for word in QUIET), err.decode()

        # `mesolite agents --watch 0.1 --json | head -n1`: head leaves after one line.
        read_end, write_end = os.pipe()
        try:
            cli = await asyncio.create_subprocess_exec(
                *_cli("agents", "--json", "--watch", "0.1", "--master", master),
                stdout=write_end,
                stderr=asyncio.subprocess.PIPE,
                env=_env(),
            )
            head = await asyncio.create_subprocess_exec(
                "head", "-n1", stdin=read_end, stdout=asyncio.subprocess.PIPE
            )
        finally:
            os.close(read_end)
            os.close(write_end)
        try:
            line, _ = await within(head.communicate(), 60, "head to read one line")
            assert json.loads(line)[0]["hostname"] == "piped"
            _, err = await within(cli.communicate(), 30, "mesolite to notice head left")
        finally:
            for p in (cli, head):
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        assert cli.returncode == 141, err.decode()
        assert not any(word in err.decode() for word in QUIET), err.decode()


async def test_ctrl_c_ends_the_command_quietly() -> None:
    """A master that accepts the connection and never answers: the command waits; Ctrl-C."""
    connected = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        connected.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for args in (("state",), ("teardown", "some-framework")):
            connected.clear()
            process = await asyncio.create_subprocess_exec(
                *_cli(*args, "--master", f"127.0.0.1:{port}"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=_env(),
            )
            try:
                await within(connected.wait(), 60, "the command to connect")
                process.send_signal(signal.SIGINT)
                out, err = await within(process.communicate(), 30, "the command to stop")
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            assert process.returncode == 130, (args, err.decode())
            assert not any(word in err.decode() for word in QUIET), err.decode()
            assert out == b""
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
