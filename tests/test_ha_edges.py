"""The edges of highly available masters, in-process: a master that does not lead
refuses gRPC naming the leader and answers HTTP 307; clients' master lists; the registry
URL; an election's term ending on the monotonic clock; acknowledgements after durability."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from mesolite.certs import init_cluster, issue
from mesolite.grpc_utils import create_channel
from mesolite.master.election import Election
from mesolite.master.errors import RegistryFenced
from mesolite.master.etcd_client import EtcdClient, EtcdError, EtcdTls, Put
from mesolite.master.etcd_registry import EtcdRegistry
from mesolite.master.ha import HaMaster, RegistryUrl
from mesolite.master.leadership import MasterAddress
from mesolite.master.registry import FrameworkEntry
from mesolite.master.server import MasterServer
from mesolite.masters import (
    LEADER_METADATA,
    MasterList,
    MasterListError,
    leader_hint,
    parse_masters,
)
from mesolite.tls import MASTER_SERVER_NAME, TlsConfig
from mesolite.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import FAST, LocalCluster
from tests.etcd_cluster import EtcdCluster
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition

LEADER = MasterAddress("m2", "10.0.0.9:5050", "http://10.0.0.9:5051")


class Switch:
    """A leadership a test turns off."""

    def __init__(self) -> None:
        self.leading = True

    def is_leading(self) -> bool:
        return self.leading

    def leader(self) -> MasterAddress | None:
        return None if self.leading else LEADER

    def standbys(self) -> list[MasterAddress]:
        return []


async def _subscribe_refusal(address: str) -> grpc.aio.AioRpcError | None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
        try:
            await call.write(scheduler_pb2.Call())  # refused before it is even read
            await asyncio.wait_for(call.read(), 5)
        except grpc.aio.AioRpcError as e:
            return e
        finally:
            call.cancel()
    return None


async def test_a_master_that_does_not_lead_refuses_calls_and_redirects_http(
    tmp_path: Path,
) -> None:
    switch = Switch()
    cluster = LocalCluster(tmp_path)
    cluster.server.leadership = switch
    async with cluster, aiohttp.ClientSession() as http:
        url = f"http://{cluster.server.http_address}/state?x=1"
        async with http.get(url, allow_redirects=False) as r:
            assert r.status == 200
        framework = RecordingFramework()
        async with running(framework, cluster.address):
            switch.leading = False
            # A new call is refused before any handler runs, naming the leader.
            refusal = await _subscribe_refusal(cluster.address)
            assert refusal is not None and refusal.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(refusal.trailing_metadata() or ())[LEADER_METADATA] == LEADER.grpc
            assert LEADER.grpc in (refusal.details() or "")
            async with http.get(url, allow_redirects=False) as r:
                assert r.status == 307
                assert r.headers["Location"] == "http://10.0.0.9:5051/state?x=1"
            # The open stream sends nothing more: it ends at its next message.
            cluster.master.send_framework_heartbeats()
            await wait_for_condition(lambda: not framework.connected, 10, "the stream to end")


def test_master_lists_parse_and_reject() -> None:
    assert parse_masters("h1:5050, h2:5050,") == ("h1:5050", "h2:5050")
    for bad in ("", "h1", "h1:x", "h1:5050,:1", "h:70000", ",".join(["h:1"] * 17)):
        with pytest.raises(MasterListError):
            parse_masters(bad)
    assert leader_hint([(LEADER_METADATA, "h2:5050")]) == "h2:5050"
    assert leader_hint([(LEADER_METADATA, "not an address")]) is None
    assert leader_hint(None) is None


def test_a_master_list_follows_hints_and_backs_off_after_a_round() -> None:
    masters = MasterList(("a:1", "b:1", "c:1"))
    assert masters.current == "a:1"
    assert not masters.failed()  # a is gone: try b at once
    assert masters.current == "b:1"
    assert not masters.failed("c:1")  # b is a standby naming c: go there at once
    assert masters.current == "c:1"
    masters.connected()
    assert not masters.failed()  # c died: a, then b, then back off
    assert not masters.failed()
    assert masters.failed()
    assert masters.current == "c:1"
    assert not masters.failed("a:1")  # c is a standby now, naming a: at once
    assert not masters.failed()  # a is not there yet: on to b
    assert masters.failed("a:1")  # b names a again: a stale hint, back off first
    assert masters.current == "a:1"
    one = MasterList(("a:1",))
    assert one.failed() and one.current == "a:1"  # one master: back off each time
    assert one.failed()


def test_registry_urls() -> None:
    url = RegistryUrl.parse("etcd://h1:2379,h2:2379/mesolite/prod/")
    assert url == RegistryUrl(("h1:2379", "h2:2379"), "/mesolite/prod")
    assert RegistryUrl.parse("etcd://h1:2379").prefix == "/mesolite"
    for bad in ("sqlite:///x", "etcd://", "etcd://h1/x", "etcd://h1:99999/x"):
        with pytest.raises(ValueError):
            RegistryUrl.parse(bad)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_leader_stops_leading_the_moment_its_lease_may_have_lapsed(
    tmp_path: Path,
) -> None:
    """On its own clock, before any renewal fails: a frozen leader knows on waking."""
    async with EtcdCluster(tmp_path, members=1) as etcd:
        client = EtcdClient(etcd.endpoints)
        clock = FakeClock()
        election = Election(client, "/e", MasterAddress("m1", "h:1", "http://h:2"), 5, clock=clock)
        try:
            fence = await election.campaign()
            registry = EtcdRegistry(client, "/e", fence, leading=election.is_leading)
            assert election.is_leading() and election.leader() == election.me
            clock.now += 5.0  # as if the process had been stopped for a TTL
            assert not election.is_leading()
            assert election.leader() is None
            # etcd has not let the lease go (no time passed for it): the guard would
            # hold, but the registry writes nothing once the term is over here.
            registry.add_framework(FrameworkEntry("F1", "late", "*", 0.0, 1.0))
            with pytest.raises(RegistryFenced):
                await registry.durable()
            assert await client.get(b"/e/registry/frameworks/F1") is None
        finally:
            await election.close()
            await client.close()


async def test_subscribed_is_sent_only_once_its_registration_is_in_etcd(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path, members=1) as etcd:
        client = EtcdClient(etcd.endpoints, timeout=20)
        me = MasterAddress("m1", "127.0.0.1:0", "http://127.0.0.1:0")
        election = Election(client, "/d", me, ttl=30)
        fence = await election.campaign()
        registry = EtcdRegistry(client, "/d", fence, on_fenced=election.lose, write_timeout=20)
        server = MasterServer(FAST, port=0, http_port=0, registry=registry, leadership=election)
        await server.start()
        [proc] = [p for p in etcd.procs if p is not None]
        framework = RecordingFramework(failover_timeout=60)
        run = None
        try:
            proc.send_signal(signal.SIGSTOP)  # etcd cannot commit anything
            try:
                run = asyncio.create_task(framework.run(server.grpc_address))
                master = server.master
                assert master is not None
                await wait_for_condition(lambda: len(master.frameworks) == 1, 10, "subscribe")
                # The change is made and waits for etcd; a master that did not wait for
                # it would have sent SUBSCRIBED within milliseconds (a bounded negative).
                await asyncio.sleep(0.5)
                assert not framework.connected and framework.framework_id is None
            finally:
                proc.send_signal(signal.SIGCONT)
            await wait_for_condition(lambda: framework.connected, 20, "SUBSCRIBED")
            key = f"/d/registry/frameworks/{framework.framework_id}".encode()
            assert await client.get(key) is not None
        finally:
            await framework.stop()
            if run is not None:
                await asyncio.wait_for(run, 10)
            await server.stop()
            await election.close()
            await client.close()


async def test_the_etcd_client_speaks_tls_with_a_client_certificate(tmp_path: Path) -> None:
    """etcd with --client-cert-auth: the master's bundle gets in; no certificate, or a CA
    that did not sign the members' certificate, does not."""
    init_cluster(tmp_path / "certs")
    server = issue(tmp_path / "certs", "etcd", hosts=["127.0.0.1"]).parent / "etcd"
    ca, master = tmp_path / "certs" / "ca.crt", tmp_path / "certs" / "master"
    good = EtcdTls(ca, master / "tls.crt", master / "tls.key", server_name="localhost")
    server_pair = (server / "tls.crt", server / "tls.key")
    async with EtcdCluster(tmp_path / "etcd", members=1, tls=good, server=server_pair) as etcd:
        client = EtcdClient(etcd.endpoints, tls=good)
        try:
            ok, _, _ = await client.txn([], [Put(b"/tls/probe", b"x")])
            assert ok and (await client.get(b"/tls/probe")) is not None
        finally:
            await client.close()
        init_cluster(tmp_path / "other")
        for bad in (
            EtcdTls(ca, server_name="localhost"),  # no client certificate
            EtcdTls(tmp_path / "other" / "ca.crt", master / "tls.crt", master / "tls.key"),
        ):
            client = EtcdClient(etcd.endpoints, tls=bad, timeout=2.0)
            try:
                with pytest.raises(EtcdError):
                    await client.get(b"/tls/probe")
            finally:
                await client.close()


async def test_the_leader_compacts_etcds_history(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path, members=1) as etcd:
        ha = HaMaster(
            RegistryUrl.parse(etcd.url + "/c"),
            host="127.0.0.1",
            port=0,
            http_port=0,
            compaction_interval=0.1,
        )
        await ha.start()
        try:
            registry = await ha.until_leading()
            registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
            await registry.durable()
            first = registry.revision
            registry.add_framework(FrameworkEntry("F1", "renamed", "*", 0.0, 1.0))
            await registry.durable()
            key = b"/c/registry/frameworks/F1"

            async def compacted() -> bool:
                try:
                    await ha.client.get(key, revision=first)
                except EtcdError:
                    return True
                return False

            deadline = asyncio.get_running_loop().time() + 10
            while not await compacted():
                assert asyncio.get_running_loop().time() < deadline, "never compacted"
                await asyncio.sleep(0.05)
            assert (await ha.client.get(key)) is not None  # the newest value stays
        finally:
            await ha.close()


async def test_a_standby_keeps_the_clusters_tls(tmp_path: Path) -> None:
    """A standby of a TLS cluster speaks only TLS, wants a client certificate on gRPC,
    and names the leader only to a client that has one."""
    init_cluster(tmp_path / "certs")
    master_tls = TlsConfig.from_dir(tmp_path / "certs" / "master")
    framework_tls = TlsConfig.from_dir(tmp_path / "certs" / "framework")
    async with EtcdCluster(tmp_path / "etcd", members=1) as etcd:
        url = RegistryUrl.parse(etcd.url + "/tls")
        leader = HaMaster(url, host="127.0.0.1", port=0, http_port=0, tls=master_tls)
        standby = HaMaster(url, host="127.0.0.1", port=0, http_port=0, tls=master_tls)
        await leader.start()
        await leader.until_leading()
        await standby.start()
        campaign = asyncio.create_task(standby.until_leading())
        try:
            assert standby.election is not None
            await wait_for_condition(lambda: standby.election.leader() is not None, 10, "leader")  # type: ignore[union-attr]
            address = f"127.0.0.1:{standby.port}"
            async with create_channel(address, framework_tls) as channel:
                call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.write(scheduler_pb2.Call())
                    await asyncio.wait_for(call.read(), 5)
                call.cancel()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            metadata = dict(refused.value.trailing_metadata() or ())
            assert metadata[LEADER_METADATA] == f"127.0.0.1:{leader.port}"
            # Without a client certificate, or without TLS: no answer, no hint.
            for plain in (True, False):
                if plain:
                    channel = grpc.aio.insecure_channel(address)
                else:
                    no_cert = TlsConfig(master_tls.ca)
                    channel = create_channel(address, no_cert)
                async with channel:
                    call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
                    with pytest.raises(grpc.aio.AioRpcError) as failed:
                        await call.write(scheduler_pb2.Call())
                        await asyncio.wait_for(call.read(), 5)
                    call.cancel()
                assert LEADER_METADATA not in dict(failed.value.trailing_metadata() or ())
            ssl_context = framework_tls.client_context(server_name=MASTER_SERVER_NAME)
            async with aiohttp.ClientSession() as http:
                https = f"https://127.0.0.1:{standby.http_port}/state"
                async with http.get(https, ssl=ssl_context, allow_redirects=False) as r:
                    assert r.status == 307
                    assert r.headers["Location"] == f"https://127.0.0.1:{leader.http_port}/state"
                with pytest.raises(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{standby.http_port}/state") as r:
                        await r.read()
        finally:
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign
            await standby.close()
            await leader.close()


async def test_nothing_is_written_once_the_term_is_over_on_this_masters_clock(
    tmp_path: Path,
) -> None:
    """Leadership lost before etcd lets the lease go (the guard would still hold): what
    the master does as it stops serving is not written."""
    async with EtcdCluster(tmp_path, members=1) as etcd:
        ha = HaMaster(RegistryUrl.parse(etcd.url + "/t"), host="127.0.0.1", port=0, http_port=0)
        await ha.start()
        try:
            registry = await ha.until_leading()
            assert ha.election is not None
            registry.add_framework(FrameworkEntry("F1", "batch", "*", 0.0, 1.0))
            await registry.durable()
            ha.election.lose("the leader lease was not renewed in time")
            registry.mark_framework_removing("F1")  # a failover-0 teardown as streams close
            with pytest.raises(RegistryFenced):
                await registry.durable()
            stored = await ha.client.get(b"/t/registry/frameworks/F1")
            assert stored is not None and b'"removing": false' in stored.value
        finally:
            await ha.close()


async def test_a_master_that_does_not_lead_runs_no_periodic_action(tmp_path: Path) -> None:
    """Woken from a stall past its lease, a master finds every agent silent: it must not
    remove them (the agents would kill their tasks), nor allocate, nor heartbeat."""
    switch = Switch()
    cluster = LocalCluster(tmp_path)
    cluster.server.leadership = switch
    async with cluster:
        agent = await cluster.add_agent("cpus:1;mem:64")
        switch.leading = False
        cluster.clock.skipped += 3 * cluster.config.agent_timeout  # silent for that long
        cycles = cluster.master.allocation_cycles
        # The health check runs every 0.2 s here: a bounded wait for what must not happen.
        await asyncio.sleep(1.0)
        assert agent.agent_id in cluster.master.agents
        assert not cluster.master.removed_agents
        assert cluster.master.allocation_cycles == cycles
