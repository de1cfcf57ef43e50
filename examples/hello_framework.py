"""Run three `echo` tasks on a mesolite cluster and exit when they have finished.

Usage: python examples/hello_framework.py [MASTER_HOST:PORT] [--tls-dir DIR]
"""

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
