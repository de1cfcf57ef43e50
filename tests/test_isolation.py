"""Containment on this machine's real cgroups (issue 12): limits, kills that end
everything a task started, an unprivileged user with a clean environment, records a
task cannot read, and the process-tree fallback, forced.

Every test puts its cgroups under a root of its own (`cgroup_root`), removed after
it; the tests that need cgroups are skipped where the agent cannot create them (not
root, no usable hierarchy)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite.agent._cgroups import (
    CgroupError,
    CgroupSystem,
    Limits,
    parse_mounts,
    scope_name,
)
from mesolite.agent._procs import process_start_time
from mesolite.agent._task_env import task_environment
from mesolite.agent._task_wrapper import parse_args
from mesolite.agent.errors import AgentError
from mesolite.agent.isolation import (
    Container,
    IsolationConfig,
    IsolationMode,
    Isolator,
    TaskUser,
    unreachable_ancestor,
)
from mesolite.agent.tasks import TaskRunner
from mesolite.model import TaskSpec, TaskState
from mesolite.resources import Resources
from tests.support.cgroups import leftover, remove_tree
from tests.support.checkpoints import checkpoint_at
from tests.support.spawn_shim import shim as shim  # the fixture: the C helper, the sh shim
from tests.support.spawn_shim import shim_binary as shim_binary
from tests.test_agent_tasks import Recorder
from tests.waiting import wait_for_condition

FW = "fw-1"
GRACE = 0.5
NOBODY = pwd.getpwnam("nobody")
# Touches every page: 200 MB, far above the limits below.
HOG = "python3 -c \"b = b'x' * (200 << 20)\""


def _cgroups_usable() -> bool:
    if os.geteuid() != 0:
        return False
    root = f"mesolite-probe-{uuid.uuid4().hex[:8]}"
    try:
        CgroupSystem.open(root, Path("/probe"))
    except CgroupError:
        return False
    finally:
        remove_tree(root)
    return True


CGROUPS = _cgroups_usable()
needs_cgroups = pytest.mark.skipif(not CGROUPS, reason="the agent cannot create cgroups here")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    root = f"mesolite-test-iso-{uuid.uuid4().hex[:10]}"
    yield root
    remove_tree(root)
    assert leftover(root) == []


MakeRunner = Callable[..., TaskRunner]


@pytest.fixture
async def make_runner(
    tmp_path: Path, cgroup_root: str, recorder: Recorder
) -> AsyncIterator[MakeRunner]:
    """TaskRunners on one work dir with an isolator made from `IsolationConfig(**settings)`;
    each is shut down after the test, and must have left no cgroup but its scope."""
    runners: list[TaskRunner] = []

    def make(**settings: Any) -> TaskRunner:
        config = IsolationConfig(cgroups_root=cgroup_root, **settings)
        runner = TaskRunner(
            tmp_path, recorder, kill_grace_period=GRACE, isolator=Isolator(config, tmp_path)
        )
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        await runner.shutdown()
    # Every task's cgroup is gone; only the agent's scope is left until it stops.
    assert {p.name for p in leftover(cgroup_root)} <= {cgroup_root, scope_name(tmp_path)}
    for runner in runners:
        runner.close()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def spec(task_id: str, command: str, *, cpus: float = 0.5, mem: float = 64, **env: str) -> TaskSpec:
    return TaskSpec(task_id, command, Resources(cpus=cpus, mem=mem), environment=env)


def container_of(runner: TaskRunner, task_id: str) -> Container:
    record = checkpoint_at(runner.records_path(FW, task_id))
    return Container.from_record(record["container"])


def alive(pid: int) -> bool:
    return process_start_time(pid) is not None


async def wait_file(path: Path) -> str:
    await wait_for_condition(
        lambda: path.exists() and path.read_text().strip() != "", what=str(path)
    )
    return path.read_text().strip()


# Limits: memory, pids, CPU.


@needs_cgroups
async def test_a_memory_hog_is_killed_by_its_limit_and_fails_saying_so(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("hog", HOG, mem=48))
    final = await recorder.wait_final("hog")

    assert final.state is TaskState.FAILED
    assert final.reason == "REASON_CONTAINER_LIMITATION_MEMORY"
    assert "memory limit of 48 MB reached: the kernel killed a process" in final.message
    peak = re.search(r"peak ([\d.]+) MB", final.message)
    assert peak is not None and 40 <= float(peak.group(1)) <= 49, final.message
    assert final.exit_code == 137  # SIGKILLed, as the shell reports it


@needs_cgroups
async def test_a_task_within_its_limit_is_left_alone(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("fits", "python3 -c \"b = b'x' * (20 << 20)\"", mem=96))
    final = await recorder.wait_final("fits")
    assert (final.state, final.reason) == (TaskState.FINISHED, "")


@needs_cgroups
async def test_a_fork_bomb_is_stopped_by_the_pids_limit(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(pids_limit=16)
    runner.launch(FW, spec("bomb", "while :; do sleep 60 & done"))
    final = await recorder.wait_final("bomb")

    # The shell cannot fork the 16th process and gives up (dash exits 2).
    assert final.state is TaskState.FAILED
    assert final.reason == "REASON_CONTAINER_LIMITATION"
    assert final.message.startswith("pids limit of 16 reached:"), final.message


@needs_cgroups
async def test_limits_are_written_from_the_tasks_resources(
    shim: str, make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(pids_limit=100)
    runner.launch(FW, spec("t", "sleep 60", cpus=0.25, mem=40))
    await recorder.wait_state("t", TaskState.RUNNING)
    container = container_of(runner, "t")
    assert container.cgroup is not None
    dirs = container.cgroup.dirs
    if container.cgroup.version == 1:
        assert (dirs["memory"] / "memory.limit_in_bytes").read_text().strip() == str(40 << 20)
        assert (dirs["cpu"] / "cpu.shares").read_text().strip() == "256"
        assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "-1"  # no hard limit
        assert (dirs["pids"] / "pids.max").read_text().strip() == "100"
    else:
        assert (dirs["memory"] / "memory.max").read_text().strip() == str(40 << 20)
        assert (dirs["pids"] / "pids.max").read_text().strip() == "100"
    # The command is in the cgroup: spawned by the supervisor, the very process the
    # checkpoint names (its shim joined before it said so, so by TASK_RUNNING); with a
    # wrapper, not the wrapper.
    cgroup = container.cgroup
    pid = _wrapper_pid(runner, "t")
    if _launcher(runner, "t") == "spawn":
        assert pid in cgroup.pids()
    else:
        pids = cgroup.pids()
        assert pids and pid not in pids


@needs_cgroups
async def test_a_command_starts_at_a_pids_limit_of_one(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    # Nothing but the command counts against its limit (the supervisor never steps
    # into a task's cgroup): it alone fits a limit of 1.
    runner = make_runner(pids_limit=1)
    runner.launch(FW, spec("one", "echo started"))  # a builtin: no fork
    final = await recorder.wait_final("one")
    assert final.state is TaskState.FINISHED, final
    assert (runner.sandbox_path(FW, "one") / "stdout").read_text() == "started\n"


def _launcher(runner: TaskRunner, task_id: str) -> str:
    launcher = checkpoint_at(runner.records_path(FW, task_id))
    return str(launcher.get("launcher", "wrapper"))


def _wrapper_pid(runner: TaskRunner, task_id: str) -> int:
    pid = checkpoint_at(runner.records_path(FW, task_id))["pid"]
    assert isinstance(pid, int)
    return pid


def _cpu_seconds(container: Container) -> float:
    stats = container.stats()
    assert stats is not None and stats.cpu_seconds is not None
    return stats.cpu_seconds


@needs_cgroups
async def test_a_cpu_hog_is_held_to_its_cpus_with_a_hard_limit(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(cpu_hard_limit=True)
    runner.launch(FW, spec("spin", "while :; do :; done", cpus=0.2))
    await recorder.wait_state("spin", TaskState.RUNNING)
    container = container_of(runner, "spin")
    assert container.cgroup is not None
    start_cpu, start = _cpu_seconds(container), time.monotonic()
    await asyncio.sleep(3.0)  # measuring a rate takes time
    used = (_cpu_seconds(container) - start_cpu) / (time.monotonic() - start)

    assert 0.02 < used <= 0.2 * 1.3, f"used {used:.3f} CPUs with a quota of 0.2"
    stats = container.stats()
    assert stats is not None and stats.throttled_seconds  # the quota held it back
    runner.kill(FW, "spin")
    assert (await recorder.wait_final("spin")).state is TaskState.KILLED


@needs_cgroups
async def test_a_task_killed_before_it_started_leaves_no_cgroup(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("t", "sleep 60"))
    runner.kill(FW, "t")  # before its wrapper exists
    final = await recorder.wait_final("t")
    assert (final.state, final.message) == (TaskState.KILLED, "killed before it started")
    # (make_runner's teardown checks that no task's cgroup is left)


# A kill ends everything the task started.

ESCAPE = "setsid sh -c 'echo $$ > escaped; exec sleep 60' &"


@needs_cgroups
async def test_a_kill_ends_a_child_that_left_with_setsid(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("t", f"{ESCAPE} sleep 60"))
    escaped = int(await wait_file(runner.sandbox_path(FW, "t") / "escaped"))
    assert os.getsid(escaped) != os.getsid(_wrapper_pid(runner, "t"))  # not in the task's session
    container = container_of(runner, "t")

    runner.kill(FW, "t")
    assert (await recorder.wait_final("t")).state is TaskState.KILLED
    await wait_for_condition(lambda: not alive(escaped), timeout=5, what="the escaped child")
    assert container.cgroup is not None and not container.cgroup.exists()


@needs_cgroups
async def test_a_double_forked_child_ends_with_the_task(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    command = f"({ESCAPE}); while [ ! -s escaped ]; do sleep 0.02; done; exit 0"
    runner.launch(FW, spec("t", command))
    final = await recorder.wait_final("t")
    assert final.state is TaskState.FINISHED
    escaped = int((runner.sandbox_path(FW, "t") / "escaped").read_text())
    await wait_for_condition(lambda: not alive(escaped), timeout=5, what="the orphan")


# Least privilege: the task's user, environment and files.


@needs_root
async def test_a_task_runs_as_the_task_user_in_a_sandbox_it_owns(
    shim: str, make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("t", "id -u > uid; id -g > gid; touch mine"))
    assert (await recorder.wait_final("t")).state is TaskState.FINISHED
    sandbox = runner.sandbox_path(FW, "t")
    assert (sandbox / "uid").read_text().strip() == str(NOBODY.pw_uid)
    assert (sandbox / "gid").read_text().strip() == str(NOBODY.pw_gid)
    for path in (sandbox, sandbox / "stdout", sandbox / "stderr", sandbox / "mine"):
        assert path.stat().st_uid == NOBODY.pw_uid, path


@needs_root
async def test_without_a_task_user_tasks_run_as_the_agent(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(task_user=None)
    runner.launch(FW, spec("t", "id -u > uid"))
    assert (await recorder.wait_final("t")).state is TaskState.FINISHED
    assert (runner.sandbox_path(FW, "t") / "uid").read_text().strip() == "0"


async def test_a_task_gets_a_clean_environment(
    make_runner: MakeRunner, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "agent-secret")
    monkeypatch.setenv("SOME_TOKEN", "agent-token")
    monkeypatch.setenv("PASSED_ON", "yes")
    monkeypatch.setenv("TZ", "UTC")
    runner = make_runner(pass_env=("PASSED_ON",))
    runner.launch(FW, spec("t", "env > env.txt", OWN="mine", HOME="/elsewhere"))
    assert (await recorder.wait_final("t")).state is TaskState.FINISHED
    sandbox = runner.sandbox_path(FW, "t")
    env = dict(
        line.split("=", 1) for line in (sandbox / "env.txt").read_text().splitlines() if "=" in line
    )

    assert "agent-secret" not in (sandbox / "env.txt").read_text()
    assert "agent-token" not in (sandbox / "env.txt").read_text()
    assert env["OWN"] == "mine"
    assert env["HOME"] == "/elsewhere"  # the task's own variables win
    assert env["PASSED_ON"] == "yes" and env["TZ"] == "UTC"
    assert env["MESOLITE_TASK_ID"] == "t" and env["MESOLITE_SANDBOX"] == str(sandbox)
    assert env["PATH"] == os.environ["PATH"]
    expected = {"PATH", "TZ", "HOME", "USER", "LOGNAME", "OWN", "PASSED_ON", "PWD", "SHLVL"}
    expected |= {"MESOLITE_FRAMEWORK_ID", "MESOLITE_TASK_ID", "MESOLITE_SANDBOX"}
    expected |= {"MESOS_FRAMEWORK_ID", "MESOS_TASK_ID", "MESOS_EXECUTOR_ID", "MESOS_SANDBOX"}
    expected |= {"MESOS_DIRECTORY"}
    expected |= {n for n in ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE") if n in os.environ}
    assert set(env) <= expected, set(env) - expected


def test_the_environment_is_built_from_the_allowlist_only() -> None:
    env = task_environment(
        {"PATH": "/bin", "SECRET": "x", "LANG": "C"},
        task_env={"A": "1", "MESOLITE_TASK_ID": "forged"},
        sandbox=Path("/s"),
        user="nobody",
        framework_id="f",
        task_id="t",
    )
    assert env == {
        "PATH": "/bin",
        "LANG": "C",
        "HOME": "/s",
        "USER": "nobody",
        "LOGNAME": "nobody",
        "A": "1",
        "MESOLITE_FRAMEWORK_ID": "f",
        "MESOLITE_TASK_ID": "t",
        "MESOLITE_SANDBOX": "/s",
        "MESOS_FRAMEWORK_ID": "f",
        "MESOS_TASK_ID": "t",
        "MESOS_EXECUTOR_ID": "t",
        "MESOS_SANDBOX": "/s",
        "MESOS_DIRECTORY": "/s",
    }


@needs_root
async def test_a_task_cannot_read_another_tasks_records(
    make_runner: MakeRunner, recorder: Recorder, tmp_path: Path
) -> None:
    runner = make_runner()
    runner.launch(FW, spec("victim", "sleep 60", API_TOKEN="victim-secret"))
    await recorder.wait_state("victim", TaskState.RUNNING)
    task_log = tmp_path / "tasks.jsonl"
    assert "victim-secret" in task_log.read_text()  # it is on disk, in the agent's task log
    assert task_log.stat().st_mode & 0o777 == 0o600
    thief = (
        f"cat {task_log}; "
        f"cat {runner.sandbox_path(FW, 'victim')}/../../../tasks.jsonl; "
        "grep -r victim-secret ../.. ; true"
    )
    runner.launch(FW, spec("thief", thief))
    assert (await recorder.wait_final("thief")).state is TaskState.FINISHED

    out = runner.sandbox_path(FW, "thief")
    assert "victim-secret" not in (out / "stdout").read_text()
    assert (out / "stderr").read_text().count("Permission denied") >= 3
    assert sorted(p.name for p in runner.sandbox_path(FW, "victim").iterdir()) == [
        "stderr",
        "stdout",
    ]


# Restarts: a recovered task keeps its cgroup; cgroups no task owns are killed.


@needs_cgroups
async def test_a_restarted_runner_kills_cgroups_no_task_owns(
    make_runner: MakeRunner, recorder: Recorder, tmp_path: Path
) -> None:
    first = make_runner()
    first.launch(FW, spec("t", "sleep 60"))
    await recorder.wait_state("t", TaskState.RUNNING)
    container = container_of(first, "t")
    assert container.cgroup is not None
    command = container.cgroup.pids()  # sh and its sleep
    assert command
    # As if the agent had died after creating the cgroup but before checkpointing it:
    # a cgroup, with a live process, that no checkpoint names.
    (tmp_path / "tasks.jsonl").unlink()

    second = make_runner()
    await second.recover({})
    assert second.running_tasks() == []
    await wait_for_condition(
        lambda: not any(alive(p) for p in command), timeout=5, what="the orphans to die"
    )
    assert not container.cgroup.exists()


# The fallback, forced: rlimits and a process-tree kill.


async def test_the_fallback_ends_a_setsid_child_on_kill(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(mode="process-tree")
    assert runner.isolator.mode is IsolationMode.PROCESS_TREE
    assert runner.isolator.describe() == "process-tree (process-tree isolation asked for)"
    runner.launch(FW, spec("t", f"{ESCAPE} sleep 60"))
    escaped = int(await wait_file(runner.sandbox_path(FW, "t") / "escaped"))

    runner.kill(FW, "t")
    assert (await recorder.wait_final("t")).state is TaskState.KILLED
    await wait_for_condition(lambda: not alive(escaped), timeout=5, what="the escaped child")
    # A wrapper's records (its exit.json) are the agent's: tasks cannot enter them.
    assert runner.records_path(FW, "t").parent.parent.stat().st_mode & 0o777 == 0o700


async def test_the_fallback_ends_a_double_forked_child_with_the_task(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(mode="process-tree")
    command = f"({ESCAPE}); while [ ! -s escaped ]; do sleep 0.02; done; exit 0"
    runner.launch(FW, spec("t", command))
    assert (await recorder.wait_final("t")).state is TaskState.FINISHED
    escaped = int((runner.sandbox_path(FW, "t") / "escaped").read_text())
    await wait_for_condition(lambda: not alive(escaped), timeout=5, what="the orphan")


async def test_the_fallback_limits_memory_per_process(
    make_runner: MakeRunner, recorder: Recorder
) -> None:
    runner = make_runner(mode="process-tree")
    runner.launch(FW, spec("hog", HOG, mem=64))
    final = await recorder.wait_final("hog")
    # The allocation fails (RLIMIT_DATA) rather than the kernel killing the task.
    assert (final.state, final.reason) == (TaskState.FAILED, "")
    assert "MemoryError" in (runner.sandbox_path(FW, "hog") / "stderr").read_text()
    assert runner.isolator.create("x", {"mem": 64}, None).cgroup is None


# Settings and the cgroup v2 code path (on a fake hierarchy: this machine has v1).


def test_a_work_dir_the_task_user_cannot_reach_is_found() -> None:
    user = TaskUser("nobody", NOBODY.pw_uid, NOBODY.pw_gid, (NOBODY.pw_gid,))
    # Under /tmp itself: pytest's own directories are 0700, closed to anyone but root.
    top = Path(f"/tmp/mesolite-reach-{uuid.uuid4().hex[:8]}")
    (top / "closed" / "work").mkdir(parents=True)
    try:
        top.chmod(0o755)
        (top / "closed").chmod(0o700)
        assert unreachable_ancestor(top / "closed" / "work" / "sandboxes", user) == top / "closed"
        (top / "closed").chmod(0o711)  # search, not list: enough
        assert unreachable_ancestor(top / "closed" / "work" / "sandboxes", user) is None
    finally:
        shutil.rmtree(top)


def test_unusable_settings_stop_the_agent_from_starting(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="unknown isolation mode"):
        Isolator(IsolationConfig(mode="jail"), tmp_path)
    if os.geteuid() == 0:
        with pytest.raises(AgentError, match="no such task user"):
            Isolator(IsolationConfig(mode="process-tree", task_user="no-such-user-x"), tmp_path)
    for root in ("../escape", "a/./b", "", "a b"):
        with pytest.raises(AgentError, match=r"cgroups asked for.*invalid cgroups root"):
            Isolator(IsolationConfig(mode="cgroups", cgroups_root=root), tmp_path)


def test_mounts_are_read_per_controller() -> None:
    v2, v1 = parse_mounts(
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
        "proc /proc proc rw 0 0\n"
    )
    assert v2 == Path("/sys/fs/cgroup/unified")
    assert v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
    }


def test_no_usable_hierarchy_is_an_error_that_says_why(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /x/memory cgroup rw,memory 0 0\n")
    with pytest.raises(CgroupError, match="no cgroup v1 hierarchy for cpu, pids"):
        CgroupSystem.open("mesolite", tmp_path, mounts_file=mounts)


def test_cgroup_v2_on_a_fake_hierarchy(tmp_path: Path) -> None:
    """v2: controllers handed down each level, limits in v2's files, figures read back."""
    mount = tmp_path / "cgroup2"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (mount / "cgroup.subtree_control").write_text("")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {mount} cgroup2 rw 0 0\n")

    system = CgroupSystem.open("mesolite", tmp_path / "work", mounts_file=mounts)
    scope = mount / "mesolite" / scope_name(tmp_path / "work")
    assert system.version == 2 and scope.is_dir()
    assert (mount / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (scope / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"

    limits = Limits.for_resources({"cpus": 0.5, "mem": 64}, hard_cpu=True, pids=50)
    cgroup = system.create("run-1", limits)
    d = scope / "run-1"
    assert cgroup.paths == [d]
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "cpu.weight").read_text() == "20"  # 512 shares
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert (d / "pids.max").read_text() == "50"
    assert system.children() == {"run-1"}

    (d / "memory.current").write_text("1048576\n")
    (d / "memory.peak").write_text("2097152\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (d / "cpu.stat").write_text("usage_usec 1500000\nnr_throttled 4\nthrottled_usec 250000\n")
    (d / "pids.current").write_text("3\n")
    (d / "pids.events").write_text("max 0\n")
    stats = cgroup.stats()
    assert (stats.mem_bytes, stats.mem_peak_bytes, stats.oom_kills) == (1 << 20, 2 << 20, 1)
    assert (stats.cpu_seconds, stats.throttled_seconds) == (1.5, 0.25)
    assert (stats.processes, stats.pids_limit_hits) == (3, 0)
    container = Container(IsolationMode.CGROUPS_V2, limits, cgroup)
    limitation = container.limitation(stats)
    assert limitation is not None and limitation.reason == "REASON_CONTAINER_LIMITATION_MEMORY"
    # What a run's end reads: the limits hit, and the same limitation from them.
    hit = cgroup.limits_hit()
    assert (hit.oom_kills, hit.mem_peak_bytes, hit.pids_limit_hits) == (1, 2 << 20, 0)
    assert container.limitation(hit) == limitation
    assert Container.from_record(json.loads(json.dumps(container.record()))) == container


def test_limits_follow_mesos_minimums() -> None:
    tiny = Limits.for_resources({"cpus": 0.001}, hard_cpu=True, pids=None)
    assert (tiny.mem_mb, tiny.cpus, tiny.cpu_shares, tiny.cfs_quota_us) == (32, 0.01, 10, 1000)
    assert Limits.for_resources({"cpus": 2, "mem": 100}, hard_cpu=False, pids=1).cpu_shares == 2048


def test_the_wrapper_reads_its_confinement() -> None:
    parsed = parse_args(
        [
            *("/r", "--ready-fd", "5", "--cgroup", "/c/a", "--cgroup", "/c/b"),
            *("--user", "65534:65534:1,2", "--rlimit", "data=1024", "--subreaper"),
            *("--", "sh", "-c", "true"),
        ]
    )
    assert parsed is not None
    records, ready, confine, argv = parsed
    assert (records, ready, argv) == (Path("/r"), 5, ["sh", "-c", "true"])
    assert confine.cgroups == [Path("/c/a"), Path("/c/b")]
    assert confine.user == (65534, 65534, [1, 2])
    assert confine.rlimits == {"data": 1024} and confine.subreaper
    assert parse_args(["/r", "--rlimit", "nproc=1", "--", "true"]) is None
    assert parse_args(["/r", "--user", "x", "--", "true"]) is None


def test_a_command_that_cannot_be_confined_does_not_run(tmp_path: Path) -> None:
    """The wrapper fails closed: no cgroup to join, no command."""
    wrapper = Path(__file__).parent.parent / "agent" / "_task_wrapper.py"
    missing = tmp_path / "no-such-cgroup"
    result = subprocess.run(
        [
            *(sys.executable, "-I", str(wrapper), str(tmp_path), "--cgroup", str(missing)),
            *("--", "sh", "-c", "touch ran"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert not (tmp_path / "ran").exists()
    assert "cannot confine the command" in result.stderr
    assert "could not confine" in (tmp_path / "exit.json").read_text()
