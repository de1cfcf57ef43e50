"""Preemption over real gRPC: a real task is preempted for a guaranteed role, its
framework told first and the kill only after the grace period, seen in /state and
/metrics, its end TASK_KILLED with REASON_CONTAINER_PREEMPTED."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from examples.batch import BatchFramework, BatchSpec
from mesolite.master.preemptions import REASON_PREEMPTED
from mesolite.model import TaskState, TaskStatus
from tests.cluster import LocalCluster, fast
from tests.recording import running
from tests.waiting import wait_for_condition

GRACE = 3.0
ROLES = """
[roles.gold]
guarantee = { cpus = 2 }
min_share_timeout = 1
"""


class Recorded(BatchFramework):
    def __init__(self, name: str, role: str) -> None:
        spec = BatchSpec(
            name=name, role=role, cpus=1, mem=64, tasks=0, command="sleep 300", tasks_per_offer=0
        )
        super().__init__(spec, out=lambda line: None)
        self.told: dict[str, tuple[float, float, str]] = {}  # task -> (when, grace, for role)
        self.ended: dict[str, tuple[float, TaskStatus]] = {}

    async def on_preemption(
        self, task_id: str, agent_id: str, grace_seconds: float, for_role: str
    ) -> None:
        self.told[task_id] = (time.monotonic(), grace_seconds, for_role)

    async def on_update(self, status: TaskStatus) -> None:
        if status.state.is_terminal:
            self.ended[status.task_id] = (time.monotonic(), status)
        await super().on_update(status)


async def test_a_real_task_is_preempted_after_its_grace_period(tmp_path: Path) -> None:
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLES)
    config = fast(roles_file=roles, preemption_grace=GRACE)
    async with (
        LocalCluster(tmp_path, config) as cluster,
        aiohttp.ClientSession() as http,
    ):
        star = Recorded("first", "*")
        async with running(star, cluster.address):
            await cluster.add_agent("cpus:4;mem:4096", name="a0")
            await wait_for_condition(
                lambda: sum(1 for t in cluster.master.tasks() if t.state is TaskState.RUNNING) == 4,
                what="the first framework to run 4 tasks",
            )
            gold = Recorded("gold", "gold")
            async with running(gold, cluster.address):
                await wait_for_condition(lambda: len(star.told) == 2, what="2 tasks told")
                assert {g for _, g, _ in star.told.values()} == {GRACE}
                assert {r for _, _, r in star.told.values()} == {"gold"}
                # Told first: in /state, being preempted, the grace not yet over.
                state = await cluster.state()
                marked = [t for t in state["tasks"] if t["preempting"] is not None]
                assert {t["id"] for t in marked} == set(star.told)
                assert all(t["preempting"]["for_role"] == "gold" for t in marked)
                assert all(0 < t["preempting"]["kill_in"] <= GRACE for t in marked)
                assert all(t["state"] == "TASK_RUNNING" for t in marked)
                async with http.get(f"{cluster.server.http_url}/metrics") as r:
                    assert "mesolite_tasks_preempting 2.0" in await r.text()
                await wait_for_condition(
                    lambda: set(star.ended) >= set(star.told), what="the preempted tasks to end"
                )
                for task_id, (told_at, _, _) in star.told.items():
                    ended_at, status = star.ended[task_id]
                    assert status.state is TaskState.KILLED
                    assert status.reason == REASON_PREEMPTED
                    assert ended_at - told_at >= GRACE - 0.5  # killed after its grace
                await wait_for_condition(
                    lambda: (
                        sum(
                            1
                            for t in cluster.master.tasks()
                            if t.framework_id == gold.framework_id and t.state is TaskState.RUNNING
                        )
                        == 2
                    ),
                    what="gold to run its 2 guaranteed tasks",
                )
                async with http.get(f"{cluster.server.http_url}/metrics") as r:
                    text = await r.text()
                assert 'mesolite_preemptions_total{kind="min_share"} 2.0' in text
                assert "mesolite_tasks_preempting 0.0" in text
