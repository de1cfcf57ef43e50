"""The example batch framework (`examples.batch`) against the fake master."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.batch import BatchFramework, BatchSpec, parse_args, spec_from_args
from examples.cpu_heavy import PRESET as CPU_HEAVY
from examples.memory_heavy import PRESET as MEMORY_HEAVY
from mesolite.framework_sdk import Offer, Resources, TaskState, TaskStatus
from mesolite.v1 import scheduler_pb2
from tests.test_sdk_fake_master import FakeMaster, fake_master, running
from tests.waiting import wait_for_condition, within

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def offer(offer_id: str, cpus: float = 4, mem: float = 4096, agent_id: str = "a1") -> Offer:
    return Offer(
        offer_id=offer_id,
        framework_id="fw-1",
        agent_id=agent_id,
        hostname=agent_id,
        resources=Resources(cpus=cpus, mem=mem),
    )


def update(task_id: str, state: TaskState, exit_code: int | None = None) -> TaskStatus:
    return TaskStatus(
        task_id=task_id,
        framework_id="fw-1",
        agent_id="a1",
        state=state,
        exit_code=exit_code,
        update_id=f"{task_id}-{state.value}",
    )


async def next_call(master: FakeMaster, seen: int) -> Any:
    """The call after the first `seen` calls, once it has arrived."""
    await wait_for_condition(lambda: len(master.calls) > seen, what=f"call #{seen + 1}")
    return master.calls[seen]


async def test_one_task_per_offer_then_suppress_then_teardown() -> None:
    spec = BatchSpec(name="b", cpus=1, mem=128, tasks=2, command="true", decline_seconds=5)
    lines: list[str] = []
    framework = BatchFramework(spec, out=lines.append)
    async with fake_master() as master, running(framework, master) as task:
        await wait_for_condition(lambda: "revive" in master.kinds(), what="revive")
        assert master.kinds() == ["subscribe", "revive"]

        master.send_offers(offer("tiny", cpus=0.5))
        decline = (await next_call(master, 2)).decline
        assert list(decline.offer_ids) == ["tiny"] and decline.filters.refuse_seconds == 5

        launched = []
        for n, offer_id in enumerate(["o1", "o2"]):
            master.send_offers(offer(offer_id))
            accept = (await next_call(master, 3 + n)).accept
            assert list(accept.offer_ids) == [offer_id]
            assert len(accept.tasks) == 1  # one task per offer, however many would fit
            assert dict(accept.tasks[0].resources.scalars) == {"cpus": 1.0, "mem": 128.0}
            assert accept.tasks[0].command == "true"
            # The remainder goes straight back to the allocator.
            assert accept.filters.HasField("refuse_seconds") and accept.filters.refuse_seconds == 0
            launched.append(accept.tasks[0].task_id)
        assert (await next_call(master, 5)).HasField("suppress")  # nothing left to launch

        for task_id in launched:
            master.send_update(update(task_id, TaskState.RUNNING))
            master.send_update(update(task_id, TaskState.FINISHED, exit_code=0))
        await within(asyncio.wait({task}), what="run() to end")

    assert task.exception() is None
    kinds = master.kinds()
    # The last update is acknowledged after the teardown its callback sent, which ends
    # the stream: whether that acknowledgement is read does not matter any more.
    assert "teardown" in kinds and kinds[: kinds.index("teardown")].count("acknowledge") == 3
    assert framework.succeeded
    assert (framework.stats.launched, framework.stats.finished, framework.stats.failed) == (2, 2, 0)
    launches = [line for line in lines if line.startswith("launch ")]
    finishes = [line for line in lines if line.startswith("finish ")]
    assert launches == [f"launch {t} agent=a1 resources=cpus:1;mem:128" for t in launched]
    assert finishes == [
        f"finish {t} agent=a1 resources=cpus:1;mem:128 state=TASK_FINISHED exit_code=0"
        for t in launched
    ]
    assert lines[-1].startswith("summary b: 2 launched, 2 finished, 0 failed")


async def test_a_failed_task_fails_the_batch() -> None:
    lines: list[str] = []
    framework = BatchFramework(BatchSpec(name="b", tasks=1), out=lines.append)
    async with fake_master() as master, running(framework, master) as task:
        master.send_offers(offer("o1"))
        (accept,) = await _accepts(master, 1)
        master.send_update(update(accept.tasks[0].task_id, TaskState.FAILED, exit_code=3))
        await within(asyncio.wait({task}), what="run() to end")
    assert not framework.succeeded
    assert framework.stats.failed == 1
    assert any("state=TASK_FAILED exit_code=3" in line for line in lines)


async def test_lost_tasks_and_rejected_launches_are_relaunched() -> None:
    framework = BatchFramework(BatchSpec(name="b", tasks=1), out=lambda _: None)
    async with fake_master() as master, running(framework, master) as task:
        master.send_offers(offer("o1"))
        await wait_for_condition(lambda: "suppress" in master.kinds(), what="suppress")
        rejected = next(c for c in master.calls if c.HasField("accept"))
        master.send(
            scheduler_pb2.Event(
                error=scheduler_pb2.Event.Error(message="offer gone", call_id=rejected.call_id)
            )
        )
        await wait_for_condition(lambda: master.kinds().count("revive") == 2, what="revive")

        master.send_offers(offer("o2"))
        second = (await _accepts(master, 2))[1]
        master.send_update(update(second.tasks[0].task_id, TaskState.LOST))
        await wait_for_condition(lambda: master.kinds().count("revive") == 3, what="revive")

        master.send_offers(offer("o3"))
        third = (await _accepts(master, 3))[2]
        master.send_update(update(third.tasks[0].task_id, TaskState.FINISHED, exit_code=0))
        await within(asyncio.wait({task}), what="run() to end")
    assert framework.succeeded
    assert (framework.stats.launched, framework.stats.relaunched) == (3, 2)


@pytest.mark.parametrize(("per_offer", "expected"), [(0, 4), (2, 2)])
async def test_forever_fills_offers_and_never_suppresses(per_offer: int, expected: int) -> None:
    spec = BatchSpec(name="b", cpus=1, mem=512, tasks=0, tasks_per_offer=per_offer)
    framework = BatchFramework(spec, out=lambda _: None)
    async with fake_master() as master, running(framework, master) as task:
        master.send_offers(offer("o1", cpus=4, mem=4096))
        (accept,) = await _accepts(master, 1)
        assert len(accept.tasks) == expected
        assert {t.command for t in accept.tasks} == {"sleep 5"}
        master.send_update(update(accept.tasks[0].task_id, TaskState.FINISHED, exit_code=0))
        await wait_for_condition(lambda: framework.stats.finished == 1, what="a finished task")
        master.send_offers(offer("o2", cpus=1, mem=512))
        await _accepts(master, 2)
        assert not task.done()
    assert "suppress" not in master.kinds() and "teardown" not in master.kinds()
    assert framework.succeeded


async def _accepts(master: FakeMaster, count: int) -> list[Any]:
    await wait_for_condition(lambda: len(master.calls_of("accept")) >= count, what="accepts")
    return master.calls_of("accept")


def test_flags_override_the_presets() -> None:
    assert (CPU_HEAVY.cpus, CPU_HEAVY.mem) == (2.0, 512.0)
    assert (MEMORY_HEAVY.cpus, MEMORY_HEAVY.mem) == (0.5, 4096.0)
    args = parse_args(["--master", "m:5050", "--mem", "1024", "--tasks", "0"], CPU_HEAVY)
    spec = spec_from_args(args)
    assert args.master == "m:5050" and args.framework_id is None
    assert spec == BatchSpec(name="cpu-heavy", cpus=2.0, mem=1024.0, tasks=0)
    assert spec.task_command == "sleep 5" and spec.forever
    args = parse_args(["--master", "m:1", "--command", "echo hi", "--tasks-per-offer", "3"])
    assert spec_from_args(args).task_command == "echo hi"
    assert spec_from_args(args).tasks_per_offer == 3


async def test_the_script_runs_a_batch_and_exits_zero() -> None:
    async with fake_master() as master:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLES / "batch_framework.py"),
            *("--master", master.address, "--name", "script", "--tasks", "1"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await wait_for_condition(lambda: master.connected, what="the script to subscribe")
            master.send_offers(offer("o1"))
            (accept,) = await _accepts(master, 1)
            master.send_update(update(accept.tasks[0].task_id, TaskState.FINISHED, exit_code=0))
            out, err = await within(process.communicate(), what="the script to exit")
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "subscribed script framework_id=fw-1"
    assert lines[1].startswith("launch script-") and lines[2].startswith("finish script-")
    assert lines[-1].startswith("summary script: 1 launched, 1 finished, 0 failed")
