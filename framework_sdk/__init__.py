"""The mesolite framework SDK: what a framework author imports.

A framework subclasses `Framework`, overrides the callbacks for the events it cares
about (`on_offers`, `on_update`, ...) and awaits `run("host:port")`. From the callbacks
it answers offers with `launch` or `decline` and manages its tasks with `kill`,
`reconcile`, `suppress`, `revive` and `teardown`. The SDK subscribes, keeps the stream
alive (reconnecting and failing over with the framework id, then reconciling), shows each
status update once and acknowledges it after `on_update` returns.

This framework (`examples/hello_framework.py`) runs three `echo` tasks and exits::

    import argparse
    import asyncio

    from mesolite.framework_sdk import (
        Framework,
        Offer,
        Resources,
        TaskSpec,
        TaskStatus,
        TlsConfig,
        new_task_id,
    )
    from mesolite.logs import configure

    TASK = Resources(cpus=0.1, mem=32)


    class Hello(Framework):
        def __init__(self, count: int, tls: TlsConfig | None = None) -> None:
            super().__init__(name="hello", tls=tls)  # tls: None on a cluster without TLS
            self.waiting = count  # tasks not launched yet
            self.running: set[str] = set()

        async def on_offers(self, offers: list[Offer]) -> None:
            for offer in offers:
                tasks: list[TaskSpec] = []
                free = offer.resources
                while self.waiting and free.contains(TASK):
                    command = f"echo hello from task {self.waiting}"
                    tasks.append(TaskSpec(new_task_id("hello"), command, TASK))
                    free, self.waiting = free - TASK, self.waiting - 1
                if tasks:
                    await self.launch(offer, tasks)
                    self.running.update(t.task_id for t in tasks)
                else:
                    await self.decline(offer)

        async def on_update(self, status: TaskStatus) -> None:
            print(status.task_id, status.state.value, status.exit_code)
            if status.state.is_terminal:
                self.running.discard(status.task_id)
                if not self.waiting and not self.running:
                    await self.teardown()  # all done: run() returns


    if __name__ == "__main__":
        configure()
        parser = argparse.ArgumentParser()
        parser.add_argument("master", nargs="?", default="127.0.0.1:5050")
        parser.add_argument("--tls-dir", help="this framework's bundle (mesolite certs init)")
        args = parser.parse_args()
        tls = TlsConfig.from_dir(args.tls_dir) if args.tls_dir else None
        asyncio.run(Hello(count=3, tls=tls).run(args.master))

`Framework(..., connection=ConnectionConfig(...))` tunes how the subscription is kept
alive (reconnection delays, timeouts); the defaults suit a real cluster.

After every subscription with a framework id (a reconnection, or a new process started
with its `id_file`), the framework hears of every task the master knows for it through
`on_update` before it is handed any offer. `Framework(..., id_file=PATH)` keeps the id
across restarts, with a failover timeout of a week unless given (0 is refused with an
id file); a framework the master has forgotten gets `FrameworkGone` and its id file is
moved aside. docs/framework-guide.md tells the whole story; docs/reference/
framework-sdk.md documents every public name.

Everything the SDK raises derives from `MesoliteError` (mesolite's one error root);
`FrameworkRejected` means the master refused the subscription and retrying will not
help (UNAUTHENTICATED included; `FrameworkGone` when it no longer knows the framework
id); `InvalidCall` (also a `ValueError`) a call the SDK could tell was wrong.

On a cluster with TLS, a framework passes `tls=TlsConfig.from_dir(DIR)`, DIR being its
bundle from `mesolite certs init` (`--tls-dir` above); its principal is its certificate's
CN. Without a certificate it passes the CA alone and `token=` (a bearer token), and runs
against the master's token port.
"""

from mesolite.framework_sdk._config import DEFAULT_FAILOVER_TIMEOUT, ConnectionConfig
from mesolite.framework_sdk._errors import (
    FrameworkGone,
    FrameworkRejected,
    InvalidCall,
    MesoliteError,
    NotConnected,
    RpcError,
)
from mesolite.framework_sdk._framework import Framework
from mesolite.framework_sdk._ids import new_task_id
from mesolite.model import Offer, StatusSource, TaskSpec, TaskState, TaskStatus
from mesolite.resources import Resources
from mesolite.tls import TlsConfig

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT",
    "ConnectionConfig",
    "Framework",
    "FrameworkGone",
    "FrameworkRejected",
    "InvalidCall",
    "MesoliteError",
    "NotConnected",
    "Offer",
    "Resources",
    "RpcError",
    "StatusSource",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "TlsConfig",
    "new_task_id",
]
