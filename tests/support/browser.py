"""Headless Chromium driven by Selenium: Debian's ``chromium`` and ``chromium-driver``, installed
with apt-get when missing (the test is skipped only where apt-get cannot run: not there, or not
root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from support import java_reader

PACKAGES = ("chromium", "chromium-driver")
BROWSER_NAMES = ("chromium", "chromium-browser")
INSTALL_TIMEOUT_S = 1800
NETWORK_SCHEMES = ("http", "https", "ws", "wss", "ftp")


def _found() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, BROWSER_NAMES) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def chromium() -> tuple[str, str]:
    """The paths of Chromium and its driver; installs Debian's packages when they are missing,
    skips the test where apt-get cannot run."""
    found = _found()
    if found is not None:
        return found
    # One installer at a time (parallel test workers); another may have finished meanwhile.
    with java_reader.file_lock(java_reader.cache_root().parent / "chromium-install.lock"):
        return _found() or _install()


def _install() -> tuple[str, str]:
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip(
            "headless Chromium not found and apt-get cannot install it here (needs apt-get as "
            "root): apt-get install -y --no-install-recommends chromium chromium-driver"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        [apt, "update"],
        [apt, "install", "-y", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(
                f"{' '.join(command)} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-4000:]}"
            )
    found = _found()
    assert found is not None, f"apt-get installed {PACKAGES} but chromium/chromedriver are missing"
    return found


@contextmanager
def headless_chromium(work: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium session, its profile in ``work``, recording its console and its
    network requests."""
    browser, driver = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespaces for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-background-networking",  # no update checks, no component downloads
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        f"--user-data-dir={work / 'chromium-profile'}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    session = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield session
    finally:
        session.quit()


def console_errors(session: webdriver.Chrome) -> list[dict[str, Any]]:
    """The console's errors (``SEVERE``) since the last call."""
    return [entry for entry in session.get_log("browser") if entry["level"] == "SEVERE"]


def requested_urls(session: webdriver.Chrome) -> list[str]:
    """Every URL the pages requested since the last call (the DevTools network events)."""
    urls = []
    for entry in session.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def other_hosts(urls: list[str], origin: str) -> list[str]:
    """The URLs of ``urls`` that go over the network elsewhere than ``origin``
    (``http://host:port``); the browser's own pages (``chrome://``, ``data:``) stay inside it."""
    served = urlsplit(origin).netloc
    return [
        url
        for url in urls
        if urlsplit(url).scheme in NETWORK_SCHEMES and urlsplit(url).netloc != served
    ]
