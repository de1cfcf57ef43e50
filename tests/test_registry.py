"""The registry's schema: created at the current version, older files migrated, newer refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from mesolite.master.registry import SCHEMA_VERSION, FrameworkEntry, Registry, RegistryError
from mesolite.model import TaskSpec
from mesolite.resources import Resources
from tests.cluster import LocalCluster, fast

# What the first master (schema version 1, no user_version) wrote.
VERSION_1 = """
CREATE TABLE frameworks (
    framework_id TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL,
    failover_timeout REAL NOT NULL, registered_at REAL NOT NULL
);
CREATE TABLE agents (
    agent_id TEXT PRIMARY KEY, hostname TEXT NOT NULL, total TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('admitted', 'removed')), changed_at REAL NOT NULL
);
CREATE TABLE tasks (
    framework_id TEXT NOT NULL, task_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    name TEXT NOT NULL, command TEXT NOT NULL, resources TEXT NOT NULL,
    PRIMARY KEY (framework_id, task_id)
);
INSERT INTO frameworks VALUES ('F1', 'batch', 'eng', 0.0, 100.0);
INSERT INTO agents VALUES ('S1', 'host', '{"cpus": 2.0}', 'admitted', 100.0);
INSERT INTO tasks VALUES ('F1', 't1', 'S1', 't1', 'sleep 60', '{"cpus": 1.0}');
"""


def test_new_registry_has_the_current_version(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry.sqlite")
    assert registry.schema_version == SCHEMA_VERSION
    registry.close()


def test_registry_of_an_older_master_is_migrated_with_its_contents(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(VERSION_1)
    registry = Registry(path)
    assert registry.schema_version == SCHEMA_VERSION
    assert registry.frameworks() == [FrameworkEntry("F1", "batch", "eng", 0.0, 100.0, False)]
    [task] = registry.tasks()
    assert (task.framework_id, task.agent_id, task.task.task_id) == ("F1", "S1", "t1")
    registry.mark_framework_removing("F1")
    assert registry.frameworks()[0].removing
    # Ids from before authentication have no owner.
    assert registry.agents()[0].principal is None
    registry.close()
    # And it opens again at the current version without migrating twice.
    again = Registry(path)
    assert again.frameworks()[0].removing
    again.close()


def test_who_owns_each_id_is_kept(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry.sqlite")
    registry.add_framework(FrameworkEntry("F1", "batch", "eng", 0.0, 100.0, principal="team-a"))
    registry.admit_agent("S1", "host", Resources.parse("cpus:1"), 100.0, principal="agent-1")
    registry.close()
    again = Registry(tmp_path / "registry.sqlite")
    assert [f.principal for f in again.frameworks()] == ["team-a"]
    assert [a.principal for a in again.agents()] == ["agent-1"]
    again.close()


def test_a_frameworks_user_is_kept_and_older_registries_get_none(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    registry = Registry(path)
    registry.add_framework(FrameworkEntry("F1", "etl", "a", 0.0, 100.0, user="alice"))
    registry.add_framework(FrameworkEntry("F2", "plain", "a", 0.0, 101.0))
    registry.close()
    again = Registry(path)
    assert [(f.framework_id, f.user) for f in again.frameworks()] == [("F1", "alice"), ("F2", "")]
    again.close()
    # A version-3 file (before frameworks' users): its frameworks have none.
    older = tmp_path / "v3.sqlite"
    with sqlite3.connect(older) as db:
        db.executescript(VERSION_1)
        db.execute("ALTER TABLE frameworks ADD COLUMN removing INTEGER NOT NULL DEFAULT 0")
        db.execute("ALTER TABLE frameworks ADD COLUMN principal TEXT")
        db.execute("ALTER TABLE agents ADD COLUMN principal TEXT")
        db.execute("PRAGMA user_version = 3")
    migrated = Registry(older)
    assert migrated.schema_version == SCHEMA_VERSION
    assert [(f.framework_id, f.user) for f in migrated.frameworks()] == [("F1", "")]
    migrated.close()


def test_registry_of_a_newer_master_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    Registry(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(RegistryError, match="newer than this master"):
        Registry(path)


def test_a_removing_framework_keeps_its_tasks_until_removed(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry.sqlite")
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
    registry.add_tasks("F1", "S1", [TaskSpec("t1", "sleep 9", Resources(cpus=1), "t1", "S1")])
    registry.mark_framework_removing("F1")
    assert [t.task.task_id for t in registry.tasks()] == ["t1"]
    registry.remove_framework("F1")
    assert registry.frameworks() == [] and registry.tasks() == []
    registry.close()


async def test_master_recovers_from_a_registry_of_an_older_master(tmp_path: Path) -> None:
    """A version-1 file: its framework comes back (with its grace), its agent is awaited."""
    registry_dir = tmp_path / "master"
    registry_dir.mkdir()
    with sqlite3.connect(registry_dir / "registry.sqlite") as db:
        db.executescript(VERSION_1)
    async with LocalCluster(tmp_path, fast(agent_reregister_timeout=30)) as cluster:
        master = cluster.master
        assert list(master.frameworks) == ["F1"]
        assert not master.frameworks["F1"].connected
        timer = master.frameworks["F1"].failover_timer
        # Its failover timeout is 0, yet it has the whole re-registration window.
        assert timer is not None and timer.when() - asyncio.get_running_loop().time() > 29
        assert [e.task.task_id for e in master.recovering_agents["S1"]] == ["t1"]
        assert master.registry.schema_version == SCHEMA_VERSION


def _rows(path: Path, table: str) -> int:
    """How many rows another connection (a restarted master) sees."""
    with sqlite3.connect(path) as db:
        (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    return int(count)


def test_deferred_changes_are_committed_together_at_flush(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    registry = Registry(path)
    scheduled: list[object] = []
    registry.defer_commits(scheduled.append)
    spec = TaskSpec("t1", "sleep 1", Resources(cpus=1))
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
    registry.add_tasks("F1", "S1", [spec, TaskSpec("t2", "true", Resources(cpus=1))])
    registry.remove_task("F1", "t2")
    assert scheduled == [registry.flush]  # asked once, at the first change
    assert (_rows(path, "frameworks"), _rows(path, "tasks")) == (0, 0)  # nothing yet
    commits = registry.commits
    registry.flush()
    assert registry.commits == commits + 1  # one transaction, in order
    assert (_rows(path, "frameworks"), _rows(path, "tasks")) == (1, 1)
    registry.remove_framework("F1")
    assert len(scheduled) == 2  # a new batch asks again
    assert [t.task.task_id for t in registry.tasks()] == []  # reads see every change
    assert _rows(path, "frameworks") == 0
    registry.close()


def test_a_failed_flush_keeps_the_changes_for_the_next(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite"
    registry = Registry(path)
    registry.defer_commits(lambda flush: None)
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
    with sqlite3.connect(path, isolation_level=None) as other:
        other.execute("BEGIN EXCLUSIVE")  # the file is locked: the commit cannot happen
        registry._db.execute("PRAGMA busy_timeout = 0")
        with pytest.raises(sqlite3.OperationalError):
            registry.flush()
        other.execute("ROLLBACK")
    registry.flush()
    assert _rows(path, "frameworks") == 1
    registry.close()
