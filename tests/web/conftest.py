"""Browser fixtures: headless Debian Chromium driven by selenium, and a dashboard server thread.

Browser tests are marked ``browser`` and skip when chromium or chromedriver is absent. Each test
saves a screenshot under ``test-output/screenshots/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = next((p for p in (os.environ.get("PROBE_CHROMIUM"), "/usr/bin/chromium",
                             "/usr/bin/chromium-browser") if p and Path(p).exists()), None)
CHROMEDRIVER = next((p for p in (os.environ.get("PROBE_CHROMEDRIVER"), "/usr/bin/chromedriver")
                     if p and Path(p).exists()), None)


def new_driver(width: int = 1600, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="probe-chromium-")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    driver._probe_profile = profile
    return driver


def quit_driver(driver) -> None:
    driver.quit()
    shutil.rmtree(driver._probe_profile, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("headless chromium/chromedriver not installed (apt-get install chromium chromium-driver)")
    driver = new_driver()
    yield driver
    quit_driver(driver)


@pytest.fixture
def shot(browser, request):
    """``shot(name)`` saves a screenshot of the current page as test-output/screenshots/NAME.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)

    def save(name: str) -> Path:
        path = SHOTS / f"{name}.png"
        browser.save_screenshot(str(path))
        return path
    return save


@pytest.fixture
def serve_app():
    """``serve_app(app, path)`` serves it on a free port and returns the URL of page ``path``
    with the dashboard's token (opening it signs the browser in, as the printed URL does)."""
    from probe.web.app import ServerThread

    servers = []

    def start(app, path: str = "/") -> str:
        srv = ServerThread(app, "127.0.0.1", 0)
        servers.append(srv)
        return srv.signed_url(path)
    yield start
    for srv in servers:
        srv.stop()


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < end:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the DOM changes under us while Dash re-renders
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))
