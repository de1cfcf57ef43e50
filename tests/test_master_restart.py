"""The master killed with SIGKILL and started again on the same work dir."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from mesolite.framework_sdk import FrameworkRejected, Resources, TaskSpec, TaskState
from tests.cluster import AgentProcess, MasterProcess, spawn_agent_process
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition


@contextlib.asynccontextmanager
async def cleanup(master: MasterProcess, agents: list[AgentProcess]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for agent in agents:
            await agent.cleanup()
        await master.stop()


async def test_master_sigkill_and_restart(tmp_path: Path) -> None:
    master = MasterProcess(
        tmp_path, "--agent-reregister-timeout", "3", "--allocation-interval", "0.2"
    )
    agents: list[AgentProcess] = []
    async with cleanup(master, agents), aiohttp.ClientSession() as http:
        await master.start()
        for name in ("stays", "goes"):
            agents.append(
                await spawn_agent_process(master.address, tmp_path / name, "cpus:2;mem:1024", name)
            )
        state = await master.wait_state(http, lambda s: len(s["agents"]) == 2, "two agents")
        ids = {a["hostname"]: a["id"] for a in state["agents"]}

        fw = RecordingFramework("durable", failover_timeout=120)
        async with running(fw, master.address):
            for name in ("stays", "goes"):
                offer = await fw.next_offer(agent_id=ids[name])
                await fw.launch(
                    offer, [TaskSpec(f"on-{name}", "sleep 60", Resources(cpus=1, mem=64))]
                )
                await fw.wait_state(f"on-{name}", TaskState.RUNNING)
            framework_id = fw.framework_id

            await master.kill()
            await agents[1].cleanup()  # this agent never comes back (its task dies too)
            await master.start()

            # The framework's SDK reconnects with its id; the surviving agent
            # re-registers with its task; the other is removed after 3 s and its
            # task reported lost.
            await wait_for_condition(lambda: fw.subscriptions >= 2, what="re-subscription")
            assert fw.framework_id == framework_id
            await fw.wait_state("on-goes", TaskState.LOST, timeout=30)
            state = await master.wait_state(
                http,
                lambda s: (
                    [t["id"] for t in s["tasks"]] == ["on-stays"]
                    and ids["goes"] in s["removed_agents"]
                ),
                "recovery to settle",
            )
            [agent] = state["agents"]
            assert agent["id"] == ids["stays"]
            assert agent["allocated"]["cpus"] >= 1.0  # the task (and maybe an offer)
            [framework] = state["frameworks"]
            assert framework["id"] == framework_id and framework["connected"]
            assert framework["used"] == {"cpus": 1.0, "mem": 64.0}
            assert state["cluster"]["total"]["cpus"] == 2.0
            # The surviving task is reconciled as running, not relaunched.
            assert TaskState.LOST not in fw.states("on-stays")

        # An id the registry does not know is refused, not adopted.
        stranger = RecordingFramework("stranger", framework_id="no-such-framework")
        with pytest.raises(FrameworkRejected, match="not known"):
            await stranger.run(master.address)
        assert master.violations() == []
