"""The built-in workloads' store (mesolite/workloads/store.py): what a restart reads back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mesolite.workloads.progress import Slot, SlotState
from mesolite.workloads.spec import WorkloadKind
from mesolite.workloads.store import StoreError, WorkloadRecord, WorkloadStatus, WorkloadStore

pytestmark = pytest.mark.unit


def record(name: str = "sweep", **changes: object) -> WorkloadRecord:
    r = WorkloadRecord(name, WorkloadKind.JOB, "sweep.toml", "[job]\n", "team-a", 10.0)
    for key, value in changes.items():
        setattr(r, key, value)
    return r


def test_workloads_and_slots_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite"
    store = WorkloadStore(path)
    r = record()
    slots = [Slot(0), Slot(1)]
    store.add(r, slots)
    slots[1] = Slot(1, SlotState.LAUNCHING, "sweep.1.0-ab", 1, 2, 11.5, 3.0, "TASK_LOST")
    r.framework_id, r.counters, r.message = "F1", {"restarts": 2}, "note"
    store.save(r, [slots[1]])
    store.close()

    [(back, back_slots)] = WorkloadStore(path).load()
    assert back == r
    assert back_slots == slots


def test_a_new_workload_replaces_a_finished_one_of_its_name(tmp_path: Path) -> None:
    store = WorkloadStore(tmp_path / "w.sqlite")
    old = record(status=WorkloadStatus.COMPLETED, finished_at=20.0)
    store.add(old, [Slot(0), Slot(1), Slot(2)])
    store.add(record(submitted_at=30.0), [Slot(0)])
    [(back, slots)] = store.load()
    assert back.status is WorkloadStatus.ACTIVE and back.submitted_at == 30.0
    assert slots == [Slot(0)]
    store.delete("sweep")
    assert store.load() == []


def test_a_store_of_a_newer_mesolite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite"
    WorkloadStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer mesolite"):
        WorkloadStore(path)


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot open the workloads store"):
        WorkloadStore(path)
