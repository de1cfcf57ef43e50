"""Test layers, declared in one place.

- unit: pure and in-process: no network, no subprocess, no sleeps worth the
  name. `make test-fast` runs these but the slow ones (under 30 s).
- integration: real gRPC over loopback, real subprocesses, real files.
- slow: integration tests that take tens of seconds each (master restarts,
  fault injection, the browser); `pytest -m "not slow"` leaves them out.

A test file is in the unit layer when it is listed below; everything else is
integration. Files may also mark tests themselves (`pytestmark`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.accounts import throwaway_accounts
from tests.support.cgroups import (
    DEFAULT_CGROUPS_ROOT,
    TEST_CGROUPS_ROOT,
    hierarchy_mounts,
    remove_tree,
)
from tests.support.core import CoreHarness

UNIT = {
    "test_agent_journal.py",
    "test_agent_updates.py",
    "test_allocator.py",
    "test_allocator_hierarchy.py",
    "test_ceei.py",
    "test_certs.py",
    "test_drf_reference.py",
    "test_errors.py",
    "test_fair_share.py",
    "test_fairness_properties.py",
    "test_master_core.py",
    "test_mesos_core.py",
    "test_policies.py",
    "test_planted_bugs.py",
    "test_policy_properties.py",
    "test_preemption.py",
    "test_preemptions.py",
    "test_demand.py",
    "test_reservations.py",
    "test_resources.py",
    "test_role_tree.py",
    "test_roles_config.py",
    "test_sdk_public_api.py",
    "test_simulator.py",
    "test_sim_preemption.py",
    "test_task_usage.py",
}
SLOW = {
    "test_fault_injection.py",
    "test_ha_masters.py",
    "test_master_restart.py",
    "test_mesos_pymesos.py",
    "test_restart_workload.py",
    "test_ui_browser.py",
}


IDLE_CHECK = "test_mesos_pymesos.py::test_an_idle_subscription_and_calls_connection_outlive"
IDLE_RUN = pytest.StashKey[tuple[Path, "subprocess.Popen[bytes]"]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The pymesos idle check's 100 s run starts as soon as its test is selected and
    goes on beside the other tests (tests/support/pymesos_idle.py)."""
    if any(IDLE_CHECK in item.nodeid for item in session.items):
        from tests.support import pymesos_idle

        work_dir = Path(tempfile.mkdtemp(prefix="mesolite-pymesos-idle-"))
        session.config.stash[IDLE_RUN] = (work_dir, pymesos_idle.start(work_dir))


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash.get(IDLE_RUN, None)
    if run is not None:
        from tests.support import pymesos_idle

        work_dir, process = run
        pymesos_idle.stop(process)
        shutil.rmtree(work_dir, ignore_errors=True)


@pytest.fixture
def pymesos_idle_run(request: pytest.FixtureRequest) -> tuple[Path, subprocess.Popen[bytes]]:
    """The pymesos idle check's run (work dir, process), started at collection."""
    return request.config.stash[IDLE_RUN]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = Path(str(item.fspath)).name
        if name in UNIT or item.get_closest_marker("unit"):
            item.add_marker(pytest.mark.unit)
        else:
            item.add_marker(pytest.mark.integration)
            if name in SLOW:
                item.add_marker(pytest.mark.slow)


@pytest.fixture
def core() -> Iterator[CoreHarness]:
    """A master core driven directly (tests/support/core.py); sound at the end."""
    harness = CoreHarness()
    yield harness
    harness.assert_sound()


@pytest.fixture
def unix_users() -> Iterator[tuple[str, str]]:
    """Two new unprivileged Unix accounts, deleted after the test (tests/support/accounts.py);
    the test is skipped where they cannot be made (not root, no useradd)."""
    with throwaway_accounts(2) as (first, second):
        yield first, second


@pytest.fixture(scope="session", autouse=True)
def _test_cgroups() -> Iterator[None]:
    """Agents in tests put their tasks' cgroups under one root per session
    (tests/support/cgroups.py); whatever a test left there is killed and removed.
    Agents with the default root (the demo's) remove their own directories when
    they stop; the root itself goes too if this session made it."""
    default_roots = [m / DEFAULT_CGROUPS_ROOT for m in hierarchy_mounts()]
    existed = {r for r in default_roots if r.exists()}
    yield
    remove_tree(TEST_CGROUPS_ROOT)
    for root in default_roots:
        if root not in existed:
            with contextlib.suppress(OSError):
                root.rmdir()  # only if empty: nothing of a real agent's is touched


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures of the fuzz layers that ran (tests/support/fuzzing.py)."""
    from tests.support.fuzzing import FIGURES

    for found in FIGURES.values():
        terminalreporter.write_line(found.line())
