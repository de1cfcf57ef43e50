"""`mesolite state|agents|frameworks|roles|tasks`: the views rendered from a real cluster's
state, and the commands run as subprocesses against a running master."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.resources import EMPTY
from mesolite.snapshot import ClusterSnapshot, ClusterTotals, RoleSnapshot, TaskSnapshot
from mesolite.views import (
    VIEWS,
    fmt_duration,
    render_agents,
    render_frameworks,
    render_roles,
    render_state,
    render_tasks,
)
from tests.cluster import LocalCluster, fast, free_port
from tests.recording import RecordingFramework, running
from tests.support.snapshots import agent, empty_snapshot, framework_snapshot
from tests.waiting import within

ROLES = """
[roles.eng]
weight = 2
guarantee = { cpus = 1 }

[roles."eng/ml"]
limit = { cpus = 3, gpus = 0 }

[roles.ops]
"""


def text(renderable: RenderableType) -> str:
    console = Console(width=250, file=io.StringIO())
    console.print(renderable)
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def lines_with(output: str, needle: str) -> list[str]:
    return [line for line in output.splitlines() if needle in line]


@dataclass
class Scene:
    cluster: LocalCluster
    state: ClusterSnapshot
    agent_ids: list[str]
    framework_id: str


@pytest.fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    """A master with a roles file, two agents and a framework in eng/ml running one task."""
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLES)
    async with LocalCluster(tmp_path, fast(roles_file=roles)) as cluster:
        first = await cluster.add_agent("cpus:2;mem:2048", name="alpha")
        second = await cluster.add_agent("cpus:2;mem:2048", name="beta")
        fw = RecordingFramework("trainer", role="eng/ml")
        async with running(fw, cluster.address):
            offer = await fw.next_offer()
            task = TaskSpec("train-1", "sleep 60", Resources(cpus=1, mem=512))
            await fw.launch(offer, [task], refuse_seconds=3600)
            await fw.wait_state("train-1", TaskState.RUNNING)
            agent_ids = [a.agent_id for a in (first, second) if a.agent_id is not None]
            assert fw.framework_id is not None and len(agent_ids) == 2
            state = ClusterSnapshot.from_json(await cluster.state())
            yield Scene(cluster, state, agent_ids, fw.framework_id)


# Rendering from a real state ----------------------------------------------------


async def test_views_render_a_real_clusters_state(scene: Scene) -> None:
    state = scene.state
    [task] = state.tasks
    host = next(a.hostname for a in state.agents if a.id == task.agent_id)

    agents = text(render_agents(state))
    for agent_id, hostname in zip(scene.agent_ids, ("alpha", "beta"), strict=True):
        [line] = lines_with(agents, agent_id)
        assert hostname in line and "healthy" in line
    [busy] = lines_with(agents, task.agent_id)
    assert "1/2" in busy and "512/2048" in busy  # cpus and mem used/total

    frameworks = text(render_frameworks(state))
    [line] = lines_with(frameworks, scene.framework_id)
    assert "trainer" in line and "eng/ml" in line and "connected" in line
    assert "cpus:1 mem:512" in line

    tasks = text(render_tasks(state))
    [line] = lines_with(tasks, "train-1")
    assert "trainer" in line and host in line and "RUNNING" in line and "cpus:1 mem:512" in line

    roles = text(render_roles(state))
    assert roles.index("\neng ") < roles.index("\n  ml ") < roles.index("\nops ")
    ml = roles[roles.index("\n  ml ") :].splitlines()
    # role, weight, active, share, frameworks, resource, allocated, guarantee, limit, ...
    first = ml[1].split()
    assert first[:3] == ["ml", "1", "active"] and first[5] == "cpus" and first[8] == "3"
    gpus = next(line for line in ml if line.split()[:1] == ["gpus"])
    assert gpus.split()[1:4] == ["-", "-", "0"]  # allocated -, guarantee -, limit 0 (none)

    overview = text(render_state(state))
    for part in (f"master {state.master_id}", "cluster", "frameworks", "roles", "agents"):
        assert part in overview
    assert "2 agents, 1 frameworks, 1 tasks" in overview
    assert all(agent_id in overview for agent_id in scene.agent_ids)
    cpus = next(line.split() for line in overview.splitlines() if line.startswith("cpus"))
    assert cpus[1] == "4"  # the cluster's total


def test_views_of_an_empty_and_a_troubled_cluster() -> None:
    empty = empty_snapshot()
    overview = text(render_state(empty))
    assert "up 1h 2m" in overview
    assert "no agents registered" in overview and "no frameworks registered" in overview
    assert "no running tasks" in text(render_tasks(empty))

    away = framework_snapshot(id="f-away", name="away", connected=False, failover_timeout=60.0)
    # A task whose framework and agent the state does not list: shown by id.
    orphan = TaskSnapshot("t1", "", "f-x", "a-x", TaskState.STAGING, Resources(cpus=0.5))
    troubled = empty_snapshot(
        agents=(agent("a-gone", connected=False, healthy=False), agent("a-late", healthy=False)),
        frameworks=(away,),
        tasks=(orphan,),
    )
    agents = text(render_agents(troubled))
    assert "disconnected" in lines_with(agents, "a-gone")[0]
    assert "UNHEALTHY" in lines_with(agents, "a-late")[0]
    assert "DISCONNECTED" in lines_with(text(render_frameworks(troubled)), "f-away")[0]
    [task] = lines_with(text(render_tasks(troubled)), "t1")
    assert "f-x" in task and "a-x" in task and "STAGING" in task


def test_durations() -> None:
    assert [fmt_duration(s) for s in (0, 59, 61, 3600, 90061)] == [
        "0s",
        "59s",
        "1m 1s",
        "1h 0m",
        "1d 1h",
    ]


# The commands, as subprocesses ---------------------------------------------------------


def _env() -> dict[str, str]:
    """No terminal settings from the test's environment: plain, unwrapped output."""
    drop = {"COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"NO_COLOR": "1"}


async def mesolite(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run `python -m mesolite.cli ARGS`; its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesolite.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        out, err = await within(process.communicate(), timeout, f"mesolite {' '.join(args)}")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_commands_against_a_running_master(scene: Scene) -> None:
    master = scene.cluster.server.http_address
    names = list(VIEWS)
    runs = await asyncio.gather(
        *(mesolite(name, "--master", master) for name in names),
        *(mesolite(name, "--master", master, "--json") for name in names),
    )
    shown = dict(zip(names, runs[: len(names)], strict=True))
    raw = dict(zip(names, runs[len(names) :], strict=True))
    for name, (code, _, err) in [*shown.items(), *raw.items()]:
        assert code == 0, (name, err)

    assert all(a in shown["agents"][1] for a in scene.agent_ids)
    assert "trainer" in shown["frameworks"][1] and scene.framework_id in shown["frameworks"][1]
    assert "  ml" in shown["roles"][1] and "eng" in shown["roles"][1]
    assert "train-1" in shown["tasks"][1]
    overview = shown["state"][1]
    assert "trainer" in overview and all(a in overview for a in scene.agent_ids)
    assert not any(line != line.rstrip() for line in overview.splitlines())  # no padding
    assert "\x1b[" not in overview  # no colour codes when piped

    state = json.loads(raw["state"][1])
    assert state["master_id"] == scene.state.master_id
    assert {a["id"] for a in json.loads(raw["agents"][1])} == set(scene.agent_ids)
    assert [f["id"] for f in json.loads(raw["frameworks"][1])] == [scene.framework_id]
    assert {r["path"] for r in json.loads(raw["roles"][1])} >= {"*", "eng", "eng/ml", "ops"}
    assert [t["id"] for t in json.loads(raw["tasks"][1])] == ["train-1"]


async def test_an_unreachable_master_is_a_clear_error() -> None:
    code, out, err = await mesolite("agents", "--master", f"127.0.0.1:{free_port()}")
    assert code == 1 and out == ""
    assert "cannot reach the master at 127.0.0.1:" in err and "Traceback" not in err


async def test_watch_refreshes_until_interrupted(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:1;mem:256", name="watched")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mesolite.cli",
            "agents",
            "--master",
            cluster.server.http_address,
            "--watch",
            "0.2",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_env(),
        )
        assert process.stdout is not None
        output = b""
        try:

            async def read_two_snapshots() -> None:
                nonlocal output
                assert process.stdout is not None
                while output.count(b"Ctrl-C to stop") < 2:
                    chunk = await process.stdout.read(4096)
                    assert chunk, f"mesolite exited early: {output!r}"
                    output += chunk

            await within(read_two_snapshots(), 60, "two snapshots")
            process.send_signal(signal.SIGINT)
            await within(process.wait(), 20, "mesolite to stop on Ctrl-C")
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0
        assert output.decode().count("watched") >= 2


def test_weight_vectors_are_shown_per_resource() -> None:
    total = Resources(cpus=12, mem=36864)
    vector = {"mem": 3.0, "gpus": 0.5}
    memory_heavy = RoleSnapshot(
        path="memory-heavy",
        weight=1.0,
        guarantee=EMPTY,
        limit=None,
        configured=True,
        allocated=EMPTY,
        share=0.0,
        weighted_share=0.0,
        dominant_share=0.0,
        steady_fair_share=EMPTY,
        instantaneous_fair_share=EMPTY,
        active=False,
        frameworks=1,
        resource_weights=vector,
    )
    state = empty_snapshot(
        cluster=ClusterTotals(total, EMPTY, total, 1, 1, 0, 0),
        roles=(memory_heavy,),
        frameworks=(framework_snapshot(role="memory-heavy", resource_weights=vector),),
    )
    [line] = lines_with(text(render_frameworks(state)), "memory-heavy")
    assert "mem:3 gpus:0.5 others:1" in line
    # Each resource's line carries that resource's weight (gpus, weighted but
    # not in the cluster, gets a line too): role, weight, ..., resource, ...
    rows = [line.split() for line in text(render_roles(state)).splitlines()[3:] if line]
    weights = {row[-6]: row[-7] for row in rows}
    assert weights == {"cpus": "1", "mem": "3", "gpus": "0.5"}
