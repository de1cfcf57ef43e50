"""The workloads as the master's read model shows them: `JobSnapshot`, `ServiceSnapshot`.

Pure: a record and its progress in, an immutable snapshot out. The runner caches each
workload's snapshot until its progress or record changes (`Progress.version`), so a
snapshot of the cluster costs O(workloads), not O(slots), when nothing moved.
"""

from __future__ import annotations

from typing import TypedDict

from mesolite.resources import EMPTY, Resources
from mesolite.snapshot import JobSnapshot, ServiceSnapshot
from mesolite.workloads.progress import JobProgress, Progress, ServiceProgress, SlotState
from mesolite.workloads.spec import WorkloadKind
from mesolite.workloads.store import WorkloadRecord

__all__ = ["FAILED_INDICES_SHOWN", "job_snapshot", "service_snapshot", "snapshot_of"]

FAILED_INDICES_SHOWN = 100


def snapshot_of(record: WorkloadRecord, progress: Progress | None) -> JobSnapshot | ServiceSnapshot:
    if isinstance(progress, JobProgress):
        return job_snapshot(record, progress)
    if isinstance(progress, ServiceProgress):
        return service_snapshot(record, progress)
    return _unreadable(record)


def _counts(record: WorkloadRecord, progress: Progress) -> dict[SlotState, int]:
    """Slots per state; a finished workload runs nothing (a stop tears its framework down
    and the master kills its tasks: their ends are never applied to its slots)."""
    counts = {state: progress.count(state) for state in SlotState}
    if record.status.finished:
        for state in (SlotState.PENDING, SlotState.LAUNCHING, SlotState.RUNNING):
            counts[state] = 0
    return counts


def _common(record: WorkloadRecord, progress: Progress | None) -> _Common:
    return {
        "name": record.name,
        "role": progress.spec.role if progress is not None else "",
        "owner": record.owner,
        "status": record.status.value,
        "framework_id": record.framework_id,
        "submitted_at": record.submitted_at,
        "finished_at": record.finished_at,
        "message": record.message,
        "resources": progress.spec.resources if progress is not None else EMPTY,
    }


def job_snapshot(record: WorkloadRecord, progress: JobProgress) -> JobSnapshot:
    spec = progress.spec
    counts = _counts(record, progress)
    failed = (
        [s.index for s in progress.slots if s.state is SlotState.FAILED]
        if counts[SlotState.FAILED]
        else []
    )
    return JobSnapshot(
        **_common(record, progress),
        completions=spec.completions,
        parallelism=spec.parallelism,
        retries=spec.retries,
        succeeded=counts[SlotState.SUCCEEDED],
        failed=counts[SlotState.FAILED],
        running=counts[SlotState.LAUNCHING] + counts[SlotState.RUNNING],
        pending=counts[SlotState.PENDING],
        retried=progress.attempts_retried,
        failed_indices=tuple(failed[:FAILED_INDICES_SHOWN]),
    )


def service_snapshot(record: WorkloadRecord, progress: ServiceProgress) -> ServiceSnapshot:
    counts = _counts(record, progress)
    return ServiceSnapshot(
        **_common(record, progress),
        instances=progress.spec.instances,
        running=counts[SlotState.RUNNING],
        starting=counts[SlotState.LAUNCHING],
        waiting=counts[SlotState.PENDING],
        restarts=progress.restarts,
        restart_policy=progress.spec.restart.policy.value,
        task_ids=tuple(progress.live_task_ids()) if not record.status.finished else (),
    )


def _unreadable(record: WorkloadRecord) -> JobSnapshot | ServiceSnapshot:
    """A stored workload whose file no longer parses: shown, with why, and nothing else."""
    if record.kind is WorkloadKind.JOB:
        return JobSnapshot(
            **_common(record, None),
            completions=0,
            parallelism=0,
            retries=0,
            succeeded=0,
            failed=0,
            running=0,
            pending=0,
            retried=0,
        )
    return ServiceSnapshot(
        **_common(record, None),
        instances=0,
        running=0,
        starting=0,
        waiting=0,
        restarts=0,
        restart_policy="",
    )


class _Common(TypedDict):
    name: str
    role: str
    owner: str | None
    status: str
    framework_id: str
    submitted_at: float
    finished_at: float | None
    message: str
    resources: Resources
