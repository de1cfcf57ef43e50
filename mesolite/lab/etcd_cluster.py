"""A throwaway etcd cluster: N members on free loopback ports, its own token (for the
tests, `tests/etcd_cluster.py`, and the bench's `--registry etcd`).

    async with EtcdCluster(tmp_path, members=3) as etcd:
        etcd.endpoints            # ["127.0.0.1:p1", ...]
        etcd.kill(1)              # SIGKILL one member
        await etcd.restart(1)

Members run the Debian `etcd-server` binary (`etcd`; `.ci/run` installs it). Each
cluster has a unique `--initial-cluster-token`, so members of two test clusters can
never join each other; members are stopped with SIGKILL (a throwaway cluster needs no
clean shutdown) and their data directories are under the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from mesolite.errors import MesoliteError
from mesolite.master.etcd_client import EtcdClient, EtcdError, EtcdTls, Put


class EtcdMissing(MesoliteError):
    """No `etcd` binary on PATH (apt-get install etcd-server)."""


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if found is None:
        raise EtcdMissing("etcd is not installed (apt-get install etcd-server)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdCluster:
    def __init__(
        self,
        root: Path,
        members: int = 3,
        tls: EtcdTls | None = None,
        server: tuple[Path, Path] | None = None,
    ) -> None:
        """With `server` (a certificate and its key) and `tls` (the CA that signed the
        clients' certificates, and a client's certificate for this helper), the members
        serve clients over TLS and require a client certificate from that CA."""
        self.binary = etcd_binary()
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.token = f"mesolite-test-{uuid.uuid4().hex[:12]}"
        self.client_ports = [free_port() for _ in range(members)]
        self.peer_ports = [free_port() for _ in range(members)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * members
        self.tls = tls
        self._server = server

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        """What `mesolite master --registry` takes."""
        return "etcd://" + ",".join(self.endpoints)

    def _start(self, i: int, state: str) -> None:
        cluster = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        log = open(self.root / f"etcd-m{i}.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.procs[i] = subprocess.Popen(
            [
                self.binary,
                "--name",
                f"m{i}",
                "--data-dir",
                str(self.root / f"etcd-m{i}"),
                "--listen-client-urls",
                f"{self._scheme}://127.0.0.1:{self.client_ports[i]}",
                "--advertise-client-urls",
                f"{self._scheme}://127.0.0.1:{self.client_ports[i]}",
                *self._tls_flags(),
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.peer_ports[i]}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.peer_ports[i]}",
                "--initial-cluster",
                cluster,
                "--initial-cluster-token",
                self.token,
                "--initial-cluster-state",
                state,
                "--logger",
                "zap",
                "--log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    @property
    def _scheme(self) -> str:
        return "https" if self._server else "http"

    def _tls_flags(self) -> list[str]:
        if self._server is None or self.tls is None:
            return []
        cert, key = self._server
        return [
            "--cert-file", str(cert),
            "--key-file", str(key),
            "--client-cert-auth",
            "--trusted-ca-file", str(self.tls.ca),
        ]  # fmt: skip

    async def start(self, timeout: float = 30.0) -> None:
        for i in range(len(self.procs)):
            self._start(i, "new")
        await self.wait_healthy(timeout)

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until a write through every live member's endpoint succeeds."""
        deadline = time.monotonic() + timeout
        for i, port in enumerate(self.client_ports):
            if self.procs[i] is None:
                continue
            client = EtcdClient([f"127.0.0.1:{port}"], timeout=1.0, tls=self.tls)
            try:
                while True:
                    try:
                        await client.txn([], [Put(b"/health-check", b"ok")])
                        break
                    except EtcdError:
                        if time.monotonic() > deadline:
                            raise AssertionError(
                                f"etcd member m{i} not healthy after {timeout}s: "
                                + (self.root / f"etcd-m{i}.log").read_text()[-2000:]
                            ) from None
                        await asyncio.sleep(0.1)
            finally:
                await client.close()

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.procs[i] = None

    async def restart(self, i: int, timeout: float = 30.0) -> None:
        self._start(i, "existing")
        await self.wait_healthy(timeout)

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
