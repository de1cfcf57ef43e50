"""What the built-in frameworks must not forget across a restart, in SQLite.

One file, `<master work dir>/workloads.sqlite` (beside the master's registry, not in
it: the master's registry is the master's, and a workload is the business of the
frameworks that run it). It holds each submitted workload (its file, who submitted it,
its status, its framework id) and every slot of it (`workloads/progress.py`: the task
it runs, failures, launches). A slot is written **before** its task is launched, so
after any crash the task ids that may be running are on disk, and the restarted
framework asks the master about them instead of launching again.

WAL mode with synchronous=NORMAL, as the master's registry: a commit survives the
process being SIGKILLed. Writes happen on launches and task ends, a few rows each, inline.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mesolite.errors import MesoliteError
from mesolite.workloads.progress import Slot, SlotState
from mesolite.workloads.spec import WorkloadKind

__all__ = ["StoreError", "WorkloadRecord", "WorkloadStatus", "WorkloadStore"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    name TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    source TEXT NOT NULL,
    text TEXT NOT NULL,
    owner TEXT,
    status TEXT NOT NULL,
    framework_id TEXT NOT NULL DEFAULT '',
    framework_gone INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    finished_at REAL,
    message TEXT NOT NULL DEFAULT '',
    counters TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS slots (
    workload TEXT NOT NULL,
    idx INTEGER NOT NULL,
    state TEXT NOT NULL,
    task_id TEXT NOT NULL,
    failures INTEGER NOT NULL,
    launches INTEGER NOT NULL,
    started_at REAL,
    not_before REAL NOT NULL,
    last_end TEXT NOT NULL,
    PRIMARY KEY (workload, idx)
);
"""


class StoreError(MesoliteError):
    """The workloads file cannot be used (say, written by a newer mesolite)."""


class WorkloadStatus(enum.StrEnum):
    ACTIVE = "active"  # running, or waiting to
    COMPLETED = "completed"  # a job all of whose indices succeeded (or a service done)
    FAILED = "failed"  # a job with an index that failed every try
    STOPPED = "stopped"  # stopped by a user (`mesolite stop`)

    @property
    def finished(self) -> bool:
        return self is not WorkloadStatus.ACTIVE


@dataclass(slots=True)
class WorkloadRecord:
    """One submitted workload, as stored (its progress is in its slots)."""

    name: str
    kind: WorkloadKind
    source: str  # the file name it was submitted as
    text: str  # the file itself: parsed again when read back
    owner: str | None  # the submitter's principal (None: no authentication)
    submitted_at: float
    status: WorkloadStatus = WorkloadStatus.ACTIVE
    framework_id: str = ""
    # Its framework is known to be gone from the master (torn down, or never subscribed).
    framework_gone: bool = False
    finished_at: float | None = None
    message: str = ""  # the last problem worth showing (a refused subscription, ...)
    counters: dict[str, int] = field(default_factory=dict)


class WorkloadStore:
    def __init__(self, path: Path | None) -> None:
        """Open (or create) the store at `path`; None keeps it in memory (tests)."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(path or ":memory:", isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open the workloads store {path}: {e}") from None
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path} was written by a newer mesolite (schema {version}, this one reads "
                f"{SCHEMA_VERSION})"
            )
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def load(self) -> list[tuple[WorkloadRecord, list[Slot]]]:
        """Every workload with its slots, oldest first."""
        rows = self._db.execute(
            "SELECT name, kind, source, text, owner, status, framework_id, framework_gone,"
            " submitted_at, finished_at, message, counters FROM workloads"
            " ORDER BY submitted_at, name"
        ).fetchall()
        out = []
        for row in rows:
            record = _record(row)
            out.append((record, self._slots(record.name)))
        return out

    def _slots(self, name: str) -> list[Slot]:
        rows = self._db.execute(
            "SELECT idx, state, task_id, failures, launches, started_at, not_before, last_end"
            " FROM slots WHERE workload = ? ORDER BY idx",
            (name,),
        ).fetchall()
        return [Slot(r[0], SlotState(r[1]), r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def add(self, record: WorkloadRecord, slots: Iterable[Slot]) -> None:
        """A new workload, replacing a finished one of the same name (with its slots)."""
        with self._transaction():
            self._db.execute("DELETE FROM slots WHERE workload = ?", (record.name,))
            self._db.execute("DELETE FROM workloads WHERE name = ?", (record.name,))
            self._db.execute(
                "INSERT INTO workloads (name, kind, source, text, owner, status, framework_id,"
                " framework_gone, submitted_at, finished_at, message, counters)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _row(record),
            )
            self._write_slots(record.name, slots)

    def save(self, record: WorkloadRecord, slots: Iterable[Slot] = ()) -> None:
        """The record's fields and the given slots, in one transaction."""
        with self._transaction():
            self._db.execute(
                "UPDATE workloads SET status = ?, framework_id = ?, framework_gone = ?,"
                " finished_at = ?, message = ?, counters = ? WHERE name = ?",
                (
                    record.status.value,
                    record.framework_id,
                    int(record.framework_gone),
                    record.finished_at,
                    record.message,
                    json.dumps(record.counters),
                    record.name,
                ),
            )
            self._write_slots(record.name, slots)

    def delete(self, name: str) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM slots WHERE workload = ?", (name,))
            self._db.execute("DELETE FROM workloads WHERE name = ?", (name,))

    def _write_slots(self, name: str, slots: Iterable[Slot]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO slots (workload, idx, state, task_id, failures, launches,"
            " started_at, not_before, last_end) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                (
                    name,
                    s.index,
                    s.state.value,
                    s.task_id,
                    s.failures,
                    s.launches,
                    s.started_at,
                    s.not_before,
                    s.last_end,
                )
                for s in slots
            ),
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _row(record: WorkloadRecord) -> tuple[object, ...]:
    return (
        record.name,
        record.kind.value,
        record.source,
        record.text,
        record.owner,
        record.status.value,
        record.framework_id,
        int(record.framework_gone),
        record.submitted_at,
        record.finished_at,
        record.message,
        json.dumps(record.counters),
    )


def _record(row: tuple[object, ...]) -> WorkloadRecord:
    (
        name,
        kind,
        source,
        text,
        owner,
        status,
        framework_id,
        gone,
        submitted,
        finished,
        message,
        counters,
    ) = row
    assert isinstance(name, str) and isinstance(kind, str) and isinstance(status, str)
    assert isinstance(source, str) and isinstance(text, str) and isinstance(message, str)
    assert isinstance(framework_id, str) and isinstance(counters, str)
    assert isinstance(submitted, float | int)
    return WorkloadRecord(
        name=name,
        kind=WorkloadKind(kind),
        source=source,
        text=text,
        owner=owner if isinstance(owner, str) else None,
        submitted_at=float(submitted),
        status=WorkloadStatus(status),
        framework_id=framework_id,
        framework_gone=bool(gone),
        finished_at=float(finished) if isinstance(finished, float | int) else None,
        message=message,
        counters=json.loads(counters),
    )
