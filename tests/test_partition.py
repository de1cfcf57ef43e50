"""An agent cut off from the master (alive but silent) and coming back."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from tests.cluster import LocalCluster
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_partitioned_agent_is_removed_and_agrees_when_it_returns(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        island = await cluster.spawn_agent("cpus:2;mem:1024", name="island")
        old_id = next(iter(cluster.master.agents))
        fw = RecordingFramework()
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=old_id)
            await fw.launch(offer, [TaskSpec("stranded", "sleep 60", Resources(cpus=1, mem=64))])
            await fw.wait_state("stranded", TaskState.RUNNING)
            [pid] = island.task_pids()

            island.process.send_signal(signal.SIGSTOP)  # heartbeats stop; the process lives
            try:
                await cluster.time_out_agents(old_id)
                await fw.wait_state("stranded", TaskState.LOST)
                state = await cluster.state()
                assert state["agents"] == [] and state["tasks"] == []
                assert state["cluster"]["total"] == {}
                assert old_id in state["removed_agents"]
                assert alive(pid)  # cut off, not dead
            finally:
                island.process.send_signal(signal.SIGCONT)

            # Back: the master refuses the old identity, the agent kills what it
            # ran under it and joins as a new agent with all its resources free.
            await wait_for_condition(
                lambda: any(a != old_id for a in cluster.master.agents), what="re-registration"
            )
            await wait_for_condition(lambda: not alive(pid), what="the stranded task killed")
            state = await cluster.state()
            [agent] = state["agents"]
            assert agent["id"] != old_id
            assert agent["running_tasks"] == 0 and state["tasks"] == []
            assert state["cluster"]["total"]["cpus"] == 2.0
            # The framework heard LOST once and nothing about the task after it.
            assert fw.states("stranded") == [TaskState.STARTING, TaskState.RUNNING, TaskState.LOST]
