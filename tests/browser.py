"""A real browser for the HTML reports: Debian's headless Chromium driven by selenium through the system's
chromedriver (never one downloaded), the page opened from disk with the network off.

``open_page`` skips the test, with the reason, where Chromium, its driver or selenium is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"


def _found() -> tuple:
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    driver = shutil.which(DRIVER) or ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None)
    return browser, driver


@contextlib.contextmanager
def open_page(path, work_dir, width: int = 1300, height: int = 1000):
    """A driver showing ``path`` (a file) offline: no network (DevTools' offline mode and a proxy that
    does not exist), a profile and temporary files under ``work_dir``. Yields the driver."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    browser, driver_path = _found()
    if browser is None or driver_path is None:
        pytest.skip("no headless Chromium here (apt-get install chromium chromium-driver)")
    work = os.path.join(str(work_dir), "chromium")
    os.makedirs(work, exist_ok=True)
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={work}/profile", f"--window-size={width},{height}",
                "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                "--disable-background-networking", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Chromium's singleton socket lives in TMPDIR, and a socket path has at most 107 bytes: a short folder,
    # removed below
    short = tempfile.mkdtemp(prefix="ddc-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager never downloads a driver or a browser
    env = {**os.environ, "TMPDIR": short, "HOME": work}
    service = Service(executable_path=driver_path, env=env, log_output=os.path.join(work, "driver.log"))
    try:
        drv = webdriver.Chrome(options=opts, service=service)
    except BaseException:
        shutil.rmtree(short, ignore_errors=True)
        raise
    try:
        drv.set_page_load_timeout(30)
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0})
        drv.get("file://" + os.path.abspath(str(path)))
        shots = os.environ.get("DDPDOCTOR_SCREENSHOTS")  # a folder: each page opened is saved there, whole
        if shots:
            tall = drv.execute_script("return document.documentElement.scrollHeight")
            drv.set_window_size(width, min(int(tall) + 40, 6000))
            drv.save_screenshot(os.path.join(shots, os.path.basename(str(path)) + f".{os.getpid()}.png"))
            drv.set_window_size(width, height)
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(short, ignore_errors=True)


def console_errors(drv) -> list:
    """The page's console messages at level SEVERE (script errors, blocked or failed loads)."""
    return [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
