"""A small asyncio client for etcd's v3 API: keys, transactions, leases.

    client = EtcdClient(["127.0.0.1:2379", "127.0.0.1:22379"])
    ok, kvs = await client.txn([Guard.created(b"/m/leader", 0)], [Put(b"/m/leader", b"me", lease)])
    await client.close()

It speaks gRPC (grpc.aio) with the protos of etcd's own API, a subset generated in the
project (`protos/mesolite/etcdv3`, `scripts/gen_protos.py`); protobuf stays in this
module, callers see `Put`, `Delete`, `Guard` and `EtcdKey`. One channel reaches every
member (`ipv4:a:p,b:p,...`): gRPC's pick-first sends calls to one member and moves to
the next when it goes away; a call that fails with a transient status (the member died
under it) is retried on the next until `timeout`. Retrying is safe for what the master
writes: puts of whole values and deletes, guarded, are idempotent.

With `EtcdTls` the channel verifies the members against its CA and presents a client
certificate (etcd's `--client-cert-auth`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from mesolite.etcdv3 import kv_pb2, rpc_pb2, rpc_pb2_grpc
from mesolite.master.errors import MasterError

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# etcd's default limits (`--max-txn-ops`, `--max-request-bytes` 1.5 MiB): a transaction
# holds at most this many operations, and callers keep one under MAX_TXN_BYTES.
MAX_TXN_OPS = 128
MAX_TXN_BYTES = 1024 * 1024


class EtcdError(MasterError):
    """etcd could not be reached within the timeout, or refused a request."""


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The CA to verify etcd's members with; a client certificate and key if they ask."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None  # the name the members' certificates hold


@dataclass(frozen=True, slots=True)
class EtcdKey:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value) + 16


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes
    prefix: bool = False  # every key starting with `key`

    @property
    def size(self) -> int:
        return 2 * len(self.key) + 8


@dataclass(frozen=True, slots=True)
class Guard:
    """One comparison of a transaction: the key's create revision, or its lease, equals."""

    key: bytes
    create_revision: int | None = None
    lease: int | None = None

    @staticmethod
    def created(key: bytes, revision: int) -> Guard:
        """True if the key was created at `revision` (0: the key does not exist)."""
        return Guard(key, create_revision=revision)

    @staticmethod
    def leased(key: bytes, lease: int) -> Guard:
        return Guard(key, lease=lease)


Op = Put | Delete


def prefix_end(prefix: bytes) -> bytes:
    """The end of the range of keys starting with `prefix` (etcd's convention)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def channel_target(endpoints: Sequence[str]) -> str:
    """`ipv4:a:p,b:p`: one gRPC target over every member (names are resolved now)."""
    if not endpoints:
        raise EtcdError("no etcd endpoint given")
    addresses = []
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise EtcdError(f"an etcd endpoint is HOST:PORT, got {endpoint!r}")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            try:
                host = socket.gethostbyname(host)
            except OSError as e:
                raise EtcdError(f"cannot resolve etcd endpoint {endpoint!r}: {e}") from e
        addresses.append(f"{host}:{port}")
    return "ipv4:" + ",".join(addresses)


def _kv(kv: kv_pb2.KeyValue) -> EtcdKey:
    return EtcdKey(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


def _op(op: Op) -> rpc_pb2.RequestOp:
    if isinstance(op, Put):
        return rpc_pb2.RequestOp(
            request_put=rpc_pb2.PutRequest(key=op.key, value=op.value, lease=op.lease)
        )
    end = prefix_end(op.key) if op.prefix else b""
    return rpc_pb2.RequestOp(
        request_delete_range=rpc_pb2.DeleteRangeRequest(key=op.key, range_end=end)
    )


def _compare(guard: Guard) -> rpc_pb2.Compare:
    if guard.create_revision is not None:
        return rpc_pb2.Compare(
            result=rpc_pb2.Compare.EQUAL,
            target=rpc_pb2.Compare.CREATE,
            key=guard.key,
            create_revision=guard.create_revision,
        )
    return rpc_pb2.Compare(
        result=rpc_pb2.Compare.EQUAL,
        target=rpc_pb2.Compare.LEASE,
        key=guard.key,
        lease=guard.lease or 0,
    )


class EtcdClient:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: EtcdTls | None = None,
        timeout: float = 5.0,
        call_timeout: float = 1.0,
    ) -> None:
        """`timeout`: how long one operation may keep retrying; `call_timeout`: one try."""
        self.endpoints = tuple(endpoints)
        self._timeout = timeout
        self._call_timeout = call_timeout
        options: list[tuple[str, Any]] = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.keepalive_time_ms", 2_000),
            ("grpc.keepalive_timeout_ms", 2_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        target = channel_target(endpoints)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca.read_bytes(),
                private_key=tls.key.read_bytes() if tls.key else None,
                certificate_chain=tls.cert.read_bytes() if tls.cert else None,
            )
            name = tls.server_name or endpoints[0].rpartition(":")[0]
            options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.aio.secure_channel(target, credentials, options=options)
        self._kv = rpc_pb2_grpc.KVStub(self._channel)
        self._lease = rpc_pb2_grpc.LeaseStub(self._channel)
        self._keepalive: Any = None  # the LeaseKeepAlive stream, opened on first use

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        await self._channel.close()

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """One unary call, retried on transient errors until `timeout` has passed."""
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        while True:
            remaining = deadline - time.monotonic()
            try:
                return await method(request, timeout=max(0.05, min(self._call_timeout, remaining)))
            except grpc.aio.AioRpcError as e:
                if e.code() not in _TRANSIENT or time.monotonic() + 0.05 >= deadline:
                    raise EtcdError(f"etcd {e.code().name}: {e.details()}") from e
                await asyncio.sleep(0.05)

    # Keys ----------------------------------------------------------------------

    async def get(self, key: bytes, revision: int = 0) -> EtcdKey | None:
        """The key now, or as it was at `revision` (EtcdError once that is compacted)."""
        request = rpc_pb2.RangeRequest(key=key, revision=revision)
        response = await self._call(self._kv.Range, request)
        return _kv(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: bytes, page: int = 1000) -> tuple[list[EtcdKey], int]:
        """Every key starting with `prefix`, in key order, and the revision read at (the
        pages after the first are read at the first's revision: one consistent view)."""
        end = prefix_end(prefix)
        found: list[EtcdKey] = []
        start, revision = prefix, 0
        while True:
            request = rpc_pb2.RangeRequest(key=start, range_end=end, limit=page, revision=revision)
            response = await self._call(self._kv.Range, request)
            revision = revision or response.header.revision
            found.extend(_kv(kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                return found, revision
            start = response.kvs[-1].key + b"\0"

    async def txn(
        self,
        guards: Sequence[Guard],
        success: Sequence[Op],
        failure_get: bytes | None = None,
        timeout: float | None = None,
    ) -> tuple[bool, int, EtcdKey | None]:
        """Apply `success` if every guard holds. Returns whether it did, the revision, and
        (when it did not and `failure_get` names a key) that key as it is."""
        if len(success) > MAX_TXN_OPS:
            raise EtcdError(f"a transaction holds at most {MAX_TXN_OPS} operations")
        failure = []
        if failure_get is not None:
            failure.append(rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=failure_get)))
        request = rpc_pb2.TxnRequest(
            compare=[_compare(g) for g in guards],
            success=[_op(op) for op in success],
            failure=failure,
        )
        response = await self._call(self._kv.Txn, request, timeout)
        current = None
        if not response.succeeded and failure_get is not None and response.responses:
            kvs = response.responses[0].response_range.kvs
            current = _kv(kvs[0]) if kvs else None
        return response.succeeded, response.header.revision, current

    async def compact(self, revision: int) -> None:
        await self._call(self._kv.Compact, rpc_pb2.CompactionRequest(revision=revision))

    # Leases --------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        response = await self._call(self._lease.LeaseGrant, rpc_pb2.LeaseGrantRequest(TTL=ttl))
        if response.error:
            raise EtcdError(f"etcd refused a lease: {response.error}")
        return int(response.ID)

    async def revoke(self, lease: int) -> None:
        await self._call(self._lease.LeaseRevoke, rpc_pb2.LeaseRevokeRequest(ID=lease), 1.0)

    async def keep_alive(self, lease: int, timeout: float | None = None) -> int:
        """Renew the lease once (within `timeout`, default the call timeout); returns its
        new TTL (0 or less: it has expired)."""
        try:
            async with asyncio.timeout(timeout or self._call_timeout):
                if self._keepalive is None:
                    self._keepalive = self._lease.LeaseKeepAlive()
                await self._keepalive.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease))
                response = await self._keepalive.read()
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError) as e:
            self._drop_keepalive()
            raise EtcdError(f"etcd lease keep-alive failed: {e!r}") from e
        if response is grpc.aio.EOF:
            self._drop_keepalive()
            raise EtcdError("etcd closed the lease keep-alive stream")
        return int(response.TTL)

    def _drop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
