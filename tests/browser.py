"""Headless Chromium for the tests that look at pages as a user would: the HTML report and
the MLflow UI. Tests skip, saying so, when no Chromium is installed (`make test` installs one
where it can); where CI=true they fail instead: there the browser checks must run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
NO_BROWSER = "no Chromium here (make test installs chromium-headless-shell where it can)"


def browser() -> str | None:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        for candidate in ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium"):
            if shutil.which(candidate):
                return candidate
    return found


def require_browser() -> str:
    """The browser a test looks through; without one the test is skipped, or fails where CI=true
    (a CI run that skipped the browser checks would pass without them)."""
    found = browser()
    if found is None and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {NO_BROWSER}: the browser checks must run here")
    if found is None:
        pytest.skip(NO_BROWSER)
    return found


def dump_dom(url: str, budget_ms: int = 5000, window: str = "1920,1080") -> str:
    """The page's DOM after `budget_ms` of virtual time (scripts run, fetches answered)."""
    found = require_browser()
    return subprocess.run(
        [
            found,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--window-size={window}",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(tracking_uri: str, log: Path, start_timeout_s: float = 120.0):
    """`mlflow server` on loopback over a tracking store; yields its base URL."""
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    with open(log, "w") as out:
        server = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--backend-store-uri",
                tracking_uri,
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise AssertionError(f"mlflow server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield base
    finally:
        # The server forks workers and job consumers: stop its whole session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
