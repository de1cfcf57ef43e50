"""Roles over real gRPC: allocations and fair shares follow the tree; SIGHUP reloads."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from examples.batch import BatchFramework, BatchSpec
from mesolite.lab.drf_reference import Weight, discrete_drf, drf
from tests.cluster import AgentProcess, LocalCluster, fast, spawn_agent_process
from tests.recording import running
from tests.waiting import wait_for_condition

ROLES = """
[roles.eng]
weight = 3

[roles."eng/ml"]
[roles."eng/web"]

[roles.ops]
weight = 1

[roles.capped]
limit = { cpus = 2 }
"""


def role(state: dict[str, Any], path: str) -> dict[str, Any]:
    return next(r for r in state["roles"] if r["path"] == path)


def batch(name: str, role_path: str) -> BatchFramework:
    spec = BatchSpec(name=name, role=role_path, cpus=1, mem=64, tasks=0, command="sleep 120")
    return BatchFramework(spec, out=lambda line: None)


async def test_allocations_and_fair_shares_follow_the_role_tree(tmp_path: Path) -> None:
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(ROLES)
    async with LocalCluster(tmp_path, fast(roles_file=roles_file)) as cluster:
        ml, web, ops = batch("ml", "eng/ml"), batch("web", "eng/web"), batch("ops", "ops")
        async with contextlib.AsyncExitStack() as stack:
            for fw in (ml, web, ops):
                await stack.enter_async_context(running(fw, cluster.address))
            for i in range(4):
                await cluster.add_agent("cpus:4;mem:4096", name=f"a{i}")
            await wait_for_condition(
                lambda: len(list(cluster.master.tasks())) == 16, what="16 tasks"
            )
            state = await cluster.state()
            counts = {f["name"]: f["running_tasks"] for f in state["frameworks"]}
            # eng (weight 3) : ops (weight 1), and eng's part split evenly below it.
            assert counts == {"ml": 6, "web": 6, "ops": 4}
            assert role(state, "eng")["allocated"]["cpus"] == 12
            # Steady shares divide among all configured roles, `*` and `capped`
            # included (weights 3 + 1 + 1 + 1); capped's limit of 2 CPUs sends the
            # rest back: R = (16 - 2) / 5 = 2.8 CPUs per unit of weight.
            assert role(state, "eng")["steady_fair_share"]["cpus"] == 8.4
            assert role(state, "eng/ml")["steady_fair_share"]["cpus"] == 4.2
            assert role(state, "ops")["steady_fair_share"]["cpus"] == 2.8
            assert role(state, "capped")["steady_fair_share"]["cpus"] == 2.0
            assert role(state, "*")["steady_fair_share"]["cpus"] == 2.8
            # Instantaneous shares divide among the active roles only.
            assert role(state, "eng")["instantaneous_fair_share"]["cpus"] == 12.0
            assert role(state, "eng/web")["instantaneous_fair_share"]["cpus"] == 6.0
            assert role(state, "ops")["instantaneous_fair_share"]["cpus"] == 4.0
            assert role(state, "*")["instantaneous_fair_share"] == {}
            assert role(state, "eng")["active"] and not role(state, "*")["active"]


async def test_a_role_never_holds_more_than_its_limit(tmp_path: Path) -> None:
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(ROLES)
    async with LocalCluster(tmp_path, fast(roles_file=roles_file)) as cluster:
        await cluster.add_agent("cpus:4;mem:4096")
        capped = batch("capped", "capped")
        async with running(capped, cluster.address):
            await wait_for_condition(lambda: capped.stats.launched == 2, what="two launches")
            state = await cluster.state()
            assert role(state, "capped")["allocated"]["cpus"] == 2
            # Alone on the cluster, it is still offered no more than its limit.
            cycles = cluster.master.allocation_cycles
            await wait_for_condition(
                lambda: cluster.master.allocation_cycles >= cycles + 3,
                what="three more allocation cycles",
            )
            assert cluster.master.allocator.roles.role_allocation("capped")["cpus"] <= 2
            assert capped.stats.launched == 2


async def test_a_role_not_in_the_file_is_created_with_weight_one(tmp_path: Path) -> None:
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(ROLES)
    async with LocalCluster(tmp_path, fast(roles_file=roles_file)) as cluster:
        await cluster.add_agent("cpus:2;mem:1024")
        async with running(batch("newcomer", "research/vision"), cluster.address):
            state = await cluster.state()
            assert role(state, "research/vision")["weight"] == 1.0
            assert role(state, "research")["configured"] is False


@contextlib.asynccontextmanager
async def master_process(tmp_path: Path, roles_file: Path) -> AsyncIterator[tuple[Any, str, str]]:
    """`mesolite master --roles FILE` in its own process: (process, HTTP address, gRPC address)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesolite.cli",
        "master",
        "--port",
        "0",
        "--http-port",
        "0",
        "--work-dir",
        str(tmp_path / "master"),
        "--roles",
        str(roles_file),
        stdout=asyncio.subprocess.PIPE,
        stderr=(tmp_path / "master.log").open("wb"),
    )
    try:
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 20)
        http = first.decode().split("(HTTP ")[1].split(")")[0]
        grpc = first.decode().split("is listening on ")[1].split(" ")[0]
        yield process, http, grpc
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 20)


async def test_sighup_reloads_roles_and_keeps_them_when_the_file_is_invalid(
    tmp_path: Path,
) -> None:
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(ROLES)
    async with (
        master_process(tmp_path, roles_file) as (process, http, _),
        aiohttp.ClientSession() as session,
    ):

        async def weight(path: str) -> float | None:
            async with session.get(f"http://{http}/state") as response:
                state = await response.json()
            found = [r for r in state["roles"] if r["path"] == path]
            return found[0]["weight"] if found else None

        assert await weight("ops") == 1.0
        roles_file.write_text(ROLES.replace("weight = 1\n", "weight = 5\n"))
        process.send_signal(signal.SIGHUP)
        await wait_for_condition_async(lambda: weight("ops"), 5.0)

        roles_file.write_text("[roles.ops]\nweight = -2\n")
        process.send_signal(signal.SIGHUP)
        log = tmp_path / "master.log"
        await wait_for_condition(
            lambda: "roles file rejected" in log.read_text(), what="the rejection to be logged"
        )
        assert "roles.toml:2: role 'ops': weight" in log.read_text()
        assert await weight("ops") == 5.0  # the old configuration stays


TWO_ROLES = """
[roles.eng]

[roles.ops]
"""


async def test_sighup_new_weights_decide_the_next_offers(tmp_path: Path) -> None:
    # Tasks of <1 CPU, 64 MB> on agents with exactly 64 MB per CPU: nothing but
    # whole tasks is ever offered, and shares are task counts over the CPUs.
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(TWO_ROLES)
    agents: list[AgentProcess] = []
    async with (
        master_process(tmp_path, roles_file) as (process, http, grpc),
        aiohttp.ClientSession() as session,
        contextlib.AsyncExitStack() as stack,
    ):

        async def state() -> dict[str, Any]:
            async with session.get(f"http://{http}/state") as response:
                data: dict[str, Any] = await response.json()
                return data

        async def tasks() -> dict[str, int]:
            return {f["name"]: f["running_tasks"] for f in (await state())["frameworks"]}

        async def all_tasks() -> int:
            return sum((await tasks()).values())

        async def ops_weight() -> float:
            return float(role(await state(), "ops")["weight"])

        async def stop_agents() -> None:
            for agent in agents:
                await agent.cleanup()

        stack.push_async_callback(stop_agents)
        eng, ops = batch("eng", "eng"), batch("ops", "ops")
        for fw in (eng, ops):
            await stack.enter_async_context(running(fw, grpc))
        agents.append(await spawn_agent_process(grpc, tmp_path / "a1", "cpus:4;mem:256", "a1"))
        await wait_for_condition_async(tasks, {"eng": 2, "ops": 2})  # equal weights

        roles_file.write_text(TWO_ROLES.replace("[roles.ops]\n", "[roles.ops]\nweight = 3\n"))
        process.send_signal(signal.SIGHUP)
        await wait_for_condition_async(ops_weight, 3.0)

        # One CPU comes free, nothing else changes: one of eng's tasks is killed.
        # Under the old weights eng (1 of 4 CPUs) is below ops (2 of 4) and gets
        # it back; under the new ones ops' weighted share is 2/4 / 3 = 1/6 < 1/4.
        current = await state()
        eng_id = next(f["id"] for f in current["frameworks"] if f["name"] == "eng")
        victim = next(t["id"] for t in current["tasks"] if t["framework_id"] == eng_id)
        await eng.kill(victim)
        await wait_for_condition_async(tasks, {"eng": 1, "ops": 3}, what="the freed CPU to ops")

        # Eight more CPUs, offered task by task to the lower weighted share: ops
        # and eng tie (1/12 each; eng was created first), then ops to 6, a tie
        # again, eng to 3, ops to 9: 3 to 9, weighted shares equal. The old
        # weights would have split the 12 CPUs 6 and 6.
        agents.append(await spawn_agent_process(grpc, tmp_path / "a2", "cpus:8;mem:512", "a2"))
        await wait_for_condition_async(all_tasks, 12, what="12 tasks on the two agents")
        assert await tasks() == {"eng": 3, "ops": 9}


async def wait_for_condition_async(
    read: Any, expected: object, timeout: float = 20.0, what: str = ""
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (value := await read()) != expected:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"timed out{' on ' + what if what else ''}: still {value!r}, expected {expected!r}"
            )
        await asyncio.sleep(0.05)


# Weight vectors over real gRPC ---------------------------------------------------

# The DRF paper's two users on <12 CPUs, 36 GB>: memory-heavy tasks <1 CPU, 4 GB>
# (memory is their dominant resource) and cpu-heavy <3 CPUs, 1 GB> (CPUs). Each
# role is favoured on one resource: memory-heavy weighs 3 for memory, cpu-heavy
# 4 for CPUs (every other resource weighs 1).
VECTOR_ROLES = """
[roles.memory-heavy]
weight = { mem = 3 }

[roles.cpu-heavy]
weight = { cpus = 4 }
"""
VECTOR_AGENT = "cpus:12;mem:36864"


async def test_weight_vectors_decide_the_split_as_the_exact_weighted_reference(
    tmp_path: Path,
) -> None:
    roles_file = tmp_path / "roles.toml"
    roles_file.write_text(VECTOR_ROLES)
    specs = {  # in the order of their roles' creation (sorted paths): the tie-break
        "cpu": BatchSpec(name="cpu", role="cpu-heavy", cpus=3, mem=1024, tasks=0),
        "memory": BatchSpec(name="memory", role="memory-heavy", cpus=1, mem=4096, tasks=0),
    }
    async with (
        LocalCluster(tmp_path, fast(roles_file=roles_file)) as cluster,
        contextlib.AsyncExitStack() as stack,
    ):
        for spec in specs.values():
            framework = BatchFramework(replace(spec, command="sleep 120"), out=lambda line: None)
            await stack.enter_async_context(running(framework, cluster.address))
        await cluster.add_agent(VECTOR_AGENT)

        def cpus_in_tasks() -> float:
            return float(sum(t.spec.resources.get_amount("cpus") for t in cluster.master.tasks()))

        # Tasks never end here, so once the 12 CPUs are in tasks nothing more fits.
        await wait_for_condition(lambda: cpus_in_tasks() == 12, what="every CPU in a task")
        state = await cluster.state()
        counts = {f["name"]: f["running_tasks"] for f in state["frameworks"]}

        # The exact weighted reference: DRF with whole tasks, one at a time, to
        # the lowest weighted dominant share max_r(share_r / w_r).
        capacity = {"cpus": 12, "mem": 36864}
        demands = {n: {"cpus": s.cpus, "mem": s.mem} for n, s in specs.items()}
        weights: dict[str, Weight] = {"memory": {"mem": 3}, "cpu": {"cpus": 4}}
        expected = discrete_drf(capacity, demands, weights=weights).tasks
        assert counts == expected == {"cpu": 3, "memory": 3}
        # Within one task of the divisible equilibrium, x/12 = y/16: 16/5 and 12/5.
        divisible = drf(capacity, demands, weights=weights).tasks
        assert divisible == {"cpu": Fraction(16, 5), "memory": Fraction(12, 5)}
        assert all(abs(counts[n] - divisible[n]) < 1 for n in counts)
        # Unweighted DRF (or the weights on each other's resource) gives 2 and 6.
        assert discrete_drf(capacity, demands).tasks == {"cpu": 2, "memory": 6}

        # /state: the weight vectors, and weighted shares computed with them.
        for path, vector in (("memory-heavy", {"mem": 3.0}), ("cpu-heavy", {"cpus": 4.0})):
            assert role(state, path)["resource_weights"] == vector
            assert role(state, path)["weight"] == 1.0
        assert role(state, "*")["resource_weights"] is None
        total = state["cluster"]["total"]
        for f in state["frameworks"]:
            vector = f["resource_weights"]
            assert vector == role(state, f["role"])["resource_weights"]
            expected_share = max(
                amount / total[r] / vector.get(r, 1.0) for r, amount in f["allocated"].items()
            )
            assert f["weighted_dominant_share"] == pytest.approx(expected_share, rel=1e-12)

        # Fair shares divide each resource by the weights for it. Steady, over
        # `*`, cpu-heavy and memory-heavy: CPUs 1 : 4 : 1, memory 1 : 1 : 3.
        steady = {
            p: role(state, p)["steady_fair_share"] for p in ("*", "cpu-heavy", "memory-heavy")
        }
        assert steady == {
            "*": {"cpus": 2.0, "mem": 7372.8},
            "cpu-heavy": {"cpus": 8.0, "mem": 7372.8},
            "memory-heavy": {"cpus": 2.0, "mem": 22118.4},
        }
        # Instantaneous, over the two active roles: CPUs 4 : 1, memory 1 : 3.
        assert role(state, "cpu-heavy")["instantaneous_fair_share"] == {"cpus": 9.6, "mem": 9216.0}
        assert role(state, "memory-heavy")["instantaneous_fair_share"] == {
            "cpus": 2.4,
            "mem": 27648.0,
        }
