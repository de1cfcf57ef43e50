"""A throwaway etcd cluster for tests (`mesolite/lab/etcd_cluster.py`): N members on free
loopback ports, its own cluster token, stopped with SIGKILL.

    async with EtcdCluster(tmp_path, members=3) as etcd:
        etcd.endpoints            # ["127.0.0.1:p1", ...]
        etcd.kill(1)              # SIGKILL one member
        await etcd.restart(1)

A test that needs etcd where it is not installed is skipped, except under CI (`.ci/run`
installs etcd-server), where it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mesolite.lab import etcd_cluster
from mesolite.lab.etcd_cluster import EtcdMissing, free_port
from mesolite.master.etcd_client import EtcdTls

__all__ = ["EtcdCluster", "free_port"]


class EtcdCluster(etcd_cluster.EtcdCluster):
    def __init__(
        self,
        root: Path,
        members: int = 3,
        tls: EtcdTls | None = None,
        server: tuple[Path, Path] | None = None,
    ) -> None:
        try:
            super().__init__(root, members, tls, server)
        except EtcdMissing as e:
            if os.environ.get("CI"):
                pytest.fail(f"{e}: .ci/run installs etcd-server")
            pytest.skip(str(e))
