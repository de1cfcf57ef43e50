"""The agent's sandbox server shows a task's own output and nothing else.

A task owns its sandbox directory and can put anything there under the names
`stdout` and `stderr`. A hard link to another file of the agent's machine
(`ln -f /etc/hostname stderr`) was served; so was a file swapped in between the
server's check and its read. Symbolic links were already refused (test_ui.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from mesolite.agent.sandbox_http import create_sandbox_app, read_chunk
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from tests.cluster import LocalCluster
from tests.recording import RecordingFramework, running
from tests.support.cgroups import TEST_ISOLATION

SECRET = "the agent's own file: not for any task"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "agent-only" / "hostname"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    path = tmp_path / "work" / "sandboxes" / "fw" / "task"
    path.mkdir(parents=True)
    (path / "stdout").write_text("the task's own output\n")
    return path


async def test_a_task_that_hard_links_a_file_as_its_stderr_does_not_get_it_shown(
    tmp_path: Path, secret: Path
) -> None:
    async with LocalCluster(tmp_path) as cluster, aiohttp.ClientSession() as http:
        # Tasks as root (--no-switch-user), so the link is made: run as the task user,
        # the kernel refuses it (protected hard links), and that is not what is tested.
        as_root = replace(TEST_ISOLATION, task_user=None)
        agent = await cluster.add_agent("cpus:1;mem:256", isolation=as_root)
        fw = RecordingFramework("linker")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            # The sandbox is the task's working directory; its stderr is already open.
            command = f"echo mine; ln -f {secret} stderr"
            await fw.launch(offer, [TaskSpec("link-1", command, Resources(cpus=1, mem=32))])
            await fw.wait_state("link-1", TaskState.FINISHED)
            sandbox = f"/agents/{agent.agent_id}/sandbox/{fw.framework_id}/link-1"
            base = f"http://{cluster.server.http_address}{sandbox}"
            assert os.stat(secret).st_nlink == 2  # the task did make the link
            async with http.get(f"{base}/stderr") as response:
                assert SECRET not in await response.text()
                assert response.status == 404
            async with http.get(f"{base}/stdout") as response:
                assert response.status == 200
                assert await response.text() == "mine\n"


async def test_hard_linked_files_are_not_served(sandbox: Path, secret: Path) -> None:
    os.link(secret, sandbox / "stderr")
    app = create_sandbox_app(sandbox.parents[2])
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/sandbox/fw/task/stderr")
        assert response.status == 404
        assert SECRET not in await response.text()
        response = await client.get("/sandbox/fw/task/stdout")
        assert response.status == 200
        assert await response.text() == "the task's own output\n"
    # A task's own file linked from elsewhere has two names too: refused as well.
    os.link(sandbox / "stdout", sandbox.parent / "copy")
    assert read_chunk(sandbox.parents[1], "fw", "task", "stdout", None, 100) is None


@pytest.fixture
def swap_on_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[], Any]], None]]:
    """Run an action just before the sandbox server opens a file named stdout (the
    window between its check and its open), once."""
    real_open = os.open
    actions: list[Callable[[], Any]] = []

    def opening(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if Path(path).name == "stdout" and actions:
            actions.pop()()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", opening)  # as sandbox_http calls it
    yield actions.append


def test_a_file_swapped_for_another_between_check_and_open_is_refused(
    sandbox: Path, secret: Path, swap_on_open: Callable[[Callable[[], Any]], None]
) -> None:
    def swap() -> None:
        (sandbox / "other").write_text("swapped in")
        os.replace(sandbox / "other", sandbox / "stdout")

    swap_on_open(swap)
    assert read_chunk(sandbox.parents[1], "fw", "task", "stdout", None, 100) is None
    # Not refused for ever: a second read (no swap) serves the file now there.
    chunk = read_chunk(sandbox.parents[1], "fw", "task", "stdout", None, 100)
    assert chunk is not None and chunk.data == b"swapped in"


def test_a_file_swapped_for_a_hard_link_between_check_and_open_is_refused(
    sandbox: Path, secret: Path, swap_on_open: Callable[[Callable[[], Any]], None]
) -> None:
    def swap() -> None:
        os.link(secret, sandbox / "link")
        os.replace(sandbox / "link", sandbox / "stdout")

    swap_on_open(swap)
    assert read_chunk(sandbox.parents[1], "fw", "task", "stdout", None, 100) is None


def test_linked_directories_and_dot_segments_are_not_followed(sandbox: Path, secret: Path) -> None:
    sandboxes = sandbox.parents[1]
    (secret.parent / "stdout").write_text(SECRET)
    (sandboxes / "fw" / "linked").symlink_to(secret.parent)
    (sandboxes / "fwlink").symlink_to(sandboxes / "fw")
    for framework_id, task_id in [("fw", "linked"), ("fwlink", "task"), ("..", "agent-only")]:
        assert read_chunk(sandboxes, framework_id, task_id, "stdout", None, 100) is None
    assert read_chunk(sandboxes, "fw", "task", "task.json", None, 100) is None
    assert read_chunk(sandboxes.parent / "missing", "fw", "task", "stdout", None, 100) is None
