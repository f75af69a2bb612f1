"""A real headless Chromium (Debian's `chromium` and `chromium-driver`, which
.ci/run installs) driven by Selenium against a real `fencepost serve`. Skipped
on a developer's machine without them; under CI=true their absence fails."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from support import ServerProcess, missing

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Headless, and quiet: no update checks, sync or other traffic of the browser's own.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--window-size=1280,900", "--force-device-scale-factor=1",
)


def _need_browser() -> None:
    absent = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        absent.append("the selenium package (the test extra)")
    if not absent:
        return
    missing(f"the console tests' {', '.join(absent)} (apt chromium chromium-driver)")


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of the module's own: the tests revoke keys and force-release locks."""
    proc = ServerProcess(tmp_path_factory.mktemp("console-server")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # Never let Selenium Manager look for (or download) a browser or driver.
    os.environ["SE_OFFLINE"] = "true"
    profile: Path = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # The browser's console, read by the tests for CSP violations and script errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
