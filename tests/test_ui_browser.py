"""The web UI in a real browser: headless Chromium, driven by selenium and
chromedriver, on a real cluster (master, agent with its sandbox server, framework).

Without chromium, chromedriver or selenium the test is skipped, except in CI
(`CI=true`), where it fails: CI installs them (`.ci/run`) and must never skip
it silently. Selenium blocks, the cluster runs on this test's event loop: every
browser call goes through `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from tests.cluster import LocalCluster, fast
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition

try:
    from selenium import webdriver
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver import Chrome
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # reported by the `browser` fixture
    HAVE_SELENIUM = False
else:
    HAVE_SELENIUM = True

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason}; CI must run the browser test (CI=true)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chrome]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        _unavailable("needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    if not HAVE_SELENIUM:
        _unavailable("needs selenium (pip install -e '.[dev]')")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        session.set_page_load_timeout(20)
        yield session
    finally:
        session.quit()


async def until(driver: Chrome, condition: Callable[[Chrome], T], what: str) -> T:
    """Wait (in a thread) until `condition(driver)` is truthy; fail readably after 15 s."""
    wait = WebDriverWait(
        driver,
        15,
        poll_frequency=0.1,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    try:
        return await asyncio.to_thread(wait.until, condition)
    except TimeoutException:
        page = await asyncio.to_thread(lambda: driver.find_element(By.TAG_NAME, "body").text)
        console = await asyncio.to_thread(driver.get_log, "browser")
        raise AssertionError(
            f"timed out waiting for {what}; the page shows:\n{page}\nits console: {console}"
        ) from None


def _text(driver: Chrome, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def _task_state(driver: Chrome, task_id: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'#tasks tr[data-task-id="{task_id}"]')
    return row.find_element(By.CSS_SELECTOR, ".task-state").text


def _click(driver: Chrome, selector: str) -> bool:
    driver.find_element(By.CSS_SELECTOR, selector).click()
    return True


async def test_page_follows_the_cluster_live_and_shows_task_output(
    browser: Chrome, tmp_path: Path
) -> None:
    async with LocalCluster(tmp_path) as cluster:
        await cluster.add_agent("cpus:2;mem:1024", name="ui-agent")
        fw = RecordingFramework("ui-framework")
        async with running(fw, cluster.address):
            await asyncio.to_thread(browser.get, f"http://{cluster.server.http_address}/")
            await until(
                browser,
                lambda d: (
                    "ui-agent" in _text(d, "agents") and "ui-framework" in _text(d, "frameworks")
                ),
                "the agent and the framework on the page",
            )
            await asyncio.to_thread(browser.execute_script, "window.loadedOnce = true;")

            offer = await fw.next_offer()
            command = "echo hello from ui-task; echo a warning >&2; sleep 60"
            await fw.launch(offer, [TaskSpec("ui-task", command, Resources(cpus=1, mem=256))])
            await fw.wait_state("ui-task", TaskState.RUNNING)
            await until(
                browser, lambda d: _task_state(d, "ui-task") == "RUNNING", "ui-task RUNNING"
            )
            reloaded = await asyncio.to_thread(
                browser.execute_script, "return window.loadedOnce !== true;"
            )
            assert not reloaded, "the page reloaded: updates must come by server-sent events"
            # The charts follow too: a line for the framework, two for the cluster.
            await until(
                browser,
                lambda d: d.find_elements(
                    By.CSS_SELECTOR, '#share-chart path.series[data-series="ui-framework"]'
                ),
                "the framework's line in the dominant share chart",
            )
            await until(
                browser,
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cluster-chart path.series")) == 2,
                "the CPU and memory lines in the cluster chart",
            )

            stdout = '#tasks tr[data-task-id="ui-task"] button[data-file="stdout"]'
            await until(browser, lambda d: _click(d, stdout), "a click on ui-task's stdout")
            await until(
                browser,
                lambda d: "hello from ui-task" in _text(d, "log-output"),
                "ui-task's stdout in the output viewer",
            )
            stderr_tab = '#log-viewer .tab[data-file="stderr"]'
            await until(browser, lambda d: _click(d, stderr_tab), "a click on the stderr tab")
            await until(
                browser, lambda d: "a warning" in _text(d, "log-output"), "ui-task's stderr"
            )
            # Agents by host name and id; frameworks that ended, and why.
            agent_id = cluster.agents[0].agent_id
            row = '#tasks tr[data-task-id="ui-task"]'
            assert agent_id and agent_id in browser.find_element(By.CSS_SELECTOR, row).text
            done = RecordingFramework("ui-done")
            done_run = asyncio.create_task(done.run(cluster.address))
            try:
                await wait_for_condition(lambda: done.connected, what="ui-done to subscribe")
                assert done.framework_id is not None
                cluster.master.operator_teardown(done.framework_id, "admin")
                await until(
                    browser,
                    lambda d: (
                        "torn down by operator 'admin'" in _text(d, "completed")
                        and "ui-done" in _text(d, "completed")
                    ),
                    "the torn-down framework among the completed ones",
                )
            finally:
                await done.stop()
                await asyncio.gather(done_run, return_exceptions=True)  # it was torn down
            errors = await asyncio.to_thread(browser.get_log, "browser")
            severe: list[dict[str, Any]] = [e for e in errors if e.get("level") == "SEVERE"]
            assert severe == [], severe


GRACE = 2.0
GOLD = """
[roles.gold]
guarantee = { cpus = 1 }
min_share_timeout = 0.5
"""


def _live_state(driver: Chrome, task_id: str) -> str:
    """The state badge of a live task (the cell may hold a preempting badge too)."""
    row = driver.find_element(By.CSS_SELECTOR, f'#tasks tr[data-task-id="{task_id}"]')
    return row.find_elements(By.CSS_SELECTOR, ".task-state .badge")[0].text


def _ended(driver: Chrome, task_id: str) -> str | None:
    """The row of an ended task among the recently ended ones, if it is there."""
    rows = driver.find_elements(By.CSS_SELECTOR, f'#ended tr[data-task-id="{task_id}"]')
    return rows[0].text if rows else None


def _preempting_badge(driver: Chrome, task_id: str) -> tuple[str, str] | None:
    row = driver.find_element(By.CSS_SELECTOR, f'#tasks tr[data-task-id="{task_id}"]')
    for badge in row.find_elements(By.CSS_SELECTOR, ".task-state .badge"):
        if badge.text.startswith("preempted"):
            return badge.text, badge.get_attribute("title") or ""
    return None


async def test_a_task_being_preempted_shows_its_badge_until_it_is_killed(
    browser: Chrome, tmp_path: Path
) -> None:
    roles = tmp_path / "roles.toml"
    roles.write_text(GOLD)
    config = fast(roles_file=roles, preemption_grace=GRACE)
    async with LocalCluster(tmp_path, config) as cluster:
        await cluster.add_agent("cpus:2;mem:512", name="ui-agent")
        first = RecordingFramework("ui-first")
        async with running(first, cluster.address):
            await asyncio.to_thread(browser.get, f"http://{cluster.server.http_address}/")
            offer = await first.next_offer()
            ids = ("t1", "t2")
            specs = [TaskSpec(i, "sleep 60", Resources(cpus=1, mem=64)) for i in ids]
            await first.launch(offer, specs)
            for i in ids:
                await first.wait_state(i, TaskState.RUNNING)
            await until(
                browser,
                lambda d: all(_task_state(d, i) == "RUNNING" for i in ids),
                "both tasks RUNNING",
            )
            assert all(_preempting_badge(browser, i) is None for i in ids)
            # A role guaranteed 1 CPU arrives: after its min_share_timeout one task is
            # told, and the page marks it for the grace period, with whom it is for.
            async with running(RecordingFramework("ui-gold", role="gold"), cluster.address):
                marked = await until(
                    browser,
                    lambda d: [(i, b) for i in ids if (b := _preempting_badge(d, i))],
                    "a preempting badge",
                )
                [(victim, (text, title))] = marked  # one task only: the other is first's share
                assert text.startswith("preempted in ") and text.endswith(" s"), text
                assert 0 < int(text.split()[2]) <= GRACE
                assert title == "for role gold (min-share)"
                assert _live_state(browser, victim) == "RUNNING"  # told, not yet killed
                # Killed after the grace period: it leaves the live tasks, badge and all,
                # for the ended ones, killed and saying why.
                await first.wait_state(victim, TaskState.KILLED)
                ended = await until(browser, lambda d: _ended(d, victim), "the victim ended")
                assert ended is not None
                assert "KILLED" in ended and "REASON_CONTAINER_PREEMPTED" in ended, ended
                assert not browser.find_elements(
                    By.CSS_SELECTOR, f'#tasks tr[data-task-id="{victim}"]'
                )
                [other] = set(ids) - {victim}
                assert _live_state(browser, other) == "RUNNING"
                assert _preempting_badge(browser, other) is None
            errors = await asyncio.to_thread(browser.get_log, "browser")
            severe: list[dict[str, Any]] = [e for e in errors if e.get("level") == "SEVERE"]
            assert severe == [], severe
