"""The master under test, in a process of its own: `python _master_process.py CONFIG_JSON`.

Run as a script with PYTHONPATH naming the source tree to measure (the bench's
`--master-source`), so one bench run can compare two versions of the master. It uses
only what every version has: `MasterConfig` (fields this version lacks are skipped and
reported), `MasterServer`, and the CLI's logging, on asyncio's event loop (or uvloop's,
with the bench's `--event-loop uvloop`, to compare; it must be importable).

Prints one JSON line, {"grpc": PORT, "http": PORT, "pid": PID, "skipped": [...]}, once
it listens; stops when its standard input closes or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any


async def _serve(settings: dict[str, Any]) -> None:
    from mesolite.master.config import MasterConfig
    from mesolite.master.server import MasterServer
    from mesolite.master.stream_limits import GrpcStreamLimitsConfig

    registry_url = settings.pop("registry", None)  # etcd://...: lead on etcd first
    fields = {f.name for f in dataclasses.fields(MasterConfig)}
    skipped = sorted(name for name in settings if name not in fields)
    kwargs = {name: value for name, value in settings.items() if name in fields}
    if "grpc_streams" in kwargs:
        kwargs["grpc_streams"] = GrpcStreamLimitsConfig(**kwargs["grpc_streams"])
    if "work_dir" in kwargs:
        kwargs["work_dir"] = Path(kwargs["work_dir"])
    ha = None
    if registry_url is None:
        server = MasterServer(MasterConfig(**kwargs), "127.0.0.1", port=0, http_port=0)
    else:  # only versions with HA masters (issue 16) take --registry etcd
        from mesolite.master.ha import HaMaster, RegistryUrl

        ha = HaMaster(RegistryUrl.parse(registry_url), host="127.0.0.1", port=0, http_port=0)
        await ha.start()
        registry = await ha.until_leading()
        server = MasterServer(
            MasterConfig(**kwargs),
            "127.0.0.1",
            port=ha.port,
            http_port=ha.http_port,
            registry=registry,
            leadership=ha.election,
            master_id=ha.master_id,
        )
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # readable at EOF: the bench is gone
    ready = {"grpc": server.port, "http": server.http_port, "pid": os.getpid()}
    print(json.dumps({**ready, "skipped": skipped}), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop(grace=0.5)
        if ha is not None:
            await ha.close()


def main() -> None:
    from mesolite import http_serving, logs

    settings = json.loads(sys.argv[1])
    logs.configure(level=settings.pop("log_level", "info"))
    http_serving.raise_descriptor_limit()
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    if settings.pop("event_loop", "asyncio") == "uvloop":  # to compare (not a dependency)
        run = importlib.import_module("uvloop").run
    run(_serve(settings))


if __name__ == "__main__":
    main()
