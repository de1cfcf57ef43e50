"""Failover done right: an id file comes with a failover timeout that lets it be used,
and a framework the master has forgotten is told so plainly, once, with its stale id
file moved aside so the next start registers afresh."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest

from mesolite.framework_sdk import (
    DEFAULT_FAILOVER_TIMEOUT,
    Framework,
    FrameworkGone,
    FrameworkRejected,
    InvalidCall,
    Resources,
    TaskSpec,
    TaskState,
)
from tests.cluster import LocalCluster
from tests.recording import RecordingFramework, running
from tests.test_sdk_fake_master import fake_master
from tests.test_sdk_fake_master import running as running_on_fake
from tests.test_sdk_framework import Recorder
from tests.waiting import wait_for_condition, within


def test_an_id_file_with_failover_timeout_0_is_refused(tmp_path: Path) -> None:
    id_file = tmp_path / "fw.id"
    with pytest.raises(InvalidCall, match="failover_timeout=0") as refused:
        Framework("f", failover_timeout=0, id_file=id_file)
    assert "would never be accepted again" in str(refused.value)
    assert not id_file.exists()
    with pytest.raises(InvalidCall, match="must not be negative"):
        Framework("f", failover_timeout=-1)


def test_the_failover_timeout_defaults_to_a_week_with_an_id_file(tmp_path: Path) -> None:
    assert DEFAULT_FAILOVER_TIMEOUT == 7 * 24 * 3600
    assert Framework("f", id_file=tmp_path / "fw.id").failover_timeout == DEFAULT_FAILOVER_TIMEOUT
    assert Framework("f").failover_timeout == 0.0  # Mesos' default, without an id file
    assert Framework("f", failover_timeout=30, id_file=tmp_path / "x").failover_timeout == 30
    assert Framework("f", failover_timeout=0).failover_timeout == 0.0


async def test_the_default_is_what_the_master_is_told(tmp_path: Path) -> None:
    framework = Recorder(id_file=tmp_path / "fw.id")
    async with fake_master() as master, running_on_fake(framework, master):
        [subscribe] = master.calls_of("subscribe")
        assert subscribe.framework_info.failover_timeout_seconds == DEFAULT_FAILOVER_TIMEOUT
        assert (tmp_path / "fw.id").read_text() == "fw-1"


async def test_a_forgotten_framework_is_told_and_its_id_file_moved_aside(tmp_path: Path) -> None:
    id_file = tmp_path / "fw.id"
    id_file.write_text("fw-gone")
    shown = tmp_path / "fw.id.shown"
    shown.write_text("u1\nu2\n")
    framework = Recorder(failover_timeout=60, id_file=id_file)
    async with fake_master() as master:
        master.reject.append((grpc.StatusCode.NOT_FOUND, "framework fw-gone is not known"))
        with pytest.raises(FrameworkGone) as gone:
            await within(framework.run(master.address), what="run()")
        error = gone.value
        assert isinstance(error, FrameworkRejected)
        assert (error.code, error.details) == ("NOT_FOUND", "framework fw-gone is not known")
        assert error.framework_id == "fw-gone"
        assert error.stale_id_file == tmp_path / "fw.id.stale"
        text = str(error)
        assert "failover timeout (60 s)" in text and "torn down" in text
        assert f"renamed to {tmp_path / 'fw.id.stale'}" in text and "start again" in text
        assert not id_file.exists() and not shown.exists()
        assert (tmp_path / "fw.id.stale").read_text() == "fw-gone"
        assert framework.framework_id is None
        # Started again, as the message says: a new framework, its id kept.
        again = Recorder(failover_timeout=60, id_file=id_file)
        async with running_on_fake(again, master):
            assert master.calls_of("subscribe")[-1].framework_info.framework_id == ""
            assert id_file.read_text() == "fw-1"


async def test_forgotten_while_reconnecting_is_the_same(tmp_path: Path) -> None:
    """Subscribed, then away longer than its failover timeout: the next subscription
    is refused NOT_FOUND, and run() says so rather than retrying for ever."""
    id_file = tmp_path / "fw.id"
    framework = Recorder(failover_timeout=1, id_file=id_file)
    async with fake_master() as master:
        task = asyncio.create_task(framework.run(master.address))
        try:
            await wait_for_condition(lambda: framework.connected, what="subscribed")
            master.reject.append((grpc.StatusCode.NOT_FOUND, "not known"))
            master.end_stream(grpc.StatusCode.UNAVAILABLE, "the network")
            with pytest.raises(FrameworkGone, match="renamed to"):
                await within(task, what="run() to fail")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, FrameworkGone):
                await task
        assert (tmp_path / "fw.id.stale").read_text() == "fw-1"


async def test_without_an_id_file_it_says_to_start_without_the_id() -> None:
    framework = Recorder(framework_id="fw-gone")
    async with fake_master() as master:
        master.reject.append((grpc.StatusCode.NOT_FOUND, "not known"))
        with pytest.raises(FrameworkGone, match="without this framework id") as gone:
            await within(framework.run(master.address), what="run()")
        assert gone.value.stale_id_file is None


async def test_an_id_file_naming_another_framework_is_left_alone(tmp_path: Path) -> None:
    id_file = tmp_path / "fw.id"
    id_file.write_text("fw-other")
    framework = Recorder(framework_id="fw-gone", id_file=id_file)  # the id given wins
    async with fake_master() as master:
        master.reject.append((grpc.StatusCode.NOT_FOUND, "not known"))
        with pytest.raises(FrameworkGone, match="without this framework id"):
            await within(framework.run(master.address), what="run()")
    assert id_file.read_text() == "fw-other"


async def test_a_framework_back_after_its_failover_timeout_on_a_real_master(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:512")
        id_file = tmp_path / "late.id"
        first = RecordingFramework("late", failover_timeout=0.5, id_file=id_file)
        run = asyncio.create_task(first.run(cluster.address))
        await wait_for_condition(lambda: first.connected, what="subscribed")
        offer = await first.next_offer()
        await first.launch(offer, [TaskSpec("t1", "sleep 600", Resources(cpus=0.1, mem=32))])
        await first.wait_state("t1", TaskState.RUNNING)
        gone_id = first.framework_id
        run.cancel()  # as the process dying
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await wait_for_condition(
            lambda: gone_id not in cluster.master.frameworks, what="the framework removed"
        )

        late = RecordingFramework("late", failover_timeout=0.5, id_file=id_file)
        with pytest.raises(FrameworkGone) as gone:
            await within(late.run(cluster.address), what="run()")
        assert f"framework {gone_id} is not known" in str(gone.value)
        assert (tmp_path / "late.id.stale").read_text() == gone_id
        assert not id_file.exists()

        fresh = RecordingFramework("late", failover_timeout=0.5, id_file=id_file)
        async with running(fresh, cluster.address):
            assert fresh.framework_id not in (None, gone_id)
            assert id_file.read_text() == fresh.framework_id
