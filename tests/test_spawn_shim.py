"""What stands between the supervisor's posix_spawn and a task's command, both ways
(`tests/support/spawn_shim.py`): the C exec helper (`agent/spawn_shim.c`) and the
``/bin/sh`` shim with setpriv. Each puts the command in every one of its cgroups as
its user, says "PID" on fd 3 only once it has, and where it cannot, says why there
and never runs the command. And the supervisor falls back to the shim where the
helper is absent."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mesolite.agent import _supervisor
from mesolite.agent._cgroups import CgroupSystem, Limits, parse_mounts
from tests.support.cgroups import remove_tree
from tests.support.spawn_shim import shim as shim  # the fixture: both ways
from tests.support.spawn_shim import shim_binary as shim_binary
from tests.test_agent_supervisor import connect, read_messages
from tests.test_agent_supervisor import supervisor_dir as supervisor_dir
from tests.test_agent_supervisor import work_dir as work_dir
from tests.test_isolation import CGROUPS

pytestmark = pytest.mark.integration
needs_cgroups = pytest.mark.skipif(not CGROUPS, reason="the agent cannot create cgroups here")
NOBODY = 65534
ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def cgroups() -> Iterator[list[Path]]:
    """A task's cgroup directories (one per hierarchy the agent uses), removed after."""
    root = f"mesolite-test-shim-{uuid.uuid4().hex[:10]}"
    try:
        system = CgroupSystem.open(root, Path("/shim"))
        yield system.create("task", Limits(64.0, 1.0, False, None)).paths
    finally:
        remove_tree(root)


def spawn_request(
    cgroups: list[Path], user: tuple[int, int, list[int]] | None, command: str, cwd: Path
) -> _supervisor.Spawn:
    return _supervisor.Spawn(
        1, "r", str(cwd), [str(c) for c in cgroups], user, ["/bin/sh", "-c", command], ENV,
        str(cwd),
    )  # fmt: skip


def run(argv: list[str], cwd: Path) -> tuple[int, list[str], int]:
    """Spawned as the supervisor spawns: its pid, the lines on fd 3, its wait status."""
    read, write = os.pipe2(os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.chdir(cwd)
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            ENV,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, write, 3),
            ],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    finally:
        os.chdir("/")
        os.close(write)
        os.close(devnull)
    with os.fdopen(read, "rb") as report:
        lines = report.read().decode().splitlines()  # to EOF: until it exits or execs
    _, status = os.waitpid(pid, 0)
    return pid, lines, status


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/PID/cgroup: controller ("" for v2) -> path."""
    paths = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


@needs_cgroups
def test_the_command_is_in_every_cgroup_as_its_user_before_it_is_ready(
    shim: str, cgroups: list[Path], tmp_path: Path
) -> None:
    tmp_path.chmod(0o777)
    command = "cat /proc/self/cgroup > cg; id -u > uid; id -g > gid; id -G > groups"
    request = spawn_request(cgroups, (NOBODY, NOBODY, [NOBODY, 1]), command, tmp_path)
    argv = request.shim_argv(shim)
    assert argv[0] == (shim or _supervisor.SHELL)
    pid, lines, status = run(argv, tmp_path)
    assert lines == [str(pid)] and os.waitstatus_to_exitcode(status) == 0
    _, v1 = parse_mounts(Path("/proc/self/mounts").read_text())
    joined = own_cgroups((tmp_path / "cg").read_text())
    for directory in cgroups:  # <mount>/<root>/<scope>/<name>, each in its hierarchy
        mount = directory.parents[2]
        controller = next((c for c, m in v1.items() if m == mount), "")
        assert joined[controller] == "/" + str(directory.relative_to(mount)), controller
    assert (tmp_path / "uid").read_text().split() == [str(NOBODY)]
    assert (tmp_path / "gid").read_text().split() == [str(NOBODY)]
    assert sorted((tmp_path / "groups").read_text().split()) == sorted(["1", str(NOBODY)])
    assert (tmp_path / "cg").stat().st_uid == NOBODY


@needs_cgroups
def test_a_command_that_cannot_join_one_cgroup_never_runs_and_says_why(
    shim: str, cgroups: list[Path], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-cgroup"
    request = spawn_request([cgroups[0], missing, *cgroups[1:]], None, "touch ran", tmp_path)
    pid, lines, status = run(request.shim_argv(shim), tmp_path)
    assert len(lines) == 1 and lines[0].startswith(f"{pid} cannot join the cgroup {missing}")
    assert os.waitstatus_to_exitcode(status) == 127
    assert not (tmp_path / "ran").exists()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may enter and write to (pytest's own are root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="mesolite-test-shim-"))
    directory.chmod(0o777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_the_c_helper_says_why_it_cannot_become_the_user(shim_binary: str, open_dir: Path) -> None:
    # Not root, it cannot become root: refused, said on fd 3, and the command never runs.
    helper = shutil.copy(shim_binary, open_dir / "spawn_shim")
    read, write = os.pipe()
    argv = [str(helper), "--", "0", "0", "", "--", "/bin/sh", "-c", "touch ran"]
    tmp_path = open_dir
    child = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=ENV,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        close_fds=False,
        preexec_fn=lambda: os.dup2(write, 3),
    )
    os.close(write)
    with os.fdopen(read, "rb") as report:
        lines = report.read().decode().splitlines()
    assert child.wait(timeout=20) == 127
    assert len(lines) == 1 and lines[0].startswith(f"{child.pid} cannot set the groups")
    assert not (tmp_path / "ran").exists()


def test_the_fallback_is_the_sh_shim_where_the_helper_is_absent(tmp_path: Path) -> None:
    absent, plain, helper = tmp_path / "absent", tmp_path / "plain", tmp_path / "helper"
    plain.write_text("")
    helper.write_text("")
    helper.chmod(0o755)
    env = _supervisor.SHIM_ENV
    assert _supervisor.exec_helper({env: str(absent)}) == ""
    assert _supervisor.exec_helper({env: str(plain)}) == ""  # not executable
    assert _supervisor.exec_helper({env: "sh"}) == ""
    assert _supervisor.exec_helper({env: str(helper)}) == str(helper)
    built = Path(_supervisor.__file__).absolute().parent / "spawn_shim"
    assert _supervisor.exec_helper({}) == (str(built) if os.access(built, os.X_OK) else "")
    request = spawn_request([tmp_path], None, "true", tmp_path)
    assert request.shim_argv("")[:3] == [_supervisor.SHELL, "-c", _supervisor.SHIM]


@pytest.mark.parametrize("which", ["absent", "helper"])
def test_the_supervisor_says_which_way_it_spawns(
    which: str, shim_binary: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    named = shim_binary if which == "helper" else str(Path(shim_binary).parent / "absent")
    monkeypatch.setenv(_supervisor.SHIM_ENV, named)
    directory: Path = request.getfixturevalue("supervisor_dir")
    with connect(directory) as sock:
        [*_, hello] = read_messages(sock, "hello")
    assert hello["shim"] == (shim_binary if which == "helper" else "sh")
    assert hello["spawn"] is (which == "helper" or bool(_supervisor.SETPRIV))
