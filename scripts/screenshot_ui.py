"""Take `docs/ui.png`: the master's web UI on a small, busy, real cluster.

Runs in this process a master, three agents (each with its sandbox server) and
two batch frameworks like `mesolite demo`'s: a CPU-heavy and, a few seconds
later, a memory-heavy one, in roles `batch/cpu` and `batch/mem`, whose short
tasks print a few lines. After `--seconds` (so the charts have some history) it
opens the page in headless Chromium and saves a screenshot of the window.

    .venv/bin/python scripts/screenshot_ui.py [--out docs/ui.png] [--seconds 14]

Needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)
and selenium (in the dev extras).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from examples.batch import BatchFramework, BatchSpec
from mesolite.agent import Agent, AgentConfig
from mesolite.agent.sandbox_http import SandboxServer
from mesolite.logs import configure
from mesolite.master.master import MasterConfig
from mesolite.master.server import MasterServer
from mesolite.resources import Resources

ROOT = Path(__file__).resolve().parent.parent
AGENT_RESOURCES = "cpus:4;mem:8192"


def _command(label: str, seconds: int) -> str:
    return (
        f'echo "{label} task $MESOLITE_TASK_ID starting"; i=1; '
        f'while [ $i -le {seconds} ]; do echo "step $i of {seconds}"; sleep 1; i=$((i+1)); done; '
        "echo done"
    )


FRAMEWORKS = [
    BatchSpec(name="cpu-heavy", role="batch/cpu", cpus=2, mem=512, tasks=0,
              command=_command("cpu-heavy", 3)),
    BatchSpec(name="memory-heavy", role="batch/mem", cpus=0.5, mem=4096, tasks=0,
              command=_command("memory-heavy", 4)),
]  # fmt: skip


@contextlib.asynccontextmanager
async def small_cluster(work_dir: Path, agents: int) -> AsyncIterator[MasterServer]:
    """A master and `agents` agents, each with its sandbox server, all in this process."""
    config = MasterConfig(allocation_interval=0.5, agent_heartbeat_interval=1.0)
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(MasterServer(config, "127.0.0.1", 0, 0))
        for i in range(agents):
            name = f"agent{i + 1}"
            sandboxes = await stack.enter_async_context(SandboxServer(work_dir / name))
            agent = Agent(
                AgentConfig(
                    server.grpc_address,
                    Resources.parse(AGENT_RESOURCES),
                    work_dir / name,
                    hostname=name,
                    address=sandboxes.address,
                    kill_grace_period=1.0,
                )
            )
            await stack.enter_async_context(agent)
            await asyncio.wait_for(agent.wait_registered(), 30)
        yield server


@contextlib.asynccontextmanager
async def frameworks_running(master: str, stagger: float) -> AsyncIterator[None]:
    running: list[tuple[BatchFramework, asyncio.Task[None]]] = []
    try:
        for i, spec in enumerate(FRAMEWORKS):
            if i:
                await asyncio.sleep(stagger)  # a late second job makes the shares move
            framework = BatchFramework(spec, out=lambda line: None)
            running.append((framework, asyncio.create_task(framework.run(master))))
        yield
    finally:
        for framework, task in running:
            await framework.stop()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, 10)


def chromium(profile: Path, width: int, height: int) -> webdriver.Chrome:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        raise SystemExit(
            "needs chromium and chromedriver: apt-get install chromium chromium-driver"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    # --window-size includes the (invisible) browser frame: make the page itself that size.
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    browser.set_window_size(2 * width - inner[0], 2 * height - inner[1])
    return browser


def _page_ready(driver: webdriver.Chrome, agents: int) -> bool:
    rows = driver.find_elements(By.CSS_SELECTOR, "#agents tr[data-agent-id]")
    lines = driver.find_elements(By.CSS_SELECTOR, "#share-chart path.series")
    return len(rows) == agents and len(lines) == len(FRAMEWORKS)


async def take(out: Path, seconds: float, agents: int, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mesolite-screenshot-") as tmp:
        work_dir = Path(tmp)
        async with small_cluster(work_dir, agents) as server:
            url = f"http://{server.http_address}/"
            driver = await asyncio.to_thread(chromium, work_dir / "chromium", width, height)
            try:
                # The page keeps the charts' history: open it before the jobs start.
                await asyncio.to_thread(driver.get, url)
                started = time.monotonic()
                async with frameworks_running(server.grpc_address, stagger=seconds / 4):
                    wait = WebDriverWait(driver, 30)
                    await asyncio.to_thread(wait.until, lambda d: _page_ready(d, agents))
                    await asyncio.sleep(max(seconds - (time.monotonic() - started), 0))
                    out.parent.mkdir(parents=True, exist_ok=True)
                    if not await asyncio.to_thread(driver.save_screenshot, str(out)):
                        raise SystemExit(f"could not write {out}")
            finally:
                await asyncio.to_thread(driver.quit)
    print(f"wrote {out} ({seconds:g}s of history)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui.png")
    parser.add_argument("--seconds", type=float, default=14.0, help="history before the shot")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    configure(level="warning")
    asyncio.run(take(args.out, args.seconds, args.agents, args.width, args.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
