"""Electing the leading master on etcd: a lease, and a key created in a transaction.

    election = Election(client, "/mesolite", me, ttl=5)
    fence = await election.campaign()      # returns once this master leads
    election.is_leading()                  # until the lease is lost
    await election.lost.wait()

Every master holds a lease of `ttl` seconds, renewed every ttl/3, and registers itself
under `<prefix>/members/<id>` on it (so the leader can list the standbys). To lead, a
master creates `<prefix>/leader` on its lease in a transaction that holds only if the
key does not exist (`create_revision == 0`); its value names the leader's gRPC and HTTP
addresses (`MasterAddress`). The others read the key every `poll` seconds and try again
when it is gone: when the leader's lease expires (it died, or was cut off) or it resigned.

The leader's term is the key's create revision: every registry write is a transaction
guarded on it and on the lease (`master/etcd_registry.py`, `Fence`), so a deposed
leader can never write. On its own side, the leader counts its lease from the moment it
*sent* each renewal (etcd counts from when it received it, later): `is_leading()` turns
False at or before the moment etcd lets the lease go, on the monotonic clock, so a
master frozen (SIGSTOP) or cut off past its lease knows it the instant it runs again,
before it acts. Losing the lease (a renewal refused, or none answered in time) ends the
term for good: `lost` is set and the process steps down (`master/ha.py` stops serving;
`mesolite master` then exits, as a Mesos master does, and its supervisor restarts it as
a standby). A master never leads twice in one process.

Why a 5 s default TTL: a standby takes over within about TTL + poll after the leader
dies (measured: see the README), and the lease must outlast an etcd member failure
(etcd elects a new leader in about 1-2 s with its default 1 s election timeout) and a
loaded machine's pauses; 2 s works on an idle machine (the tests use it), 5 s leaves
room for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from mesolite.master.etcd_client import EtcdClient, EtcdError, Guard, Put
from mesolite.master.etcd_registry import Fence
from mesolite.master.leadership import MasterAddress

log = structlog.get_logger(__name__)

DEFAULT_TTL = 5
POLL_INTERVAL = 0.25
MEMBERS_REFRESH = 1.0  # how often the leader re-reads the list of standbys


class Election:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        me: MasterAddress,
        ttl: int = DEFAULT_TTL,
        poll: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 1:
            raise ValueError(f"the leader lease TTL must be at least 1 s, got {ttl}")
        self._client = client
        self._prefix = prefix.rstrip("/")
        self.key = f"{self._prefix}/leader".encode()
        self._members = f"{self._prefix}/members/".encode()
        self.me = me
        self.ttl = ttl
        self._poll = poll
        self._clock = clock
        self._lease = 0
        self._deadline = 0.0  # the lease lasts at least until then (monotonic)
        self.fence: Fence | None = None
        self._leader: MasterAddress | None = None
        self._standbys: list[MasterAddress] = []
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self.elected_at: float | None = None  # monotonic, when this master took over
        self._keeper: asyncio.Task[None] | None = None
        self._on_lost: list[Callable[[str], None]] = []

    # Leadership ----------------------------------------------------------------

    def is_leading(self) -> bool:
        return self.fence is not None and not self.lost.is_set() and self._clock() < self._deadline

    def leader(self) -> MasterAddress | None:
        if self.fence is not None:
            return self.me if self.is_leading() else None
        return self._leader

    def standbys(self) -> list[MasterAddress]:
        return list(self._standbys)

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` once, when the term ends."""
        self._on_lost.append(callback)

    def lose(self, reason: str) -> None:
        """End this master's term for good (a lost lease, a refused write)."""
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.error("leadership lost; stepping down", master_id=self.me.master_id, reason=reason)
        for callback in self._on_lost:
            callback(reason)

    # Campaigning ---------------------------------------------------------------

    async def _grant(self) -> None:
        sent = self._clock()
        self._lease = await self._client.grant(self.ttl)
        self._deadline = sent + self.ttl
        member = self._members + self.me.master_id.encode()
        await self._client.txn([], [Put(member, self.me.to_json(), self._lease)])

    async def campaign(self) -> Fence:
        """Wait as a standby until this master leads; returns its term's fence."""
        await self._grant()
        self._keeper = asyncio.create_task(self._keep())
        while True:
            try:
                ok, revision, current = await self._client.txn(
                    [Guard.created(self.key, 0)],
                    [Put(self.key, self.me.to_json(), self._lease)],
                    failure_get=self.key,
                )
            except EtcdError as e:
                log.warning("cannot reach etcd to campaign", error=str(e))
                await asyncio.sleep(self._poll)
                continue
            if ok or (current is not None and current.lease == self._lease):
                # (a retried transaction that had been applied: the key is ours)
                created = revision if ok else current.create_revision  # type: ignore[union-attr]
                self.fence = Fence(self.key, created, self._lease)
                self.elected_at = self._clock()
                self._leader = self.me
                log.info(
                    "elected leader",
                    master_id=self.me.master_id,
                    term=created,
                    lease=hex(self._lease),
                    ttl=self.ttl,
                )
                return self.fence
            self._leader = MasterAddress.from_json(current.value) if current else None
            await self._wait_for_vacancy()

    async def _wait_for_vacancy(self) -> None:
        """Read the leader key every `poll` seconds until it is gone."""
        while True:
            await asyncio.sleep(self._poll)
            try:
                current = await self._client.get(self.key)
            except EtcdError:
                continue
            if current is None:
                return
            leader = MasterAddress.from_json(current.value)
            if leader != self._leader:
                log.info("following leader", leader=leader)
            self._leader = leader

    async def _keep(self) -> None:
        """Renew the lease every ttl/3; as the leader, end the term when it lapses."""
        last_members = 0.0
        retrying = False  # the last renewal failed: try again now, not in ttl/3
        while True:
            leading = self.fence is not None
            until_deadline = self._deadline - self._clock()
            await asyncio.sleep(0.0 if retrying else max(0.0, min(self.ttl / 3, until_deadline)))
            retrying = False
            if leading and self._clock() >= self._deadline:
                self.lose("the leader lease was not renewed in time")
                return
            sent = self._clock()
            try:
                # A try may take a quarter of the lease: a hung one leaves time for more.
                ttl = await self._client.keep_alive(self._lease, timeout=max(0.2, self.ttl / 4))
            except EtcdError as e:
                # (A member that died under the stream: the next try opens a new one,
                # on another member; retried at once, the lease being short.)
                log.warning("lease renewal failed", error=str(e), leading=leading)
                await asyncio.sleep(0.05)
                retrying = True
                continue
            if ttl <= 0:
                if self.fence is not None:
                    self.lose("the leader lease expired")
                    return
                with contextlib.suppress(EtcdError):
                    await self._grant()  # a standby's lease lapsed: take a new one
                continue
            self._deadline = sent + ttl
            if self.fence is not None and sent - last_members >= MEMBERS_REFRESH:
                last_members = sent
                await self._refresh_standbys()

    async def _refresh_standbys(self) -> None:
        try:
            kvs, _ = await self._client.get_prefix(self._members)
        except EtcdError:
            return
        found = (MasterAddress.from_json(kv.value) for kv in kvs)
        self._standbys = [m for m in found if m is not None and m != self.me]

    async def close(self, resign: bool = True) -> None:
        """Stop renewing; with `resign`, revoke the lease (the leader key goes at once,
        so a standby takes over without waiting for the TTL)."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        if resign and self._lease:
            with contextlib.suppress(EtcdError):
                await self._client.revoke(self._lease)
        if self.fence is not None and not self.lost.is_set():
            self.lost_reason = "resigned"
            self.lost.set()
            log.info("resigned leadership", master_id=self.me.master_id)
