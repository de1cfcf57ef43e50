"""End to end: a real master, real agents and real frameworks over gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from examples.batch import BatchFramework, BatchSpec
from mesolite.framework_sdk import Offer, Resources, TaskSpec, TaskState
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition


def by_name(state: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(f for f in state["frameworks"] if f["name"] == name)


async def test_drf_paper_example_settles_at_three_and_two_tasks(tmp_path: Path) -> None:
    # DRF paper: one machine <9 CPUs, 18 GB>; A runs <1 CPU, 4 GB> tasks, B <3 CPUs, 1 GB>.
    async with LocalCluster(tmp_path) as cluster:
        a = BatchFramework(
            BatchSpec(name="A", cpus=1, mem=4096, tasks=0, command="sleep 120"),
            out=lambda line: None,
        )
        b = BatchFramework(
            BatchSpec(name="B", cpus=3, mem=1024, tasks=0, command="sleep 120"),
            out=lambda line: None,
        )
        async with running(a, cluster.address), running(b, cluster.address):
            # Both subscribe before there is anything to offer, as in the paper.
            await cluster.add_agent("cpus:9;mem:18432")

            def cpus_in_use() -> float:
                return float(sum(t.spec.resources["cpus"] for t in cluster.master.tasks()))

            await wait_for_condition(lambda: cpus_in_use() == 9, what="all 9 CPUs in use")
            state = await cluster.state()
            counts = {f["name"]: f["running_tasks"] for f in state["frameworks"]}
            assert counts == {"A": 3, "B": 2}
            await wait_for_condition(
                lambda: sum(1 for t in cluster.master.tasks() if t.state is TaskState.RUNNING) == 5,
                what="five tasks running",
            )
            state = await cluster.state()
            total = state["cluster"]["total"]
            a_used, b_used = by_name(state, "A")["used"], by_name(state, "B")["used"]
            assert a_used == {"cpus": 3.0, "mem": 12288.0}
            assert b_used == {"cpus": 6.0, "mem": 2048.0}
            assert a_used["mem"] / total["mem"] == pytest.approx(2 / 3)
            assert b_used["cpus"] / total["cpus"] == pytest.approx(2 / 3)
            assert all(t["state"] == "TASK_RUNNING" for t in state["tasks"])


async def test_resources_are_reoffered_as_soon_as_a_task_finishes(tmp_path: Path) -> None:
    # An allocation interval far longer than the test: only the prompt re-offer
    # after each finished task lets three one-CPU tasks run one after another.
    async with LocalCluster(tmp_path, fast(allocation_interval=120.0)) as cluster:
        await cluster.add_agent("cpus:1;mem:1024")
        lines: list[str] = []
        batch = BatchFramework(
            BatchSpec(name="seq", cpus=1, mem=128, tasks=3, command="true"), out=lines.append
        )
        started = time.monotonic()
        async with running(batch, cluster.address):
            await wait_for_condition(lambda: batch.done, timeout=30, what="three tasks")
        assert batch.stats.finished == 3 and batch.stats.failed == 0
        assert time.monotonic() - started < 60


async def test_decline_filter_is_honoured_then_expires(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:2048")
        fw = RecordingFramework("decliner")
        other = RecordingFramework("other")
        async with running(fw, cluster.address):
            first = await fw.next_offer(agent_id=agent.agent_id)
            declined_at = time.monotonic()
            await fw.decline(first, refuse_seconds=2.0)
            seen = len(fw.offers)
            async with running(other, cluster.address):
                # Meanwhile the agent's resources go to the other framework...
                got = await other.next_offer(agent_id=agent.agent_id)
                assert got.resources == first.resources
                await other.decline(got, refuse_seconds=3600)
                # ...and come back to the decliner only when its filter has expired.
                again = await fw.next_offer(after=seen, agent_id=agent.agent_id)
                waited = fw.offers[-1][0] - declined_at
                assert again.resources == first.resources
                assert waited >= 2.0 - 0.05, f"re-offered after {waited:.2f}s"


async def test_killing_a_task(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:2048")
        fw = RecordingFramework()
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.launch(offer, [TaskSpec("sleeper", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("sleeper", TaskState.RUNNING)
            await fw.kill("sleeper")
            await fw.wait_state("sleeper", TaskState.KILLED)
            assert fw.states("sleeper") == [TaskState.STARTING, TaskState.RUNNING, TaskState.KILLED]
            state = await cluster.state()
            assert state["tasks"] == []
            assert agent.running_tasks() == []


async def test_agent_killed_its_tasks_are_lost_and_resources_leave(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:1;mem:1024")
        doomed = await cluster.spawn_agent("cpus:4;mem:4096", name="doomed")
        doomed_id = next(
            a.agent_id for a in cluster.master.agents.values() if a.hostname == "doomed"
        )
        fw = RecordingFramework()
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=doomed_id)
            await fw.launch(offer, [TaskSpec("t1", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("t1", TaskState.RUNNING)
            assert (await cluster.state())["cluster"]["total"]["cpus"] == 5.0

            doomed.kill()
            await doomed.process.wait()
            await cluster.time_out_agents(doomed_id)
            await fw.wait_state("t1", TaskState.LOST)
            lost = next(u for u in fw.updates if u.state is TaskState.LOST)
            assert lost.agent_id == doomed_id and "removed" in lost.message
            await wait_for_condition(lambda: doomed_id in fw.lost_agents, what="agent failure")
            state = await cluster.state()
            assert state["cluster"]["total"]["cpus"] == 1.0
            assert doomed_id not in [a["id"] for a in state["agents"]]
            assert doomed_id in state["removed_agents"]
            assert state["tasks"] == []


async def test_failover_within_timeout_keeps_tasks(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:2048")
        id_file = tmp_path / "durable.id"
        fw = RecordingFramework("durable", failover_timeout=60, id_file=id_file)
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.launch(offer, [TaskSpec("keep", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("keep", TaskState.RUNNING)
        framework_id = fw.framework_id
        assert framework_id
        state = await cluster.state()
        assert by_name(state, "durable")["connected"] is False
        assert by_name(state, "durable")["running_tasks"] == 1

        assert id_file.read_text() == framework_id
        # A new process, the same id file: it fails over to the old framework.
        again = RecordingFramework("durable", failover_timeout=60, id_file=id_file)
        assert again.framework_id == framework_id
        async with running(again, cluster.address):
            assert again.framework_id == framework_id
            # The SDK reconciles after subscribing: the task is reported running.
            await again.wait_state("keep", TaskState.RUNNING)
            state = await cluster.state()
            assert by_name(state, "durable")["connected"] is True
            assert by_name(state, "durable")["running_tasks"] == 1


async def test_failover_timeout_kills_tasks_and_removes_framework(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:2048")
        fw = RecordingFramework("shortlived", failover_timeout=0.5)
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.launch(offer, [TaskSpec("doomed", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("doomed", TaskState.RUNNING)
        await wait_for_condition(lambda: not cluster.master.frameworks, what="teardown")
        await wait_for_condition(lambda: agent.running_tasks() == [], what="task killed")
        state = await cluster.state()
        assert state["frameworks"] == [] and state["tasks"] == []
        assert state["cluster"]["allocated"] == {}


async def test_suppress_and_revive(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:2048")
        fw = RecordingFramework()
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.suppress()
            await fw.decline(offer, refuse_seconds=0)
            seen = len(fw.offers)
            # A second framework gets the resources: proof that cycles ran meanwhile.
            other = RecordingFramework("other")
            async with running(other, cluster.address):
                got = await other.next_offer()
                await other.decline(got, refuse_seconds=3600)
                assert len(fw.offers) == seen
                await fw.revive()
                await fw.next_offer(after=seen)


async def test_agent_keeps_tasks_and_reregisters_when_master_restarts(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:2048")
        fw = RecordingFramework("survivor", failover_timeout=300)
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            await fw.launch(offer, [TaskSpec("long", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("long", TaskState.RUNNING)
        port = cluster.server.port
        await cluster.server.stop(grace=0.1)
        cluster.server = type(cluster.server)(cluster.config, "127.0.0.1", port, 0)
        await cluster.server.start()
        await wait_for_condition(
            lambda: agent.agent_id in cluster.master.agents, what="the agent to re-register"
        )
        state = await cluster.state()
        assert [t["id"] for t in state["tasks"]] == ["long"]
        assert state["agents"][0]["allocated"] == {"cpus": 1.0, "mem": 64.0}
        assert [t.task.task_id for t in agent.running_tasks()] == ["long"]


async def test_readme_hello_framework_runs_its_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.hello_framework import Hello

    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:1;mem:256")
        hello = Hello(count=3)
        await asyncio.wait_for(hello.run(cluster.address), 30)  # returns after teardown
        finished = [
            line for line in capsys.readouterr().out.splitlines() if "TASK_FINISHED 0" in line
        ]
        assert len(finished) == 3
        assert cluster.master.frameworks == {}


async def test_teardown_frees_resources_only_when_the_tasks_have_ended(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:1024")
        leaving = RecordingFramework("leaving")
        cpus_offered_while_leaving_existed: list[bool] = []

        class Staying(RecordingFramework):
            async def on_offers(self, offers: list[Offer]) -> None:
                for o in offers:
                    if o.resources.get_amount("cpus") > 0:
                        present = leaving.framework_id in cluster.master.frameworks
                        cpus_offered_while_leaving_existed.append(present)
                await super().on_offers(offers)

        staying = Staying("staying")
        async with running(leaving, cluster.address):
            offer = await leaving.next_offer()
            # Ignores SIGTERM: it dies only at SIGKILL, a grace period after the kill.
            stubborn = TaskSpec("stubborn", "trap '' TERM; sleep 60", Resources(cpus=2, mem=64))
            await leaving.launch(offer, [stubborn])
            await leaving.wait_state("stubborn", TaskState.RUNNING)
            async with running(staying, cluster.address):
                await leaving.teardown()
                await wait_for_condition(
                    lambda: bool(cpus_offered_while_leaving_existed), what="CPUs offered"
                )
                # Offered only once the stubborn task was gone, so a launch fits.
                assert cpus_offered_while_leaving_existed == [False]
                offer = next(o for _, o in staying.offers if o.resources.get_amount("cpus") == 2)
                task = TaskSpec("next", "sleep 60", Resources(cpus=2, mem=64))
                await staying.launch(offer, [task])
                await staying.wait_state("next", TaskState.RUNNING)
