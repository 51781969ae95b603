"""Debian's Chromium, driven by Playwright.

Playwright's own browser download (``playwright install``) does not work on the kit's
machines, so the test uses the distribution's Chromium and installs it with apt when it
is missing (CI runs as root with Debian's mirrors reachable).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import BrowserContext, Error as PlaywrightError, sync_playwright

CHROMIUM = "/usr/bin/chromium"
APT_PACKAGES = ("chromium", "fonts-liberation")  # fonts: screenshots show text, not boxes

# Headless and quiet: no GPU, no sandbox (root in a container), no calls home.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VIEWPORT = {"width": 1440, "height": 900}


class BrowserUnavailable(RuntimeError):
    """Chromium is not installed and could not be installed."""


def ensure_chromium() -> str:
    """Return the path of Debian's Chromium, installing it with apt-get if it is missing.

    Raises BrowserUnavailable with the reason and the command to run by hand.
    """
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    # pytest-xdist workers may all get here; one installs, the others then find it.
    with open(Path(tempfile.gettempdir()) / "inkling-e2e-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(CHROMIUM):
            _apt_install()
    return CHROMIUM


def _apt_install() -> None:
    """apt-get update, then install APT_PACKAGES without recommends; BrowserUnavailable on failure."""
    by_hand = f"apt-get update && apt-get install -y {' '.join(APT_PACKAGES)}"
    if os.geteuid() != 0:
        raise BrowserUnavailable(f"{CHROMIUM} is missing and installing it needs root; run: sudo {by_hand}")
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable(f"{CHROMIUM} is missing and there is no apt-get here; install Debian's chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    steps = (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends",
         "-o", "DPkg::Lock::Timeout=300", *APT_PACKAGES],
    )
    for step in steps:
        try:
            done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise BrowserUnavailable(f"`{' '.join(step)}` took more than 15 minutes; run by hand: {by_hand}") from None
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-2000:]
            raise BrowserUnavailable(
                f"`{' '.join(step)}` failed (exit {done.returncode}); run by hand: {by_hand}\n{tail}")
    if not os.path.exists(CHROMIUM):
        raise BrowserUnavailable(f"apt-get installed {APT_PACKAGES} but {CHROMIUM} is still missing")


@contextmanager
def chromium_context(user_data_dir: Path) -> Iterator[BrowserContext]:
    """A headless Chromium with a new, empty profile in ``user_data_dir``; closed on exit.

    Raises BrowserUnavailable when Chromium cannot be installed or started.
    """
    executable = ensure_chromium()
    with sync_playwright() as playwright:
        try:
            context = playwright.chromium.launch_persistent_context(
                str(user_data_dir), executable_path=executable, headless=True,
                args=list(CHROMIUM_ARGS), viewport=VIEWPORT)
        except PlaywrightError as exc:
            raise BrowserUnavailable(f"{executable} did not start under Playwright: {exc}") from exc
        try:
            yield context
        finally:
            context.close()
