"""GET /state against its published schema (docs/state.schema.json): a real cluster's
state conforms, wrong documents do not, and the committed file is the generated one."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.master.read_model import build_snapshot
from mesolite.snapshot import ClusterSnapshot, DocumentError, state_json_schema
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.support.snapshots import agent, empty_snapshot, framework_snapshot
from tests.waiting import wait_for_condition

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "docs" / "state.schema.json"

ROLES = """
[roles.eng]
weight = 2
guarantee = { cpus = 1 }

[roles."eng/ml"]
limit = { cpus = 3, gpus = 0 }

[roles.ops]
"""


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.unit
def test_the_committed_schema_is_the_generated_one() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == state_json_schema(), (
        "docs/state.schema.json is stale: run scripts/gen_state_schema.py"
    )


async def test_a_real_clusters_state_conforms(tmp_path: Path) -> None:
    """Agents (one removed), frameworks in configured roles, running and ended tasks, offers."""
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLES)
    async with LocalCluster(tmp_path, fast(roles_file=roles)) as cluster:
        doomed = await cluster.add_agent("cpus:1;mem:256", name="doomed")
        doomed_id = doomed.agent_id
        assert doomed_id is not None
        await doomed.stop()  # removed once its heartbeats are overdue (time_out_agents below)
        await wait_for_condition(
            lambda: not any(a.connected for a in build_snapshot(cluster.master).agents),
            what="the stopped agent to be disconnected",
        )
        await cluster.add_agent("cpus:2;mem:2048;gpus:1", name="alpha")
        trainer = RecordingFramework("trainer", role="eng/ml")
        holder = RecordingFramework("holder", role="ops")
        async with running(trainer, cluster.address):
            offer = await trainer.next_offer()
            tasks = [
                TaskSpec("train-1", "sleep 60", Resources(cpus=1, mem=512)),
                TaskSpec("quick", "true", Resources(cpus=0.5, mem=64)),
            ]
            await trainer.launch(offer, tasks, refuse_seconds=3600)
            await trainer.wait_state("train-1", TaskState.RUNNING)
            await trainer.wait_state("quick", TaskState.FINISHED)
            async with running(holder, cluster.address):
                await cluster.add_agent("cpus:2;mem:2048", name="beta")
                await holder.next_offer()  # and keeps it: an outstanding offer
                await cluster.time_out_agents(doomed_id)
                document = await cluster.state()

    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(document)]
    assert errors == []
    state = ClusterSnapshot.from_json(document)
    assert [a.hostname for a in state.agents] == ["alpha", "beta"]
    assert len(state.removed_agents) == 1 and state.frameworks and state.offers
    assert [t.id for t in state.tasks] == ["train-1"]
    assert [t.id for t in state.completed_tasks] == ["quick"]
    assert {r.path for r in state.roles} >= {"*", "eng", "eng/ml", "ops"}
    assert any(r.limit is not None for r in state.roles)  # a limit object, not only nulls
    # The typed snapshot reads every field and writes the same document back.
    assert state.to_json() == document

    for where, wrong in WRONG.items():
        broken = copy.deepcopy(document)
        wrong(broken)
        assert not validator().is_valid(broken), where
        with pytest.raises(DocumentError):
            ClusterSnapshot.from_json(broken)


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    *parents, key = path.split(".")

    def change(document: dict[str, Any]) -> None:
        place: Any = document
        for p in parents:
            place = place[int(p)] if p.isdigit() else place[p]
        del place[key]

    return change


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, key = path.split(".")

    def change(document: dict[str, Any]) -> None:
        place: Any = document
        for p in parents:
            place = place[int(p)] if p.isdigit() else place[p]
        place[int(key) if key.isdigit() else key] = value

    return change


# Documents that are not a GET /state: each must fail the schema and the typed reader.
WRONG: dict[str, Callable[[dict[str, Any]], None]] = {
    "no cluster total": _delete("cluster.total"),
    "no master id": _delete("master_id"),
    "an agent without health": _delete("agents.0.healthy"),
    "a share as a string": _set("frameworks.0.dominant_share", "0.5"),
    "health as a string": _set("agents.0.healthy", "yes"),
    "a count as a float": _set("cluster.agents", 2.5),
    "an unknown task state": _set("tasks.0.state", "RUNNING"),
    "a negative amount": _set("agents.0.total", {"cpus": -1}),
    "an amount as a string": _set("offers.0.resources", {"cpus": "1"}),
    "roles as an object": _set("roles", {}),
    "a null where null is not allowed": _set("removed_agents", None),
}


@pytest.mark.unit
@pytest.mark.parametrize("where", list(WRONG))
def test_wrong_documents_are_rejected(where: str) -> None:
    task = {
        "id": "t1",
        "name": "",
        "framework_id": "f1",
        "agent_id": "a1",
        "state": "TASK_RUNNING",
        "resources": {"cpus": 1.0},
    }
    offer = {"id": "o1", "framework_id": "f1", "agent_id": "a1", "resources": {"cpus": 1.0}}
    framework = framework_snapshot(name="f", running_tasks=1)
    document = {
        **empty_snapshot(agents=(agent("a1"),), frameworks=(framework,)).to_json(),
        "tasks": [task],
        "offers": [offer],
    }
    assert validator().is_valid(document)  # the right document first: the change is what fails
    ClusterSnapshot.from_json(document)

    WRONG[where](document)
    assert not validator().is_valid(document)
    with pytest.raises(DocumentError):
        ClusterSnapshot.from_json(document)
