"""Fixtures: one real small training run per session, the store server on it, and headless Chromium.

Chromium is Debian's `chromium` package, driven through Playwright for Python with `executable_path`
(`playwright install` is never run). A machine without it fails these tests with a message saying
how to install it: the dashboard's browser tests are never skipped silently.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from reinforge.net.background import BackgroundServer
from reinforge.store.cli import default_db_url
from reinforge.store.factory import open_store
from reinforge.store.http.auth import read_token
from reinforge.store.http.dashboard_routes import DashboardState
from reinforge.store.http.server import create_store_app
from reinforge.store.protocol import Store

from .training_run import train_small_run

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS_ENV = "REINFORGE_DASHBOARD_SCREENSHOTS"
"""Set to a folder (docs/img) to keep the screenshots there as well as in the test's tmp dir."""


@dataclass
class Served:
    url: str
    token: str
    run_dir: Path
    dashboard: DashboardState
    shots: Path

    @property
    def page_url(self) -> str:
        return f"{self.url}/dashboard#token={self.token}"

    def screenshot(self, page: Page, name: str) -> Path:
        """Save a full-page screenshot to the session's folder, and to $REINFORGE_DASHBOARD_SCREENSHOTS
        as docs/img/dashboard-<name>.png when that is set."""
        out = self.shots / f"dashboard-{name}.png"
        page.screenshot(path=str(out), full_page=True)
        keep = os.environ.get(SCREENSHOTS_ENV)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, Path(keep) / out.name)
        assert out.stat().st_size > 10_000  # a rendered page, not a blank one
        return out


@dataclass
class Console:
    errors: list[str] = field(default_factory=list)

    def on_message(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"{message.text} ({message.location.get('url')})")


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_small_run(tmp_path_factory.mktemp("dashboard") / "run")


@pytest.fixture(scope="session")
def served(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    token = read_token(run_dir)
    assert token is not None

    async def open_run_store() -> Store:
        return await open_store(default_db_url(run_dir))

    app = create_store_app(open_run_store, token, run_dir=run_dir)
    server = BackgroundServer(app).start()
    state: DashboardState = app.state.dashboard
    try:
        yield Served(server.url, token, run_dir, state, tmp_path_factory.mktemp("screenshots"))
    finally:
        state.close()
        server.stop()


def chromium_path() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if found is None:
        pytest.fail(
            "Debian's chromium is not installed: run scripts/setup.sh as root, or "
            "`apt-get install -y chromium` (the dashboard tests need a real browser)"
        )
    return found


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop running on this thread while it is open: the
    # training run (asyncio.run) is built before it starts, and it closes with its test module so
    # that async tests after it get their own loop.
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(browser: Browser, console: Console) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    opened.on("console", console.on_message)
    opened.on("pageerror", lambda exc: console.errors.append(f"uncaught: {exc}"))
    try:
        yield opened
    finally:
        context.close()
