"""The master's registry in etcd: what `master/registry.py` keeps in SQLite, for HA masters.

The same interface (`RegistryStore`, `master/effects.py`), so the core cannot tell them
apart. Keys under `<prefix>/registry/`, each value JSON:

    frameworks/<framework id>            a FrameworkEntry
    agents/<agent id>                    an AgentEntry, its state and when it changed
    tasks/<framework id>/<task id>       the task and the agent it was placed on
    version                              the registry's schema version

(ids percent-encoded, so no id can reach into another's keys).

The leader holds a copy in memory: reads are answered from it (the whole registry is
read once, `load()`, when this master takes over, at one revision). Changes update the
copy at once and are kept; the changes of one turn of the event loop are written
together, in order, as guarded transactions (`Fence`): each holds only if the leader
key is still the one this master created, on its lease. A deposed leader can therefore
never write: etcd refuses the transaction, the store calls `on_fenced` and refuses every
later change. A turn's changes are split over several transactions only past etcd's
limits (128 operations, about 1 MiB) or where two changes touch one key (etcd refuses a
key twice in one transaction); they are written one after another, never two at once.

`durable()` returns once every change made before the call is written: stream writers
await it before sending anything (`master/servicers.py`), so SUBSCRIBED, REGISTERED, a
launch or a forwarded end never leaves before what it acknowledges is in etcd.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import structlog

from mesolite.master.errors import RegistryFenced
from mesolite.master.etcd_client import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Delete,
    EtcdClient,
    EtcdError,
    Guard,
    Op,
    Put,
)
from mesolite.master.registry import AgentEntry, FrameworkEntry, RegistryError, TaskEntry
from mesolite.model import TaskSpec
from mesolite.resources import Resources

log = structlog.get_logger(__name__)

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Fence:
    """The leader key as this master created it: writes hold only while it stands."""

    leader_key: bytes
    create_revision: int
    lease: int

    def guards(self) -> list[Guard]:
        return [
            Guard.created(self.leader_key, self.create_revision),
            Guard.leased(self.leader_key, self.lease),
        ]


@dataclass(slots=True)
class _Agent:
    entry: AgentEntry
    changed_at: float


def _seg(identifier: str) -> str:
    return quote(identifier, safe="")


@dataclass(slots=True)
class _Batch:
    """One transaction being filled: at most one operation per key."""

    ops: dict[bytes, Op] = field(default_factory=dict)
    prefixes: list[bytes] = field(default_factory=list)
    size: int = 0

    def fits(self, op: Op) -> bool:
        if any(op.key.startswith(p) for p in self.prefixes):
            return False
        if isinstance(op, Delete) and op.prefix and any(k.startswith(op.key) for k in self.ops):
            return False
        if op.key not in self.ops and len(self.ops) >= MAX_TXN_OPS:
            return False
        return not self.ops or self.size + op.size <= MAX_TXN_BYTES

    def fits_all(self, ops: Sequence[Op]) -> bool:
        trial = _Batch(dict(self.ops), list(self.prefixes), self.size)
        for op in ops:
            if not trial.fits(op):
                return False
            trial.add(op)
        return True

    def add(self, op: Op) -> None:
        self.ops[op.key] = op  # a later change to a key replaces the earlier one
        self.size += op.size
        if isinstance(op, Delete) and op.prefix:
            self.prefixes.append(op.key)


def split(changes: Sequence[Sequence[Op]]) -> list[list[Op]]:
    """The changes' operations, in order, as transactions within etcd's limits; a
    change's operations stay in one transaction unless that change alone exceeds them."""
    batches: list[_Batch] = [_Batch()]
    for change in changes:
        if batches[-1].ops and not batches[-1].fits_all(change):
            batches.append(_Batch())
        for op in change:
            if not batches[-1].fits(op):
                batches.append(_Batch())
            batches[-1].add(op)
    return [list(b.ops.values()) for b in batches if b.ops]


class EtcdRegistry:
    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        fence: Fence | None,
        on_fenced: Callable[[str], None] = lambda reason: None,
        write_timeout: float = 5.0,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """`fence`: the leadership every write is guarded on (None only in unit tests of
        the layout: unguarded). `on_fenced` is called once if a write is refused."""
        self._client = client
        self._root = prefix.rstrip("/") + "/registry/"
        self._fence = fence
        self._on_fenced = on_fenced
        self._leading = leading  # asked before every write (the election's is_leading)
        self._write_timeout = write_timeout
        self._frameworks: dict[str, FrameworkEntry] = {}
        self._agents: dict[str, _Agent] = {}
        self._tasks: dict[tuple[str, str], TaskEntry] = {}
        self._pending: list[list[Op]] = []  # changes not written yet, each its operations
        self._changes = 0  # changes made so far
        self._written = 0  # of which written to etcd
        self._waiters: list[asyncio.Event] = []  # durable() calls waiting on the writer
        self._writer: asyncio.Task[None] | None = None
        self.failure: str | None = None  # why no write can happen any more
        self.commits = 0
        self.revision = 0  # etcd's revision after our newest write
        self.write_observer: Callable[[float], None] = lambda seconds: None
        self._version_written = False

    def _key(self, *parts: str) -> bytes:
        return (self._root + "/".join(parts)).encode()

    # Loading -------------------------------------------------------------------

    async def load(self) -> None:
        """Read the whole registry (at one revision) into memory."""
        kvs, self.revision = await self._client.get_prefix(self._root.encode())
        for kv in kvs:
            name = kv.key.decode()[len(self._root) :]
            value: dict[str, Any] = json.loads(kv.value)
            kind, _, rest = name.partition("/")
            if kind == "version":
                version = int(value["version"])
                if version > SCHEMA_VERSION:
                    raise RegistryError(
                        f"the etcd registry under {self._root} has schema version {version}, "
                        f"newer than this master's {SCHEMA_VERSION}: run the newer master"
                    )
                self._version_written = True
            elif kind == "frameworks":
                self._frameworks[unquote(rest)] = FrameworkEntry(**value)
            elif kind == "agents":
                entry = AgentEntry(
                    value["agent_id"],
                    value["hostname"],
                    Resources(value["total"]),
                    value["removed"],
                    value["principal"],
                )
                self._agents[entry.agent_id] = _Agent(entry, value["changed_at"])
            elif kind == "tasks":
                fid, _, tid = rest.partition("/")
                spec = TaskSpec(
                    unquote(tid),
                    value["command"],
                    Resources(value["resources"]),
                    value["name"],
                    value["agent_id"],
                )
                self._tasks[(unquote(fid), spec.task_id)] = TaskEntry(
                    unquote(fid), value["agent_id"], spec
                )

    # Writing -------------------------------------------------------------------

    def _change(self, *ops: Op) -> None:
        self._changes += 1
        if self.failure is not None:
            # Deposed: never written, and `durable()` says so to whatever would have
            # acknowledged it. (The core may still tidy up as it closes its streams.)
            return
        self._pending.append(list(ops))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        """Write what is pending, one transaction after another, until nothing is."""
        await asyncio.sleep(0)  # the rest of this turn's changes join the batch
        while self._pending and self.failure is None:
            changes, self._pending = self._pending, []
            upto = self._changes
            if not self._version_written:
                version = Put(self._key("version"), json.dumps({"version": 1}).encode())
                changes.insert(0, [version])
            try:
                for txn in split(changes):
                    await self._commit(txn)
            except (EtcdError, RegistryFenced) as e:
                self._fail(str(e))
                break
            self._version_written = True
            self._written = upto
            self._wake()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()

    async def _commit(self, ops: list[Op]) -> None:
        if not self._leading():
            # The term may be over on this master's clock before etcd lets the lease go:
            # the guard alone would still let this write through.
            raise RegistryFenced("this master's term is over: no more registry writes")
        guards = self._fence.guards() if self._fence else []
        started = time.perf_counter()
        ok, self.revision, _ = await self._client.txn(guards, ops, timeout=self._write_timeout)
        self.write_observer(time.perf_counter() - started)
        if not ok:
            raise RegistryFenced("etcd refused a guarded write: this master no longer leads")
        self.commits += 1

    def fence_off(self, reason: str) -> None:
        """The term is over (the election says so): write nothing more, from now on."""
        self._fail(reason)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.error("registry write failed; this master must stop leading", reason=reason)
            self._on_fenced(reason)

    async def durable(self) -> None:
        """Return once every change made before this call is in etcd; raise
        `RegistryFenced` if it never will be."""
        target = self._changes
        while self._written < target:
            if self.failure is not None:
                raise RegistryFenced(self.failure)
            waiter = asyncio.Event()
            self._waiters.append(waiter)
            await waiter.wait()

    def flush(self) -> None:
        """Nothing to do at once: the writer runs on the loop (see `durable`)."""

    def defer_commits(self, schedule: Callable[[Callable[[], None]], object]) -> None:
        """Always deferred: changes are written by a task on the running loop."""

    def close(self) -> None:
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()

    # Frameworks ----------------------------------------------------------------

    def add_framework(self, entry: FrameworkEntry) -> None:
        self._frameworks[entry.framework_id] = entry
        self._change(self._framework_put(entry))

    def _framework_put(self, entry: FrameworkEntry) -> Put:
        value = {
            "framework_id": entry.framework_id,
            "name": entry.name,
            "role": entry.role,
            "failover_timeout": entry.failover_timeout,
            "registered_at": entry.registered_at,
            "removing": entry.removing,
            "principal": entry.principal,
            "user": entry.user,
        }
        return Put(self._key("frameworks", _seg(entry.framework_id)), json.dumps(value).encode())

    def mark_framework_removing(self, framework_id: str) -> None:
        entry = self._frameworks.get(framework_id)
        if entry is None:
            return
        entry = FrameworkEntry(
            entry.framework_id,
            entry.name,
            entry.role,
            entry.failover_timeout,
            entry.registered_at,
            True,
            entry.principal,
            entry.user,
        )
        self.add_framework(entry)

    def remove_framework(self, framework_id: str) -> None:
        self._frameworks.pop(framework_id, None)
        for key in [k for k in self._tasks if k[0] == framework_id]:
            del self._tasks[key]
        self._change(
            Delete(self._key("frameworks", _seg(framework_id))),
            Delete(self._key("tasks", _seg(framework_id)) + b"/", prefix=True),
        )

    def frameworks(self) -> list[FrameworkEntry]:
        return sorted(self._frameworks.values(), key=lambda f: f.registered_at)

    # Agents --------------------------------------------------------------------

    def _agent_put(self, agent: _Agent) -> Put:
        e = agent.entry
        value = {
            "agent_id": e.agent_id,
            "hostname": e.hostname,
            "total": e.total.to_dict(),
            "removed": e.removed,
            "principal": e.principal,
            "changed_at": agent.changed_at,
        }
        return Put(self._key("agents", _seg(e.agent_id)), json.dumps(value).encode())

    def admit_agent(
        self,
        agent_id: str,
        hostname: str,
        total: Resources,
        now: float,
        principal: str | None = None,
    ) -> None:
        agent = _Agent(AgentEntry(agent_id, hostname, total, False, principal), now)
        self._agents[agent_id] = agent
        self._change(self._agent_put(agent))

    def remove_agent(self, agent_id: str, now: float) -> None:
        ops: list[Op] = []
        if (agent := self._agents.get(agent_id)) is not None:
            e = agent.entry
            agent = _Agent(AgentEntry(e.agent_id, e.hostname, e.total, True, e.principal), now)
            self._agents[agent_id] = agent
            ops.append(self._agent_put(agent))
        for key, task in list(self._tasks.items()):
            if task.agent_id == agent_id:
                del self._tasks[key]
                ops.append(Delete(self._task_key(*key)))
        if ops:
            self._change(*ops)

    def forget_removed_agent(self, agent_id: str) -> None:
        agent = self._agents.get(agent_id)
        if agent is not None and agent.entry.removed:
            del self._agents[agent_id]
            self._change(Delete(self._key("agents", _seg(agent_id))))

    def agents(self) -> list[AgentEntry]:
        return [a.entry for a in sorted(self._agents.values(), key=lambda a: a.changed_at)]

    # Tasks ---------------------------------------------------------------------

    def _task_key(self, framework_id: str, task_id: str) -> bytes:
        return self._key("tasks", _seg(framework_id), _seg(task_id))

    def add_tasks(self, framework_id: str, agent_id: str, tasks: list[TaskSpec]) -> None:
        ops: list[Op] = []
        for t in tasks:
            spec = TaskSpec(t.task_id, t.command, t.resources, t.name, agent_id)
            self._tasks[(framework_id, t.task_id)] = TaskEntry(framework_id, agent_id, spec)
            value = {
                "agent_id": agent_id,
                "name": t.name,
                "command": t.command,
                "resources": t.resources.to_dict(),
            }
            ops.append(Put(self._task_key(framework_id, t.task_id), json.dumps(value).encode()))
        if ops:
            self._change(*ops)

    def remove_task(self, framework_id: str, task_id: str) -> None:
        if self._tasks.pop((framework_id, task_id), None) is not None:
            self._change(Delete(self._task_key(framework_id, task_id)))

    def tasks(self) -> list[TaskEntry]:
        return list(self._tasks.values())
