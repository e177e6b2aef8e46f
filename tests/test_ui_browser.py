"""`castore ui` in a real browser: Debian's chromium, driven by selenium through Debian's
chromedriver (nothing is downloaded at run time; .ci/install-chromium.sh installs both).
The tasks page and its filter, a task with an UNRESOLVED effect, a resolve refused without
the token and recorded with it, and an alert appearing on the live page and clearing.

The same tests take the screenshots of docs/howto/ui.md: with CASTORE_UI_SCREENSHOTS=DIR
they are saved in DIR (docs/howto/img), else in the test's own temporary directory. Skipped
when chromium or chromedriver is missing, except under CI, where that fails.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import tree_snapshot
from test_watch import PLAN, make_unresolved
from uiserver import UiServer, running

import castore

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as exc:  # the dev extra's
    MISSING_SELENIUM: str | None = f"selenium is not installed ({exc})"
else:
    MISSING_SELENIUM = None

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 20.0
SIZE = (1100, 760)  # the screenshots' size: readable, and small as PNGs go


def _missing() -> str | None:
    """What keeps the browser tests from running here, or None."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "chromium and chromium-driver are not installed (.ci/install-chromium.sh)"
    if importlib.util.find_spec("starlette") is None:
        return "castore's ui extra is not installed"
    return MISSING_SELENIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module's tests (starting one takes seconds)."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the browser tests must run in CI (CI is set), but {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={SIZE[0]},{SIZE[1]}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> castore.Store:
    """A payments store: orders done and running, two UNRESOLVED charges (order-3, order-5)."""
    store = castore.Store.init(tmp_path_factory.mktemp("shop") / "store")
    for number in (1, 2, 4, 6):
        with store.start(f"order-{number}", PLAN) as run:
            run.commit_step("price", 1000 * number)
            if number % 2 == 0:
                run.perform("charge", castore.Service("payments"), lambda key: f"ch_{key[-6:]}")
                run.commit_step("email", "sent")
    make_unresolved(store, "order-3")
    make_unresolved(store, "order-5")
    return store


@pytest.fixture(scope="module")
def ui(shop: castore.Store) -> Iterator[UiServer]:
    with running(shop.root, "--allow-resolve") as server:
        yield server


@pytest.fixture
def shot(tmp_path: Path) -> Callable[[Any, str], Path]:
    """Save the browser's page as NAME.png (docs/howto/img with CASTORE_UI_SCREENSHOTS)."""
    where = Path(os.environ.get("CASTORE_UI_SCREENSHOTS") or tmp_path)

    def save(driver: Any, name: str) -> Path:
        path = where / f"{name}.png"
        assert driver.save_screenshot(str(path))
        assert path.stat().st_size > 5000  # something was drawn
        return path

    return save


def wait_until(driver: Any, condition: Callable[[Any], object], what: str) -> Any:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition, what)


def text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_the_tasks_page_lists_every_task_and_filters_by_state(
    browser: Any, ui: UiServer, shot: Callable[[Any, str], Path]
) -> None:
    """Counts at the top; the UNRESOLVED count, clicked, leaves the two UNRESOLVED tasks."""
    browser.delete_all_cookies()
    browser.get(ui.url)
    assert "6 all" == text(browser, "#count-all")
    assert "2 UNRESOLVED" == text(browser, "#count-unresolved")
    assert ("3 done", "1 running") == (
        text(browser, "#count-done"),
        text(browser, "#count-running"),
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
    assert 6 == len(rows)
    shot(browser, "ui-tasks")
    browser.find_element(By.CSS_SELECTOR, "#count-unresolved").click()
    wait_until(browser, lambda d: "state=unresolved" in d.current_url, "the filtered page")
    shown = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#tasks tbody a")]
    assert ["order-3", "order-5"] == shown


def test_a_task_with_an_unresolved_effect_shows_its_key_and_commands(
    browser: Any, ui: UiServer, shop: castore.Store, shot: Callable[[Any, str], Path]
) -> None:
    """From the list to order-3: its effect UNRESOLVED with its key, the timeline, the
    commands to run, and a form for each outcome."""
    browser.get(ui.url + "?state=unresolved")
    browser.find_element(By.LINK_TEXT, "order-3").click()
    wait_until(browser, lambda d: "/task?id=order-3" in d.current_url, "order-3's page")
    key = shop.status("order-3").effects[0].key
    effects = text(browser, "#effects")
    assert "UNRESOLVED" in effects
    assert str(key) in effects
    assert "SUBMITTED -> UNRESOLVED" in text(browser, "#timeline")
    assert "resolve order-3 charge --confirmed RECEIPT" in text(browser, "pre.command")
    assert 2 == len(browser.find_elements(By.CSS_SELECTOR, "#resolve-charge form"))
    shot(browser, "ui-task")


def test_resolve_without_the_token_is_refused(
    browser: Any, ui: UiServer, shop: castore.Store
) -> None:
    """A page opened without the printed URL's token: the form is refused, nothing written."""
    browser.delete_all_cookies()
    before = tree_snapshot(shop.root)
    browser.get(ui.url + "task?id=order-3")
    form = browser.find_element(By.CSS_SELECTOR, "#resolve-charge form")
    form.find_element(By.NAME, "receipt").send_keys("ch_guess")
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait_until(browser, lambda d: d.find_elements(By.ID, "outcome"), "the refusal")
    assert "not opened with the token castore ui printed" in text(browser, "#outcome")
    assert before == tree_snapshot(shop.root)
    assert "UNRESOLVED" == shop.status("order-3").effects[0].state


def test_resolve_with_the_token_runs_castore_resolve(
    browser: Any, ui: UiServer, shop: castore.Store, shot: Callable[[Any, str], Path]
) -> None:
    """The printed URL sets the cookie and drops the token from the address; a form without
    a reason gets the CLI's refusal; one with a receipt records the resolve, who included."""
    browser.delete_all_cookies()
    browser.get(f"{ui.url}?token={ui.token}")
    wait_until(browser, lambda d: "token" not in d.current_url, "the token to leave the URL")
    browser.get(ui.url + "task?id=order-5")
    not_done = browser.find_elements(By.CSS_SELECTOR, "#resolve-charge form")[1]
    not_done.find_element(By.CSS_SELECTOR, "button").click()
    wait_until(browser, lambda d: d.find_elements(By.ID, "outcome"), "the refusal")
    assert (
        "castore: error: a reason is required: say who decided and why, for the audit trail"
        == text(browser, "#outcome")
    )
    browser.get(ui.url + "task?id=order-5")
    confirmed = browser.find_elements(By.CSS_SELECTOR, "#resolve-charge form")[0]
    confirmed.find_element(By.NAME, "receipt").send_keys("ch_5")
    who = confirmed.find_element(By.NAME, "who")
    who.clear()
    who.send_keys("ana@ops")
    confirmed.find_element(By.CSS_SELECTOR, "button").click()
    wait_until(browser, lambda d: d.find_elements(By.ID, "outcome"), "the outcome")
    assert text(browser, "#outcome").startswith(
        "recorded: effect charge of task order-5 is CONFIRMED (receipt ch_5)"
    )
    shot(browser, "ui-resolved")
    last = shop.history("order-5")[0][1].transition
    assert ("resolve", "ch_5", "ana@ops") == (last.kind.value, last.receipt, last.who)


def test_a_live_alert_appears_and_clears(
    browser: Any, ui: UiServer, shop: castore.Store, shot: Callable[[Any, str], Path]
) -> None:
    """The alerts page, left open: a worker leaves order-7 UNRESOLVED and its alert appears
    without a reload; `castore resolve` from a shell, and it leaves the list."""
    browser.get(ui.url + "alerts")
    wait_until(browser, lambda d: "watching" in text(d, "#watch-state"), "the first scan")
    assert "order-7" not in text(browser, "#active")
    make_unresolved(shop, "order-7")
    wait_until(browser, lambda d: "order-7" in text(d, "#active"), "order-7's alert")
    shot(browser, "ui-alerts")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "castore",
            "--store",
            shop.root,
            "resolve",
            "order-7",
            "charge",
            "--not-done",
            "--reason",
            "the service has no such charge",
            "--who",
            "ana@ops",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    wait_until(browser, lambda d: "order-7" not in text(d, "#active"), "the alert to clear")
    assert "cleared" in text(browser, "#recent")
