"""mesolite's built-in services and jobs (its Marathon and Metronome): `mesolite run FILE`.

A workload file (`spec.py`) declares a job (a command run once per index, so many at a
time, failed indices retried) or a service (so many instances kept running). The master
runs a `WorkloadRunner` beside itself, in its process: one ordinary SDK framework per
workload, subscribed to the master's own gRPC port as the principal `workloads`, so it
passes the same authentication, ACLs and validation as any framework.

    spec.py         the file format and its checks (pure)
    progress.py     the slots of a workload and what to launch next (pure)
    store.py        what survives a restart: workloads and slots, in SQLite
    framework.py    `WorkloadFramework`: one workload, reconciling before it launches
    runner.py       `WorkloadRunner`: every workload's framework, submissions, stops
    snapshots.py    what the master's read model shows of them (pure)
    http.py         POST /workloads and POST /workloads/{name}/stop on the master
"""

from mesolite.workloads.runner import RunnerConfig, SubmissionRefused, WorkloadRunner
from mesolite.workloads.spec import (
    JobSpec,
    ServiceSpec,
    WorkloadFileError,
    load_workload,
    parse_workload,
)

__all__ = [
    "JobSpec",
    "RunnerConfig",
    "ServiceSpec",
    "SubmissionRefused",
    "WorkloadFileError",
    "WorkloadRunner",
    "load_workload",
    "parse_workload",
]
