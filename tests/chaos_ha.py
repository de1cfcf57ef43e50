"""Fault injection against highly available masters (tests/chaos.py, with etcd).

The same cluster, frameworks, faults and judgement as `tests/chaos.py`, but three
masters share a registry in a 3-member etcd cluster (tests/etcd_cluster.py); agents and
frameworks are given all three (`--master a,b,c`). The master faults become:

- leader killed (SIGKILL), sometimes with an agent or a framework fault while no
  master leads; it comes back as a standby;
- leader stopped (SIGSTOP) past its lease, then continued: it must find itself deposed
  and exit (status 3); it is started again as a standby;
- an etcd member killed and restarted: no master should lose its lease for it
  (counted in `etcd_member_leader_changes`, not a violation: a loaded machine can
  stall etcd's own election past a 2 s lease). A leader that lost its lease so exits
  (status 3); before each fault the harness starts again any master that exited, as
  its supervisor would (counted as "restart after exit").

Each takeover is timed from the kill (or stop) to another master serving /state itself.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.chaos import Chaos, Report
from tests.cluster import MasterProcess
from tests.etcd_cluster import EtcdCluster

MASTERS = 3
LEADER_TTL = 2


class HaMasterProcess(MasterProcess):
    """`mesolite master --registry etcd://...` in its own process (tests/cluster.py)."""

    def __init__(self, work_dir: Path, *flags: str) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(work_dir, *flags)
        self.ready = b"standby master"  # the first line of an HA master

    def log(self) -> str:
        """What every run of this master logged."""
        return "".join(p.read_text() for p in sorted(self.work_dir.glob("master-*.log")))

    async def leads(self, http: aiohttp.ClientSession) -> bool:
        if self.process is None or self.process.returncode is not None:
            return False
        try:
            url = f"http://{self.http_address}/state"
            async with http.get(url, allow_redirects=False, timeout=_SHORT) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


_SHORT = aiohttp.ClientTimeout(total=2)


class MasterSet:
    """Three HA masters that stand in for `Chaos.master`."""

    def __init__(self, work_dir: Path, registry: str, *flags: str) -> None:
        self.masters = [
            HaMasterProcess(
                work_dir / f"m{i}",
                "--registry",
                registry,
                "--leader-ttl",
                str(LEADER_TTL),
                *flags,
            )
            for i in range(MASTERS)
        ]

    @property
    def address(self) -> str:
        return ",".join(m.address for m in self.masters)

    async def start(self) -> None:
        for m in self.masters:
            await m.start()

    async def leader(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, m in enumerate(self.masters):
                if await m.leads(http):
                    return i
            await asyncio.sleep(0.05)
        raise AssertionError(f"no master leads after {timeout}s")

    async def state(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        i = await self.leader(http)
        return await self.masters[i].state(http)

    def violations(self) -> list[str]:
        return [v for m in self.masters for v in m.violations()]

    async def revive(self) -> int:
        """Start again every master that exited (a deposed leader exits: its supervisor
        starts it again, as systemd would). Returns how many."""
        exited = [m for m in self.masters if m.process and m.process.returncode is not None]
        for m in exited:
            await m.start()
        return len(exited)

    async def stop(self) -> None:
        for m in self.masters:
            await m.stop()


class HaChaos(Chaos):
    def __init__(self, work_dir: Path, seed: int) -> None:
        super().__init__(work_dir, seed)
        self.etcd = EtcdCluster(work_dir)
        flags = self.master.flags  # the single master's, kept for each HA master
        self.ha = MasterSet(work_dir, self.etcd.url + "/chaos", *flags)
        self.master = self.ha  # type: ignore[assignment]

    async def run(self, faults: int) -> Report:
        try:
            await self.etcd.start()
            self.http = aiohttp.ClientSession()
            return await super().run(faults)
        finally:
            await self.http.close()
            self.etcd.stop()

    async def inject(self) -> None:
        kind = self.rng.choice(
            ["leader kill", "leader kill", "leader stop", "etcd member", "agent", "framework"]
        )
        # A master that lost its lease by itself (an etcd member's death under load)
        # exited; like a supervisor, start it again before the next fault.
        if revived := await self.ha.revive():
            self.report.faults["restart after exit"] += revived
        if kind == "leader kill":
            await self.leader_kill()
        elif kind == "leader stop":
            await self.leader_stop()
        elif kind == "etcd member":
            await self.etcd_member()
        else:
            await super().inject_other(kind)

    async def _takeover(self, old: int, since: float) -> None:
        try:
            new = await self.ha.leader(self.http)
        except AssertionError as e:
            self.report.violations.append(f"after m{old} went: {e}")
            return
        took = time.monotonic() - since
        self.report.takeovers.append(round(took, 3))
        if new == old:
            self.report.violations.append(f"master m{old} leads again after its own kill")

    async def leader_kill(self) -> None:
        old = await self.ha.leader(self.http)
        victim = self.ha.masters[old]
        killed = time.monotonic()
        await victim.kill()
        self.report.faults["leader kill"] += 1
        also = self.rng.choice(["nothing", "nothing", "agent", "framework"])
        if also == "agent":
            self.report.faults["agent while leader down"] += 1
            i = self.rng.randrange(len(self.agents))
            await self.kill_agent(i)
            await self._takeover(old, killed)
            await self.start_agent(i)
        else:
            if also == "framework":
                await self.framework_fault(while_master_down=True)
            await self._takeover(old, killed)
        await asyncio.sleep(self.rng.uniform(0.0, 1.0))
        await victim.start()

    async def leader_stop(self) -> None:
        old = await self.ha.leader(self.http)
        victim = self.ha.masters[old]
        assert victim.process is not None
        stopped = time.monotonic()
        victim.process.send_signal(signal.SIGSTOP)
        self.report.faults["leader stop"] += 1
        try:
            await self._takeover(old, stopped)
        finally:
            victim.process.send_signal(signal.SIGCONT)
        try:
            code = await asyncio.wait_for(victim.process.wait(), 15)
        except TimeoutError:
            self.report.violations.append(f"m{old}, deposed while stopped, did not exit")
            await victim.kill()
        else:
            if code != 3:
                self.report.violations.append(f"m{old}, deposed while stopped, exited {code}")
        await victim.start()

    async def etcd_member(self) -> None:
        leader = await self.ha.leader(self.http)
        i = self.rng.randrange(len(self.etcd.procs))
        self.etcd.kill(i)
        self.report.faults["etcd member"] += 1
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        await self.etcd.restart(i)
        if await self.ha.leader(self.http) != leader:
            self.report.etcd_member_leader_changes += 1


async def run_ha_chaos(work_dir: Path, seed: int, faults: int = 6) -> Report:
    return await HaChaos(work_dir, seed).run(faults)
