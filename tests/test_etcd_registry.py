"""The etcd registry against a real 3-member etcd cluster: the SQLite registry's contract,
writes batched and split within etcd's limits, and every write fenced by leadership."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mesolite.master.effects import RegistryStore
from mesolite.master.errors import RegistryFenced
from mesolite.master.etcd_client import (
    MAX_TXN_OPS,
    Delete,
    EtcdClient,
    Guard,
    Put,
    prefix_end,
)
from mesolite.master.etcd_registry import EtcdRegistry, Fence, split
from mesolite.master.registry import FrameworkEntry, Registry, RegistryError
from mesolite.model import TaskSpec
from mesolite.resources import Resources
from tests.etcd_cluster import EtcdCluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    try:
        asyncio.run(cluster.start())
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def client(etcd: EtcdCluster) -> AsyncIterator[EtcdClient]:
    c = EtcdClient(etcd.endpoints)
    yield c
    await c.close()


async def _leader(client: EtcdClient, prefix: str) -> Fence:
    """Become the leader under `prefix` the way master/election.py does."""
    lease = await client.grant(30)
    key = f"{prefix}/leader".encode()
    ok, revision, _ = await client.txn([Guard.created(key, 0)], [Put(key, b"me", lease)])
    assert ok
    return Fence(key, revision, lease)


def _task(task_id: str, cpus: float = 1) -> TaskSpec:
    return TaskSpec(task_id, "sleep 60", Resources(cpus=cpus), task_id)


async def _reopened(client: EtcdClient, prefix: str) -> EtcdRegistry:
    again = EtcdRegistry(client, prefix, None)
    await again.load()
    return again


def test_prefix_end_is_etcds_convention() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_a_turns_changes_are_split_within_etcds_limits() -> None:
    puts = [[Put(f"/t/{i}".encode(), b"x")] for i in range(300)]
    assert [len(t) for t in split(puts)] == [MAX_TXN_OPS, MAX_TXN_OPS, 300 - 2 * MAX_TXN_OPS]
    big = [[Put(f"/b/{i}".encode(), b"x" * 400_000)] for i in range(5)]
    assert [len(t) for t in split(big)] == [2, 2, 1]  # about 1 MiB each
    # A change's operations stay together; one change too big alone is split.
    pair = [[Put(f"/p/{i}a".encode(), b"x"), Put(f"/p/{i}b".encode(), b"x")] for i in range(65)]
    assert [len(t) for t in split(pair)] == [128, 2]
    shifted = [[Put(b"/one", b"x")], *pair]
    assert [len(t) for t in split(shifted)] == [127, 4]  # not 128: the 64th pair moves on
    huge: list[list[Put | Delete]] = [[Put(f"/h/{i}".encode(), b"x") for i in range(200)]]
    assert [len(t) for t in split(huge)] == [128, 72]
    # One key twice: the later value, once. A prefix deleted after a put under it (or a
    # put under a deleted prefix) goes into the next transaction, in order.
    same = split([[Put(b"/k", b"1")], [Put(b"/k", b"2")]])
    assert same == [[Put(b"/k", b"2")]]
    ordered = split([[Put(b"/p/1", b"x")], [Delete(b"/p/", prefix=True)], [Put(b"/p/2", b"y")]])
    assert ordered == [[Put(b"/p/1", b"x")], [Delete(b"/p/", prefix=True)], [Put(b"/p/2", b"y")]]


async def test_the_etcd_registry_keeps_what_the_sqlite_one_does(client: EtcdClient) -> None:
    """The same calls on both stores read back the same, and so after a reload."""
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    fence = await _leader(client, prefix)
    sqlite, etcd_store = Registry(None), EtcdRegistry(client, prefix, fence)
    stores: list[RegistryStore] = [sqlite, etcd_store]
    for r in stores:
        r.add_framework(FrameworkEntry("F1", "batch", "eng", 5.0, 100.0, principal="team-a"))
        r.add_framework(FrameworkEntry("F/2", "odd id", "*", 0.0, 50.0, user="alice"))
        r.admit_agent("S1", "host1", Resources.parse("cpus:4;mem:1024"), 10.0, "agent-1")
        r.admit_agent("S2", "host2", Resources.parse("cpus:2"), 20.0)
        r.add_tasks("F1", "S1", [_task("t1"), _task("t/2", 0.5)])
        r.add_tasks("F/2", "S2", [_task("t3")])
        r.add_tasks("F1", "S2", [_task("t4")])
        r.mark_framework_removing("F1")
        r.remove_task("F1", "t/2")
        r.remove_agent("S2", 30.0)  # its tasks go: t3 and t4
        r.add_tasks("F1", "S1", [_task("t5")])
        await r.durable()
    reloaded = await _reopened(client, prefix)

    def contents(r: RegistryStore) -> tuple[object, ...]:
        return (
            r.frameworks(),
            r.agents(),
            sorted((t.framework_id, t.task.task_id, t.agent_id, repr(t.task)) for t in r.tasks()),
        )

    assert contents(etcd_store) == contents(sqlite) == contents(reloaded)
    assert [f.framework_id for f in reloaded.frameworks()] == ["F/2", "F1"]
    assert [(a.agent_id, a.removed) for a in reloaded.agents()] == [("S1", False), ("S2", True)]
    for r in (sqlite, etcd_store, reloaded):
        r.forget_removed_agent("S1")  # admitted: kept
        r.forget_removed_agent("S2")
        r.remove_framework("F1")
    await etcd_store.durable()
    reloaded = await _reopened(client, prefix)
    assert contents(reloaded) == contents(sqlite) == contents(etcd_store)
    assert [f.framework_id for f in reloaded.frameworks()] == ["F/2"]
    assert reloaded.tasks() == []  # F/2's only task was on S2
    sqlite.close()


async def test_one_turns_changes_are_one_transaction_split_past_the_limits(
    client: EtcdClient,
) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    registry = EtcdRegistry(client, prefix, await _leader(client, prefix))
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))  # one key twice
    registry.add_tasks("F1", "S1", [_task("t1")])
    await registry.durable()
    assert registry.commits == 1
    registry.add_tasks("F1", "S1", [_task(f"many-{i}") for i in range(300)])
    await registry.durable()
    assert registry.commits == 1 + 3
    assert len((await _reopened(client, prefix)).tasks()) == 301


async def test_a_write_after_the_leader_key_is_gone_is_refused_and_fences_for_good(
    client: EtcdClient,
) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    fence = await _leader(client, prefix)
    fenced: list[str] = []
    registry = EtcdRegistry(client, prefix, fence, on_fenced=fenced.append)
    registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
    await registry.durable()
    # The lease expires (revoked here): the key goes, another master takes over.
    await client.revoke(fence.lease)
    rival = await _leader(client, prefix)
    assert rival.create_revision != fence.create_revision
    registry.add_framework(FrameworkEntry("F2", "late", "*", 0.0, 2.0))
    with pytest.raises(RegistryFenced):
        await registry.durable()
    assert len(fenced) == 1
    registry.remove_framework("F1")  # no later change is written, nor acknowledged
    with pytest.raises(RegistryFenced):
        await registry.durable()
    assert [f.framework_id for f in (await _reopened(client, prefix)).frameworks()] == ["F1"]


async def test_a_registry_of_a_newer_master_is_refused(client: EtcdClient) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    await client.txn([], [Put(f"{prefix}/registry/version".encode(), b'{"version": 99}')])
    with pytest.raises(RegistryError, match="newer than this master"):
        await _reopened(client, prefix)


async def test_writes_go_on_through_another_member_when_one_dies(
    tmp_path: Path,
) -> None:
    async with EtcdCluster(tmp_path) as cluster:
        c = EtcdClient(cluster.endpoints)
        try:
            prefix = "/m"
            registry = EtcdRegistry(c, prefix, await _leader(c, prefix))
            registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
            await registry.durable()
            cluster.kill(0)  # the member the channel picked first
            registry.add_framework(FrameworkEntry("F2", "batch", "*", 0.0, 2.0))
            await asyncio.wait_for(registry.durable(), 10)
            assert registry.failure is None
            assert len((await _reopened(c, prefix)).frameworks()) == 2
        finally:
            await c.close()
