"""`GET /metrics`: scraped from a real cluster and parsed with Prometheus' own parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.master.metrics import LABELS, RESCIND_REASONS, MasterMetrics
from mesolite.resources import EMPTY
from mesolite.snapshot import ClusterTotals
from mesolite.v1.common_pb2 import TaskInfo
from tests.cluster import LocalCluster, fast
from tests.raw_client import Call, RawFramework, resources
from tests.recording import RecordingFramework, running
from tests.scraping import STANDARD_PREFIXES, scrape, total, value
from tests.support.snapshots import empty_snapshot, framework_snapshot
from tests.waiting import wait_for_condition


async def test_metrics_follow_a_framework_that_runs_a_task(tmp_path: Path) -> None:
    # A long agent timeout: the stopped agent stays listed, disconnected, until the scrape.
    async with LocalCluster(tmp_path, fast(agent_timeout=60.0)) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:1024")
        fw = RecordingFramework("metered")
        async with running(fw, cluster.address):
            offer = await fw.next_offer(agent_id=agent.agent_id)
            seen = len(fw.offers)
            task = TaskSpec("metered-1", "sleep 60", Resources(cpus=1, mem=128))
            await fw.launch(offer, [task], refuse_seconds=0)
            await fw.wait_state("metered-1", TaskState.RUNNING)
            rest = await fw.next_offer(after=seen, agent_id=agent.agent_id)
            await fw.decline(rest, refuse_seconds=3600)
            await fw.decline(rest)  # again: no longer outstanding, so rejected
            await wait_for_condition(lambda: fw.errors != [], what="the second decline rejected")

            # An offer from a second agent, taken back when that agent goes away.
            seen = len(fw.offers)
            second = await cluster.add_agent("cpus:1;mem:256")
            await fw.next_offer(after=seen, agent_id=second.agent_id)
            await second.stop()
            await wait_for_condition(lambda: fw.rescinded != [], what="the offer rescinded")

            samples = await scrape(cluster.server.http_address)

        assert fw.framework_id is not None
        names = {n for n in samples if not n.startswith(STANDARD_PREFIXES)}
        assert all(n.startswith("mesolite_") for n in names), names
        # Labels are ids and enums only (metrics.LABELS): no free text such as a name.
        used = {label for n in names for labels, _ in samples[n] for label in labels}
        assert used <= LABELS | {"le"}, used - LABELS

        # Events.
        sent = value(samples, "mesolite_offers_sent_total")
        accepted = value(samples, "mesolite_offers_accepted_total")
        declined = value(samples, "mesolite_offers_declined_total")
        assert sent >= 3 and accepted == 1 and declined == 1
        assert value(samples, "mesolite_offers_rescinded_total", reason="agent_lost") == 1
        assert value(samples, "mesolite_offers_rescinded_total", reason="timeout") == 0
        rescinded = total(samples, "mesolite_offers_rescinded_total")
        outstanding = value(samples, "mesolite_offers_outstanding")
        assert sent == accepted + declined + rescinded + outstanding  # every offer accounted for
        assert value(samples, "mesolite_calls_rejected_total", call="decline") == 1
        assert value(samples, "mesolite_calls_rejected_total", call="accept") == 0
        assert value(samples, "mesolite_status_updates_forwarded_total", state="TASK_RUNNING") >= 1
        assert value(samples, "mesolite_allocation_cycle_duration_seconds_count") > 0
        assert value(samples, "mesolite_allocation_cycle_duration_seconds_sum") > 0
        assert value(samples, "mesolite_allocation_cycle_offers_count") > 0
        assert value(samples, "mesolite_allocation_cycle_offers_sum") == sent

        # State, read at scrape time.
        assert value(samples, "mesolite_tasks", state="TASK_RUNNING") == 1
        assert value(samples, "mesolite_tasks", state="TASK_STAGING") == 0
        ours = {"framework_id": fw.framework_id, "role": "*"}
        # 1 of the cluster's 3 CPUs (the stopped agent counts until it times out).
        assert value(samples, "mesolite_framework_dominant_share", **ours) == pytest.approx(1 / 3)
        assert value(samples, "mesolite_framework_weighted_share", **ours) == pytest.approx(1 / 3)
        assert value(samples, "mesolite_framework_tasks", **ours) == 1
        assert value(samples, "mesolite_frameworks", state="connected") == 1
        assert value(samples, "mesolite_frameworks", state="disconnected") == 0
        assert value(samples, "mesolite_agents", health="healthy") == 1
        assert value(samples, "mesolite_agents", health="disconnected") == 1
        assert value(samples, "mesolite_cluster_resources", resource="cpus") == 3
        assert value(samples, "mesolite_cluster_resources", resource="mem") == 1280
        assert value(samples, "mesolite_cluster_allocated_resources", resource="cpus") == 1
        assert value(samples, "mesolite_role_allocated", role="*", resource="cpus") == 1
        assert value(samples, "mesolite_role_allocated", role="*", resource="mem") == 128
        assert value(samples, "mesolite_role_weighted_share", role="*") == pytest.approx(1 / 3)
        # The only role, and active: it is fairly entitled to the whole cluster.
        assert value(samples, "mesolite_role_steady_fair_share", role="*", resource="cpus") == 3
        inst = value(samples, "mesolite_role_instantaneous_fair_share", role="*", resource="mem")
        assert inst == 1280


async def test_status_update_retries_are_counted(tmp_path: Path) -> None:
    # A framework that never acknowledges: the agent sends the update again and
    # again, and the master sees the same update id each time.
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:1;mem:256")
        async with RawFramework(cluster.address, name="forgetful") as fw:
            offer = (await fw.next_event("offers")).offers.offers[0]
            task = TaskInfo(task_id="unacked", command="sleep 60", resources=resources(cpus=0.5))
            fw.send(Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=[task])))
            registry = cluster.master.metrics.registry

            def retries() -> float:
                got = registry.get_sample_value("mesolite_status_update_retries_total")
                return got or 0.0

            await wait_for_condition(lambda: retries() >= 1, what="an update sent again")
            samples = await scrape(cluster.server.http_address)
            assert value(samples, "mesolite_status_update_retries_total") >= 1
            # Retries are forwarded too (the framework may have missed the first one).
            forwarded = total(samples, "mesolite_status_updates_forwarded_total")
            assert forwarded > value(samples, "mesolite_tasks", state="TASK_RUNNING")


def test_every_master_has_its_own_registry() -> None:
    # Many masters run in one test process: no "Duplicated timeseries" error,
    # and one master's events do not show in another's metrics.
    first, second = MasterMetrics(), MasterMetrics()
    first.offers_made(3)
    first.offers_rescinded("timeout")
    assert first.registry.get_sample_value("mesolite_offers_sent_total") == 3
    assert second.registry.get_sample_value("mesolite_offers_sent_total") == 0
    rescinded = "mesolite_offers_rescinded_total"
    for reason in RESCIND_REASONS:  # every reason is exported from the start
        assert second.registry.get_sample_value(rescinded, {"reason": reason}) == 0


def test_a_framework_name_is_no_label() -> None:
    # A 30 MB name was once a label of three series: 90 MB of /metrics.
    name = "n" * 1_000_000
    snapshot = empty_snapshot(
        frameworks=(framework_snapshot(id="m1-F0001", name=name),),
        cluster=ClusterTotals(EMPTY, EMPTY, EMPTY, 0, 1, 0, 0),
    )
    text = MasterMetrics().exposition(snapshot)
    assert b"nnnnnnnnnn" not in text
    assert len(text) < 64 * 1024
    assert b'mesolite_framework_tasks{framework_id="m1-F0001",role="*"} 0.0' in text
