"""The master's registry: what it must not forget across a restart, in SQLite.

Embedded, nothing to install: one file, `<work_dir>/registry.sqlite`. It
holds frameworks (id, name, role, failover timeout, owner, user), agents (admitted or
removed) and the tasks placed on them (so that tasks of an agent that never
comes back can be reported lost). Offers, filters and allocations are not kept:
they are rebuilt from what agents and frameworks report when they return.

The file carries a schema version (`PRAGMA user_version`). A registry written
by an older master is migrated in place when opened; one written by a newer
master, whose meaning this code cannot know, is refused with an error (the
master does not start rather than misread it).

Each change is committed before the master acknowledges it (SUBSCRIBED,
REGISTERED, a launch, a task's end forwarded). The database runs in WAL mode with
synchronous=NORMAL: a commit survives the master process being killed (SIGKILL),
which is the failure this protects against; it does not claim to survive the machine
losing power.

By default each change is its own commit, at once (what unit tests see). The master
process batches them instead (`defer_commits`): the changes of one turn of the event
loop are committed together, in one transaction, at the end of the turn, and every
stream writer calls `flush()` before it writes anything, so a message never leaves
before the changes made up to its sending are committed (a commit costs tens of
microseconds plus a WAL write; at thousands of launches and ends a second, one per
change was a tenth of the master's time). Reads flush first.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mesolite.master.errors import MasterError
from mesolite.model import TaskSpec
from mesolite.resources import Resources

# Version 1: the first registry (frameworks, agents, tasks).
# Version 2: frameworks.removing: torn down, its tasks still being killed.
# Version 3: frameworks.principal and agents.principal: who owns each id.
# Version 4: frameworks.user: the Unix user its tasks run as ('' for the agents' own).
SCHEMA_VERSION = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS frameworks (
    framework_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    failover_timeout REAL NOT NULL,
    registered_at REAL NOT NULL,
    removing INTEGER NOT NULL DEFAULT 0,
    principal TEXT,
    user TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    hostname TEXT NOT NULL,
    total TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('admitted', 'removed')),
    changed_at REAL NOT NULL,
    principal TEXT
);
CREATE TABLE IF NOT EXISTS tasks (
    framework_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    name TEXT NOT NULL,
    command TEXT NOT NULL,
    resources TEXT NOT NULL,
    PRIMARY KEY (framework_id, task_id)
);
"""


@dataclass(frozen=True, slots=True)
class FrameworkEntry:
    framework_id: str
    name: str
    role: str
    failover_timeout: float
    registered_at: float
    # Torn down before the restart; its tasks are killed when their agents return.
    removing: bool = False
    principal: str | None = None  # who subscribed it (None: no authentication)
    user: str = ""  # the Unix user its tasks run as ("": each agent's --task-user)


class RegistryError(MasterError):
    """The registry file cannot be used by this master (say, written by a newer one)."""


@dataclass(frozen=True, slots=True)
class AgentEntry:
    agent_id: str
    hostname: str
    total: Resources
    removed: bool
    principal: str | None = None  # who registered it (None: no authentication)


@dataclass(frozen=True, slots=True)
class TaskEntry:
    framework_id: str
    agent_id: str
    task: TaskSpec


# One change: statements applied together (sql, parameters, executemany or not).
_Statement = tuple[str, Sequence[Any], bool]


class Registry:
    def __init__(self, path: Path | None) -> None:
        """Open (or create) the registry at `path`; None keeps it in memory, for tests."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Autocommit: each statement outside an explicit BEGIN is its own commit.
        self._db = sqlite3.connect(path or ":memory:", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._open_schema()
        self._pending: list[_Statement] = []  # changes not committed yet (deferred)
        self._schedule: Callable[[Callable[[], None]], object] | None = None
        self.commits = 0
        # Told each commit's duration in seconds (the master's registry write histogram).
        self.write_observer: Callable[[float], None] = lambda seconds: None

    def defer_commits(self, schedule: Callable[[Callable[[], None]], object]) -> None:
        """From now on, keep changes until `flush()`; `schedule(self.flush)` is called
        when a change is first kept (the process shell passes its loop's `call_soon`,
        so they are committed at the end of the loop's turn at the latest)."""
        self._schedule = schedule

    def flush(self) -> None:
        """Commit the changes kept so far, in one transaction. If it fails they are
        kept (and it raises): nothing that depends on them may be acknowledged."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self._commit(pending)
        except BaseException:
            self._pending = pending + self._pending
            raise

    async def durable(self) -> None:
        """Every change so far committed (SQLite commits at once: `flush()`)."""
        self.flush()

    def _change(self, *statements: _Statement) -> None:
        """Apply one change: at once in its own transaction, or kept for `flush()`."""
        if self._schedule is not None:
            if not self._pending:
                self._schedule(self.flush)
            self._pending.extend(statements)
            return
        self._commit(statements)

    def _commit(self, statements: Sequence[_Statement]) -> None:
        started = time.perf_counter()
        with self._db:
            self._db.execute("BEGIN")
            for sql, params, many in statements:
                if many:
                    self._db.executemany(sql, params)
                else:
                    self._db.execute(sql, params)
        self.commits += 1
        self.write_observer(time.perf_counter() - started)

    def _open_schema(self) -> None:
        """Create the tables, or bring an older registry up to `SCHEMA_VERSION`."""
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        exists = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'frameworks'"
        ).fetchone()
        if exists and version == 0:
            version = 1  # version 1 did not set user_version
        if version > SCHEMA_VERSION:
            self._db.close()
            raise RegistryError(
                f"registry {self.path} has schema version {version}, newer than this "
                f"master's {SCHEMA_VERSION}: run the newer master, or move the file away"
            )
        if not exists:
            self._db.executescript(SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};")
            return
        with self._db:
            self._db.execute("BEGIN")
            if version < 2:
                self._db.execute(
                    "ALTER TABLE frameworks ADD COLUMN removing INTEGER NOT NULL DEFAULT 0"
                )
            if version < 3:
                self._db.execute("ALTER TABLE frameworks ADD COLUMN principal TEXT")
                self._db.execute("ALTER TABLE agents ADD COLUMN principal TEXT")
            if version < 4:
                self._db.execute("ALTER TABLE frameworks ADD COLUMN user TEXT NOT NULL DEFAULT ''")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def schema_version(self) -> int:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        return int(version)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()

    # Frameworks ------------------------------------------------------------

    def add_framework(self, entry: FrameworkEntry) -> None:
        self._change(
            (
                "INSERT OR REPLACE INTO frameworks (framework_id, name, role, failover_timeout, "
                "registered_at, removing, principal, user) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.framework_id,
                    entry.name,
                    entry.role,
                    entry.failover_timeout,
                    entry.registered_at,
                    int(entry.removing),
                    entry.principal,
                    entry.user,
                ),
                False,
            )
        )

    def mark_framework_removing(self, framework_id: str) -> None:
        """Torn down: kept until its tasks have ended, so a restart still kills them."""
        self._change(
            ("UPDATE frameworks SET removing = 1 WHERE framework_id = ?", (framework_id,), False)
        )

    def remove_framework(self, framework_id: str) -> None:
        self._change(
            ("DELETE FROM frameworks WHERE framework_id = ?", (framework_id,), False),
            ("DELETE FROM tasks WHERE framework_id = ?", (framework_id,), False),
        )

    def frameworks(self) -> list[FrameworkEntry]:
        self.flush()
        rows = self._db.execute(
            "SELECT framework_id, name, role, failover_timeout, registered_at, removing, "
            "principal, user FROM frameworks ORDER BY registered_at"
        ).fetchall()
        return [
            FrameworkEntry(
                framework_id, name, role, failover, registered_at, bool(removing), principal, user
            )
            for framework_id, name, role, failover, registered_at, removing, principal, user in rows
        ]

    # Agents ----------------------------------------------------------------

    def admit_agent(
        self,
        agent_id: str,
        hostname: str,
        total: Resources,
        now: float,
        principal: str | None = None,
    ) -> None:
        self._change(
            (
                "INSERT OR REPLACE INTO agents VALUES (?, ?, ?, 'admitted', ?, ?)",
                (agent_id, hostname, json.dumps(total.to_dict()), now, principal),
                False,
            )
        )

    def remove_agent(self, agent_id: str, now: float) -> None:
        """Mark the agent removed for good and forget its tasks."""
        self._change(
            (
                "UPDATE agents SET state = 'removed', changed_at = ? WHERE agent_id = ?",
                (now, agent_id),
                False,
            ),
            ("DELETE FROM tasks WHERE agent_id = ?", (agent_id,), False),
        )

    def forget_removed_agent(self, agent_id: str) -> None:
        """Drop a removed agent's row (the master keeps a bounded number of them)."""
        self._change(
            ("DELETE FROM agents WHERE agent_id = ? AND state = 'removed'", (agent_id,), False)
        )

    def agents(self) -> list[AgentEntry]:
        self.flush()
        rows = self._db.execute(
            "SELECT agent_id, hostname, total, state, principal FROM agents ORDER BY changed_at"
        ).fetchall()
        return [
            AgentEntry(
                agent_id, hostname, Resources(json.loads(total)), state == "removed", principal
            )
            for agent_id, hostname, total, state, principal in rows
        ]

    # Tasks -----------------------------------------------------------------

    def add_tasks(self, framework_id: str, agent_id: str, tasks: list[TaskSpec]) -> None:
        self._change(
            (
                "INSERT OR REPLACE INTO tasks VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        framework_id,
                        t.task_id,
                        agent_id,
                        t.name,
                        t.command,
                        json.dumps(t.resources.to_dict()),
                    )
                    for t in tasks
                ],
                True,
            )
        )

    def remove_task(self, framework_id: str, task_id: str) -> None:
        self._change(
            (
                "DELETE FROM tasks WHERE framework_id = ? AND task_id = ?",
                (framework_id, task_id),
                False,
            )
        )

    def tasks(self) -> list[TaskEntry]:
        self.flush()
        rows = self._db.execute(
            "SELECT framework_id, task_id, agent_id, name, command, resources FROM tasks"
        ).fetchall()
        return [
            TaskEntry(
                framework_id,
                agent_id,
                TaskSpec(task_id, command, Resources(json.loads(resources)), name, agent_id),
            )
            for framework_id, task_id, agent_id, name, command, resources in rows
        ]
