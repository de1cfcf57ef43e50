"""A Unix user per framework (issue 12's follow-up; Mesos' `FrameworkInfo.user`, the
`run_tasks` ACL and `--switch_user`): a framework names its tasks' user, the master
lets it only where the ACLs do (at SUBSCRIBE), keeps it (registry) and sends it with
every launch; an agent run as root runs the task as that user, in a sandbox only that
user may enter, and keeps the user across its own restart.

The agent tests need root and two real unprivileged accounts, made for each test and
deleted after it (`unix_users`, tests/support/accounts.py); they are skipped
otherwise. The cross-team attack over TLS with the README's ACLs is
`tests/test_attack_review.py::test_a_task_of_one_team_cannot_read_another_teams_output_or_environment`.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mesolite import certs
from mesolite.agent.isolation import IsolationConfig, Isolator, TaskUser, TaskUserError
from mesolite.agent.tasks import TaskRunner
from mesolite.framework_sdk import FrameworkRejected, Resources, TaskSpec, TaskState
from mesolite.master import messages as msg
from mesolite.master import validation
from mesolite.master.acl import AclError, may_run_tasks_as, parse_acls
from mesolite.master.errors import Refusal
from mesolite.master.read_model import build_snapshot
from mesolite.model import FrameworkInfo
from mesolite.tls import TlsConfig
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.support.cgroups import leftover, remove_tree
from tests.support.checkpoints import checkpoint_at
from tests.support.core import CoreHarness
from tests.test_agent_tasks import Recorder
from tests.test_isolation_cluster import start_agent, wait_connected
from tests.test_master_trust import refused, with_acls
from tests.waiting import wait_for_condition, within

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
NOBODY = pwd.getpwnam("nobody")
MISSING = "mesolite-no-such-user"


# What a user may be, and who may name which: pure ---------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("user", ["alice", "team_a", "svc-etl", "a.b", "_x", "host$", "A" * 32])
def test_a_unix_account_name_is_a_valid_user(user: str) -> None:
    assert validation.framework_info_problem(FrameworkInfo("fw", "*", user=user)) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("user", "says"),
    [
        ("-rf", "invalid user '-rf': a Unix account name"),
        ("1000", "invalid user '1000'"),
        ("a b", "invalid user 'a b'"),
        ("../etc", "invalid user '../etc'"),
        ("a$b", "invalid user 'a$b'"),
        ("élise", "invalid user 'élise'"),
        ("a" * 33, "longer than 32 characters"),
        ("root\n", "holds control characters"),
        ("x\x1b[31m", "holds control characters"),
        ("a\u200bb", "holds control characters"),
    ],
)
def test_an_invalid_user_is_refused_saying_why(user: str, says: str) -> None:
    problem = validation.framework_info_problem(FrameworkInfo("fw", "*", user=user))
    assert problem is not None and says in problem, problem


ACLS: dict[str, Any] = {
    "register_frameworks": [{"principals": {"type": "ANY"}, "roles": {"type": "ANY"}}],
    "register_agents": [{"principals": {"type": "ANY"}}],
    "run_tasks": [
        {"principals": {"values": ["team-a"]}, "users": {"values": ["alice", "root"]}},
        {"principals": {"values": ["team-b"]}, "users": {"type": "ANY"}},
        {"principals": {"values": ["mallory"]}, "users": {"type": "NONE"}},
    ],
}


@pytest.mark.unit
def test_run_tasks_allows_a_principal_its_users_and_root_only_by_name() -> None:
    acls = parse_acls(ACLS)
    allowed = [
        ("team-a", "alice"),
        ("team-a", "root"),  # named
        ("team-b", "bob"),  # ANY...
        ("mallory", ""),  # no user: the agents' --task-user, no entry needed
        (None, ""),
    ]
    denied = [
        ("team-a", "bob"),
        ("team-b", "root"),  # ...but root only by name
        ("mallory", "alice"),  # NONE
        ("eve", "alice"),  # no entry decides
        (None, "alice"),  # anonymous matches ANY only
    ]
    assert [may_run_tasks_as(acls, p, u) for p, u in allowed] == [True] * len(allowed)
    assert [may_run_tasks_as(acls, p, u) for p, u in denied] == [False] * len(denied)
    permissive = parse_acls({"permissive": True})
    assert may_run_tasks_as(permissive, "eve", "alice")
    assert not may_run_tasks_as(permissive, "eve", "root")
    # Without an ACL file everything is allowed, as Mesos, but root.
    assert may_run_tasks_as(None, "eve", "alice") and may_run_tasks_as(None, None, "")
    assert not may_run_tasks_as(None, "eve", "root")
    with pytest.raises(AclError, match=r"run_tasks\[0\] has unknown keys \['roles'\]"):
        parse_acls({"run_tasks": [{"principals": {"type": "ANY"}, "roles": {"type": "ANY"}}]})


# The master: checked at SUBSCRIBE, kept, sent with each launch -------------------


@pytest.mark.unit
def test_a_framework_may_name_only_a_user_the_acls_allow_and_a_refusal_changes_nothing(
    tmp_path: Path,
) -> None:
    core = with_acls(tmp_path, ACLS)
    fw = core.subscribe("etl", principal="team-a", user="alice")
    core.add_agent()
    core.allocate_for(fw)
    before = core.state()
    for principal, user in [("team-a", "bob"), ("team-b", "root"), ("mallory", "alice")]:
        error = refused(
            Refusal.FORBIDDEN, lambda p=principal, u=user: core.subscribe(principal=p, user=u)
        )
        assert str(error) == f"principal {principal!r} may not run tasks as user {user!r} " + (
            "(the ACLs' run_tasks)"
        )
    error = refused(Refusal.INVALID, lambda: core.subscribe(principal="team-b", user="-rf"))
    assert "invalid user '-rf'" in str(error)
    # Its user is the framework's for good: not changed, not dropped, on re-subscription.
    for user in ("root", ""):
        error = refused(
            Refusal.INVALID,
            lambda u=user: core.subscribe(
                "etl", framework_id=fw.framework_id, principal="team-a", user=u
            ),
        )
        assert "runs its tasks as user 'alice'" in str(error)
    assert core.state() == before
    assert not fw.peer.closed
    core.resubscribe(fw, principal="team-a")  # the same user: fine


@pytest.mark.unit
def test_every_launch_carries_its_frameworks_user(core: CoreHarness) -> None:
    named = core.subscribe("named", user="alice")
    plain = core.subscribe("plain")
    agent = core.add_agent("cpus:1;mem:256")
    for fw, task_id in [(named, "t1"), (plain, "t2")]:
        [offer] = core.allocate_for(fw)
        core.launch(fw, offer, task_id, "cpus:0.5;mem:128")
    launches = {launch.task.task_id: launch.user for launch in agent.peer.take(msg.LaunchTask)}
    assert launches == {"t1": "alice", "t2": ""}
    shown = {f.name: f.user for f in build_snapshot(core.master).frameworks}
    assert shown == {"named": "alice", "plain": ""}


@pytest.mark.unit
def test_the_user_survives_a_master_restart(core: CoreHarness) -> None:
    fw = core.subscribe("etl", failover=60, user="alice")
    agent = core.add_agent("cpus:2;mem:256")
    [offer] = core.allocate_for(fw)
    t1 = core.launch(fw, offer, "t1", "cpus:1;mem:128")

    new = core.restart()
    assert new.master.frameworks[fw.framework_id].info.user == "alice"
    refused(
        Refusal.INVALID, lambda: new.subscribe("etl", failover=60, framework_id=fw.framework_id)
    )
    fw = new.resubscribe(fw)
    agent = new.add_agent("cpus:2;mem:256", agent.agent_id, running=(new.running(fw, t1),))
    [offer] = new.allocate_for(fw)
    new.launch(fw, offer, "t2", "cpus:1;mem:128")
    [launch] = agent.peer.take(msg.LaunchTask)
    assert (launch.task.task_id, launch.user) == ("t2", "alice")


@pytest.mark.unit
def test_new_acls_end_the_stream_of_a_framework_whose_user_they_no_longer_allow(
    tmp_path: Path,
) -> None:
    core = with_acls(tmp_path, ACLS)
    fw = core.subscribe(principal="team-a", user="alice")
    plain = core.subscribe(principal="team-a")
    narrower = {**ACLS, "run_tasks": ACLS["run_tasks"][1:]}
    (tmp_path / "acls.json").write_text(json.dumps(narrower))
    assert core.master.reload_acls() is True
    assert fw.peer.closed and not plain.peer.closed
    refused(Refusal.FORBIDDEN, lambda: core.resubscribe(fw, principal="team-a"))


# Over the wire, with TLS and an ACL file: PERMISSION_DENIED, nothing registered ----


@pytest.fixture(scope="module")
def team_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, principals=["team-a", "admin"])
    return directory


async def test_a_framework_naming_a_user_its_principal_may_not_use_is_refused(
    tmp_path: Path, team_certs: Path
) -> None:
    acls = tmp_path / "acls.json"
    team_a = {"principals": {"values": ["team-a"]}, "users": {"values": ["alice"]}}
    admin = {"principals": {"values": ["admin"]}}
    acls.write_text(json.dumps({**ACLS, "run_tasks": [team_a], "view_state": [admin]}))
    config = fast(acls_file=acls)
    async with LocalCluster(tmp_path, config, certs=team_certs) as cluster:
        tls = TlsConfig.from_dir(team_certs / "team-a")
        for user in ("bob", "root"):
            fw = RecordingFramework("etl", tls=tls, user=user)
            with pytest.raises(FrameworkRejected, match="PERMISSION_DENIED") as e:
                await within(fw.run(cluster.address), 20, "the framework to give up")
            assert f"may not run tasks as user {user!r}" in str(e.value)
        assert cluster.master.frameworks == {}
        assert cluster.master.registry.frameworks() == []
        assert (await cluster.state())["frameworks"] == []
        fw = RecordingFramework("etl", tls=tls, user="alice")
        async with running(fw, cluster.address):
            [shown] = (await cluster.state())["frameworks"]
            assert (shown["id"], shown["user"]) == (fw.framework_id, "alice")


# The agent: each framework's tasks as its user, in a sandbox only it enters ------


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    root = f"mesolite-test-users-{uuid.uuid4().hex[:10]}"
    yield root
    remove_tree(root)
    assert leftover(root) == []


@pytest.fixture
async def runner(tmp_path: Path, cgroup_root: str, recorder: Recorder) -> AsyncIterator[TaskRunner]:
    """A task runner as the agent has it: cgroups where it can, tasks as `nobody`."""
    isolator = Isolator(IsolationConfig(cgroups_root=cgroup_root), tmp_path)
    runner = TaskRunner(tmp_path, recorder, kill_grace_period=0.5, isolator=isolator)
    yield runner
    await runner.shutdown()
    runner.close()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def spec(task_id: str, command: str, **env: str) -> TaskSpec:
    return TaskSpec(task_id, command, Resources(cpus=0.1, mem=64), environment=env)


def mode_and_owner(path: Path) -> tuple[int, str]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name


@needs_root
async def test_each_frameworks_tasks_run_as_its_user_in_a_sandbox_only_it_enters(
    runner: TaskRunner, recorder: Recorder, tmp_path: Path, unix_users: tuple[str, str]
) -> None:
    user_a, user_b = unix_users
    who = "id -un > who; echo $USER > user"
    runner.launch(
        "fw-a", spec("secret", f"{who}; echo $$ > pid; exec sleep 60", KEY="A-KEY"), user_a
    )
    runner.launch("fw-plain", spec("plain", who))  # names no user: the task user
    await recorder.wait_state("secret", TaskState.RUNNING)
    assert (await recorder.wait_final("plain")).state is TaskState.FINISHED
    sandbox_a = runner.sandbox_path("fw-a", "secret")
    await wait_for_condition(lambda: (sandbox_a / "pid").exists(), what="A's pid")
    pid_a = int((sandbox_a / "pid").read_text())
    # Team B's task tries A's output and A's environment by their paths.
    thief = f"cat {sandbox_a}/stdout ../../fw-a/secret/who; cat /proc/{pid_a}/environ; true"
    runner.launch("fw-b", spec("thief", f"{who}; {thief}"), user_b)
    assert (await recorder.wait_final("thief")).state is TaskState.FINISHED

    sandbox_b = runner.sandbox_path("fw-b", "thief")
    plain = runner.sandbox_path("fw-plain", "plain")
    for sandbox, user in [(sandbox_a, user_a), (sandbox_b, user_b), (plain, "nobody")]:
        assert (sandbox / "who").read_text().strip() == user
        assert (sandbox / "user").read_text().strip() == user
        assert mode_and_owner(sandbox) == (0o700, user)
        assert mode_and_owner(sandbox / "stdout")[1] == user
    # The directories above the sandboxes are root's, for passing through only.
    for directory in (tmp_path / "sandboxes", sandbox_a.parent, sandbox_b.parent):
        assert mode_and_owner(directory) == (0o711, "root"), directory
    stderr = (sandbox_b / "stderr").read_text()
    assert "A-KEY" not in (sandbox_b / "stdout").read_text()
    assert stderr.count("Permission denied") == 3, stderr
    # A's process runs as A's user, its environment its own.
    assert f"Uid:\t{pwd.getpwnam(user_a).pw_uid}" in Path(f"/proc/{pid_a}/status").read_text()


@needs_root
async def test_a_user_missing_on_the_agent_fails_the_task_saying_so(
    runner: TaskRunner, recorder: Recorder
) -> None:
    runner.launch("fw", spec("t", "touch ran"), MISSING)
    final = await recorder.wait_final("t")
    assert final.state is TaskState.FAILED
    assert final.message == (
        f"user {MISSING!r} does not exist on this agent: a framework's user must exist on "
        "every agent its tasks run on"
    )
    assert not runner.sandbox_path("fw", "t").exists()  # nothing ran, nothing was made


@needs_root
def test_root_by_another_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolator = Isolator(IsolationConfig(mode="process-tree"), tmp_path, announce=False)
    monkeypatch.setattr(TaskUser, "lookup", classmethod(lambda cls, name: cls(name, 0, 0, (0,))))
    with pytest.raises(TaskUserError, match="'toor' is root \\(uid 0\\) by another name"):
        isolator.user_for("toor")
    assert isolator.user_for("root") == TaskUser("root", 0, 0, (0,))


@needs_root
def test_an_agent_that_does_not_switch_users_runs_every_task_as_itself(tmp_path: Path) -> None:
    isolator = Isolator(IsolationConfig(mode="process-tree", task_user=None), tmp_path)
    assert isolator.user_for("nobody") is None and isolator.user_for(MISSING) is None
    default = Isolator(IsolationConfig(mode="process-tree"), tmp_path)
    assert default.user_for("") == TaskUser.lookup("nobody")


# End to end: a real agent, over gRPC ---------------------------------------------


@needs_root
async def test_a_framework_user_runs_its_tasks_end_to_end_and_the_agents_files_stay_closed(
    tmp_path: Path, unix_users: tuple[str, str]
) -> None:
    user, _ = unix_users
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:512")
        named = RecordingFramework("named", user=user)
        missing = RecordingFramework("missing", user=MISSING)
        async with running(named, cluster.address), running(missing, cluster.address):
            offer = await named.next_offer(agent_id=agent.agent_id)
            await named.launch(offer, [spec("who", "id -un")])
            offer = await missing.next_offer(agent_id=agent.agent_id)
            await missing.launch(offer, [spec("nope", "true")])
            await named.wait_state("who", TaskState.FINISHED)
            await missing.wait_state("nope", TaskState.FAILED)
            [failed] = [u for u in missing.updates if u.state is TaskState.FAILED]
            assert f"user {MISSING!r} does not exist on this agent" in failed.message
            assert named.framework_id is not None
            work_dir = agent.config.work_dir
            stdout = work_dir / "sandboxes" / named.framework_id / "who" / "stdout"
            assert stdout.read_text().strip() == user
            state = await cluster.state()
            assert {f["name"]: f["user"] for f in state["frameworks"]} == {
                "named": user,
                "missing": MISSING,
            }
            # The agent's own files: its work dir may be passed, not listed; the rest 0600.
            assert mode_and_owner(work_dir) == (0o711, "root")
            for name in ("agent.json", "status_updates.jsonl"):
                assert mode_and_owner(work_dir / name) == (0o600, "root"), name


@needs_root
async def test_a_restarted_agent_keeps_each_tasks_user(
    tmp_path: Path, cgroup_root: str, unix_users: tuple[str, str]
) -> None:
    user, _ = unix_users
    uid = pwd.getpwnam(user).pw_uid
    async with LocalCluster(tmp_path, fast(agent_timeout=30)) as cluster:
        work_dir = tmp_path / "agent"
        first = await start_agent(cluster, work_dir, cgroup_root)
        agent_id = await wait_connected(cluster)
        fw = RecordingFramework("etl", failover_timeout=60, user=user)
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent_id)
            await fw.launch(offer, [spec("long", "echo $$ > pid; exec sleep 60")])
            await fw.wait_state("long", TaskState.RUNNING)
            assert fw.framework_id is not None
            sandbox = work_dir / "sandboxes" / fw.framework_id / "long"
            records = work_dir / "meta" / fw.framework_id / "long"
            await wait_for_condition(lambda: (sandbox / "pid").exists(), what="the task's pid")
            pid = int((sandbox / "pid").read_text())

            first.process.send_signal(signal.SIGKILL)
            assert await within(first.process.wait(), 10) == -signal.SIGKILL
            # Its stream gone first: a kill must reach the restarted agent, not the dead one.
            await wait_for_condition(
                lambda: not cluster.master.agents[agent_id].connected, what="the stream to end"
            )
            await start_agent(cluster, work_dir, cgroup_root)
            assert await wait_connected(cluster) == agent_id
            # Re-attached, the task still runs as its framework's user, and the
            # restarted agent's checkpoint still says so...
            assert f"Uid:\t{uid}" in Path(f"/proc/{pid}/status").read_text()
            record = checkpoint_at(records)
            assert (record["user"], record["container"]["user"]["uid"]) == (user, uid)
            # ...through to its end, written by the restarted agent.
            await fw.kill("long")
            await fw.wait_state("long", TaskState.KILLED)
            await wait_for_condition(
                lambda: checkpoint_at(records)["state"] == "TASK_KILLED",
                what="the end's checkpoint",
            )
            record = checkpoint_at(records)
            assert (record["user"], record["container"]["user"]["name"]) == (user, user)
