"""The web UI's jobs and services tables, in headless Chromium (tests/test_ui_browser.py
has the browser fixture), fed by the master's one read model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cluster import LocalCluster
from tests.test_ui_browser import browser, until
from tests.test_workloads_cluster import SWEEP, TICKER

pytestmark = pytest.mark.slow

__all__ = ["browser"]  # the fixture, used by name

try:
    from selenium.webdriver import Chrome
    from selenium.webdriver.common.by import By
except ImportError:  # the fixture skips (or fails in CI)
    pass


def _row(driver: Chrome, table: str, key: str, name: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'#{table} tr[data-{key}="{name}"]')
    return f"{row.get_attribute('data-status')} {row.text}"


async def test_the_page_shows_jobs_and_services(browser: Chrome, tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, workloads=True) as cluster:
        await cluster.add_agent("cpus:4;mem:4096;disk:0")
        assert cluster.runner is not None
        await asyncio.to_thread(browser.get, f"{cluster.server.http_url}/")
        await until(browser, lambda d: "No jobs" in d.find_element(By.ID, "jobs").text, "no jobs")
        cluster.runner.submit(SWEEP.read_text(), "sweep.toml", None)
        cluster.runner.submit(TICKER.read_text(), "ticker.toml", None)
        await until(
            browser,
            lambda d: (
                _row(d, "jobs", "job", "sweep").startswith("completed")
                and "20/20" in _row(d, "jobs", "job", "sweep")
            ),
            "the sweep completed, 20 of 20",
        )
        await until(
            browser,
            lambda d: "3/3" in _row(d, "services", "service", "ticker"),
            "the ticker's 3 instances",
        )
        row = await asyncio.to_thread(_row, browser, "services", "service", "ticker")
        assert row.startswith("active") and "restart always" in row, row
