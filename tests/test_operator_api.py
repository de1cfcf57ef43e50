"""Operators act, over real HTTP: `mesolite kill` and `mesolite teardown` run as
subprocesses against a real cluster; the history they leave in `mesolite frameworks
--all` and `mesolite tasks --all`; with TLS, who may (the ACLs' teardown_frameworks
and kill_tasks) and who may not; every refusal counted in
mesolite_calls_rejected_total, a refused SUBSCRIBE included."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc
import pytest

from mesolite import certs, grpc_utils
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.master.metrics import MasterMetrics
from mesolite.master.operator_api import MAX_BODY
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import FAST, LocalCluster
from tests.recording import RecordingFramework, running
from tests.test_cli_views import mesolite
from tests.waiting import wait_for_condition, within

SLEEP = Resources(cpus=0.5, mem=32)


def rejected(metrics: MasterMetrics, call: str) -> float:
    value = metrics.registry.get_sample_value("mesolite_calls_rejected_total", {"call": call})
    assert value is not None
    return value


async def test_kill_and_teardown_from_the_command_line_leave_a_history(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:4;mem:1024")
        http = cluster.server.http_address
        fw = RecordingFramework("sweep")
        run = asyncio.create_task(fw.run(cluster.address))
        try:
            await wait_for_condition(lambda: fw.connected, what="the framework to subscribe")
            offer = await fw.next_offer()
            tasks = [
                TaskSpec("victim", "sleep 60", SLEEP),
                TaskSpec("keeper", "sleep 60", SLEEP),
                TaskSpec("broken", "exit 3", SLEEP),
            ]
            await fw.launch(offer, tasks)
            await fw.wait_state("victim", TaskState.RUNNING)
            await fw.wait_state("keeper", TaskState.RUNNING)
            await fw.wait_state("broken", TaskState.FAILED)
            framework_id = fw.framework_id
            assert framework_id is not None

            code, out, err = await mesolite("kill", framework_id, "victim", "--master", http)
            assert (code, err) == (0, ""), err
            assert "kill of task victim sent to agent" in out
            await fw.wait_state("victim", TaskState.KILLED)
            assert fw.states("keeper")[-1] is TaskState.RUNNING

            refusals = [
                (("kill", framework_id, "broken"), "has already ended: TASK_FAILED"),
                (("kill", framework_id, "nope"), "has no task 'nope'"),
                (("teardown", "no-such-framework"), "is not known to this master"),
            ]
            for args, reason in refusals:
                code, out, err = await mesolite(*args, "--master", http)
                assert code == 1 and out == "", (args, out, err)
                assert reason in err and "Traceback" not in err, err
            # A page in the operator's browser cannot do it: no form posts.
            url = f"http://{http}/api/v1/frameworks/{framework_id}/teardown"
            async with aiohttp.ClientSession() as session:
                async with session.post(url, data={"x": "1"}) as response:
                    assert response.status == 415
                big = b"{" + b" " * MAX_BODY + b"}"  # a body is bounded
                json_type = {"Content-Type": "application/json"}
                async with session.post(url, data=big, headers=json_type) as response:
                    assert response.status == 413
            assert framework_id in cluster.master.frameworks

            code, out, err = await mesolite("teardown", framework_id, "--master", http, "--json")
            assert code == 0, err
            assert json.loads(out)["tasks_killed"] == 1  # the keeper
            await wait_for_condition(
                lambda: framework_id in cluster.master.completed_frameworks,
                what="the torn-down framework to be removed",
            )
            # Its stream ended: the framework's process learns it was torn down (its
            # re-subscription is refused), and hears no more updates (as in Mesos).
            await within(asyncio.wait({run}), 20, "the framework's run() to end")

            code, _, err = await mesolite("teardown", framework_id, "--master", http)
            assert code == 1 and "has already ended: torn down by an anonymous operator" in err

            code, out, err = await mesolite("frameworks", "--all", "--master", http)
            assert code == 0, err
            [line] = [ln for ln in out.splitlines() if framework_id in ln]
            for part in ("sweep", "torn down by an anonymous operator", "1 failed", "2 killed"):
                assert part in line, line
            code, out, err = await mesolite("frameworks", "--master", http)
            assert framework_id not in out and "1 completed: --all shows them" in out

            code, out, err = await mesolite("tasks", "--all", "--json", "--master", http)
            assert code == 0, err
            document = json.loads(out)
            assert document["tasks"] == []
            ended = {t["id"]: t for t in document["completed_tasks"]}
            assert ended["broken"]["exit_code"] == 3 and ended["broken"]["state"] == "TASK_FAILED"
            assert ended["victim"]["state"] == ended["keeper"]["state"] == "TASK_KILLED"
            assert all(t["ended_at"] and t["framework_id"] == framework_id for t in ended.values())
            code, out, _ = await mesolite("tasks", "--master", http)  # asks for no history
            assert "no running tasks; 3 ended: --all shows them" in out and "broken" not in out
            code, out, _ = await mesolite("tasks", "--all", "--master", http)
            [line] = [ln for ln in out.splitlines() if ln.startswith("broken")]
            assert "sweep" in line and "FAILED" in line and " 3 " in line and "ago" in line

            metrics = cluster.master.metrics
            assert rejected(metrics, "operator_kill") == 2
            assert rejected(metrics, "operator_teardown") == 4  # unknown, a form, big, ended
            assert rejected(metrics, "subscribe") >= 1  # the torn-down framework came back
        finally:
            await fw.stop()
            await asyncio.gather(run, return_exceptions=True)


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, principals=["framework", "admin", "other"], tokens=["ci"])
    return directory


async def test_only_who_the_acls_allow_may_act(tmp_path: Path, cluster_certs: Path) -> None:
    acls = tmp_path / "acls.json"
    only_admin = [{"principals": {"values": ["admin"]}, "framework_principals": {"type": "ANY"}}]
    acls.write_text(
        json.dumps(
            {
                "register_frameworks": [{"principals": {"values": ["framework"]}}],
                "register_agents": [{"principals": {"values": ["agent"]}}],
                "view_state": [{"principals": {"type": "ANY"}}],
                "teardown_frameworks": only_admin,
                "kill_tasks": [
                    *only_admin,
                    # "other" may kill the tasks of its own frameworks only.
                    {
                        "principals": {"values": ["other"]},
                        "framework_principals": {"values": ["other"]},
                    },
                ],
            }
        )
    )
    config = replace(FAST, acls_file=acls)
    async with LocalCluster(tmp_path / "cluster", config, certs=cluster_certs) as cluster:
        await cluster.add_agent("cpus:2;mem:512")
        http = cluster.server.http_address
        fw = RecordingFramework("guarded", tls=cluster.bundle("framework"))
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.launch(offer, [TaskSpec("web-1", "sleep 60", SLEEP)])
            await fw.wait_state("web-1", TaskState.RUNNING)
            framework_id = fw.framework_id
            assert framework_id is not None

            def bundle(name: str) -> tuple[str, ...]:
                return ("--master", http, "--tls-dir", str(cluster_certs / name))

            attempts = [
                (("teardown", framework_id, *bundle("framework")), "may not teardown_frameworks"),
                (("kill", framework_id, "web-1", *bundle("other")), "may not kill_tasks"),
                (("kill", framework_id, "web-1", *bundle("ci")), "may not kill_tasks"),  # token
                (
                    (
                        "teardown",
                        framework_id,
                        "--master",
                        http,
                        "--ca",
                        str(cluster_certs / "ca.crt"),
                    ),
                    "the master wants a principal",
                ),
            ]
            for args, reason in attempts:
                code, out, err = await mesolite(*args)
                assert code == 1 and out == "" and reason in err, (args, err)
            assert fw.states("web-1")[-1] is TaskState.RUNNING
            assert cluster.master.frameworks[framework_id].removing is False

            code, out, err = await mesolite("kill", framework_id, "web-1", *bundle("admin"))
            assert code == 0, err
            await fw.wait_state("web-1", TaskState.KILLED)
            metrics = cluster.master.metrics
            assert rejected(metrics, "operator_teardown") == 2
            assert rejected(metrics, "operator_kill") == 2


async def test_a_refused_subscribe_is_counted(tmp_path: Path) -> None:
    """SUBSCRIBE refused (an unknown framework id), and a stream that does not start with
    SUBSCRIBE: each counted in mesolite_calls_rejected_total."""
    Call = scheduler_pb2.Call
    info = scheduler_pb2.FrameworkInfo(name="gone", framework_id="no-such-framework")
    async with LocalCluster(tmp_path) as cluster:
        channel = grpc_utils.create_channel(cluster.address)
        try:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for first, code in (
                (Call(subscribe=Call.Subscribe(framework_info=info)), grpc.StatusCode.NOT_FOUND),
                (Call(revive=Call.Revive()), grpc.StatusCode.INVALID_ARGUMENT),
            ):
                call = stub.Connect(iter([first]), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as ended:
                    async for _ in call:
                        pass
                assert ended.value.code() == code
        finally:
            await channel.close()
        metrics = cluster.master.metrics
        assert rejected(metrics, "subscribe") == 1
        assert rejected(metrics, "revive") == 1
