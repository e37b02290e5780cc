# SPDX-License-Identifier: MIT
"""The dashboard in a real browser: Debian's headless Chromium driven by selenium through
the system chromedriver (``scripts/services chromium`` installs both). The server is
uvicorn on a free loopback port, over a real SQLite file or PostgreSQL table.

Each test saves screenshots of the pages it visits under its tmp dir
(``DASHBOARD_SCREENSHOTS=dir`` copies them there too, for the docs)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import onceonly
from onceonly._core.lateness import HALF_TTL, NEAR_TTL, RAN
from onceonly._core.state import State
from tests.admin._records import put
from tests.conftest import PG_URL, drop_pg_table, require_postgres, unavailable, unique_table

TOKEN = "browser-operator-token"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.expected_conditions import staleness_of  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


class Server:
    """uvicorn serving the dashboard of ``url`` in a thread (its own event loop)."""

    def __init__(self, url: str, table: str, token: str | None) -> None:
        self.url, self.table, self.token = url, table, token
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.ready = threading.Event()
        self.server: Any = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        import uvicorn

        from onceonly.dashboard import app

        store = onceonly.open_async_store(
            self.url, table=self.table, outbox_table=f"{self.table}_outbox"
        )
        try:
            config = uvicorn.Config(
                app(store, token=self.token), log_level="warning", lifespan="off"
            )
            self.server = uvicorn.Server(config)
            self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
            self.server.capture_signals = _no_signals  # type: ignore[method-assign]
            self.ready.set()
            await self.server.serve(sockets=[self.sock])
        finally:
            await store.close()

    def __enter__(self) -> Server:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


def _no_signals() -> Any:
    import contextlib

    return contextlib.nullcontext()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        unavailable("chromium and chromedriver (scripts/services chromium)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(2)
    yield driver
    driver.quit()


@pytest.fixture(params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Site:
    """A seeded store, its dashboard server and the browser, plus screenshot saving."""

    def __init__(self, kind: str, tmp_path: Path, driver: Any, token: str | None) -> None:
        self.table = unique_table()
        if kind == "postgres":
            require_postgres()
            self.url = PG_URL
        else:
            self.url = f"sqlite:///{tmp_path / 'dash.db'}"
        self.kind = kind
        self.tmp_path = tmp_path
        self.store = onceonly.open_store(
            self.url, table=self.table, outbox_table=f"{self.table}_outbox"
        )
        self.store.migrate()
        self.driver = driver
        self.server = Server(self.url, self.table, token)

    def seed(self) -> None:
        s = self.store
        for i in range(3):
            put(s, "billing", f"pay-{i}", State.COMPLETED, ttl=3600)
        put(s, "billing", "pay-dead-1", State.DEAD, attempts=5,
            error="CardDeclined: insufficient funds", payload='{"amount": 10}')  # fmt: skip
        put(s, "billing", "pay-dead-2", State.DEAD, attempts=5,
            error="TimeoutError: bank did not answer in 30 s\n  at charge()",
            payload='{"amount": 20, "currency": "EUR"}')  # fmt: skip
        put(s, "billing", "pay-failed", State.FAILED, attempts=2, error="TimeoutError")
        put(s, "billing", "pay-stuck", State.IN_PROGRESS, lease=-600)
        for i in range(2):
            put(s, "shipping", f"ship-{i}", State.COMPLETED, ttl=3600)
        now = int(time.time()) // 60 * 60
        onceonly.Admin(s).records.add_counts(
            [("billing", now - 300 * i, 40 + 7 * i, (3 * i) % 9 + 1) for i in range(12)]
            + [("shipping", now - 300 * i, 20, i % 3) for i in range(12)]
        )
        # what a DuplicateRecorder writes: runs (bin 0) and duplicates per lateness bin
        spread = {1: 9, 2: 5, 3: 3, 4: 2, 5: 1, HALF_TTL: 1, NEAR_TTL: 1}
        onceonly.Admin(s).records.add_lateness(
            [("billing", now - 300 * i, RAN, 40 + 7 * i, None) for i in range(12)]
            + [("shipping", now - 300 * i, RAN, 20, None) for i in range(12)]
            + [("billing", now - 300 * i, b, n * (1 + i % 3), 3600.0)
               for i in range(12) for b, n in spread.items()]
            + [("shipping", now - 300 * i, 2, i % 3, 3600.0) for i in range(12) if i % 3]
        )  # fmt: skip

    def get(self, path: str) -> None:
        self.driver.get(self.server.base + path.lstrip("/"))

    def shot(self, name: str) -> Path:
        """Save the whole page as ``dashboard-NAME.png`` under the tmp dir."""
        d = self.driver
        size = d.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = d.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        path = self.tmp_path / f"dashboard-{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        copy_to = os.environ.get("DASHBOARD_SCREENSHOTS")
        if copy_to:
            shutil.copy(path, Path(copy_to) / path.name)
        return path

    def click(self, element: Any) -> None:
        """Click ``element`` and wait until the browser has left the page (reading the
        next page's text before that finds the old page's elements)."""
        old = self.driver.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.driver, 10).until(staleness_of(old))

    def text(self, css: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def login(self) -> None:
        self.get("login")
        self.driver.find_element(By.NAME, "token").send_keys(TOKEN)
        self.click(self.driver.find_element(By.CSS_SELECTOR, "form button[type=submit]"))
        assert "Logged in" in self.text("#notice")

    def state(self, scope: str, key: str) -> State | None:
        record = onceonly.Admin(self.store).show(scope, key)
        return None if record is None else record.state

    def close(self) -> None:
        self.driver.delete_all_cookies()
        self.store.close()
        if self.kind == "postgres":
            drop_pg_table(self.table)
            drop_pg_table(f"{self.table}_outbox")
            drop_pg_table(f"{self.table}_counts")
            drop_pg_table(f"{self.table}_lateness")


@pytest.fixture
def site(kind: str, tmp_path: Path, browser: Any) -> Iterator[Site]:
    s = Site(kind, tmp_path, browser, TOKEN)
    s.seed()
    with s.server:
        yield s
    s.close()


@pytest.fixture
def sqlite_site(tmp_path: Path, browser: Any) -> Iterator[Site]:
    s = Site("sqlite", tmp_path, browser, TOKEN)
    s.seed()
    with s.server:
        yield s
    s.close()


def test_overview_shows_the_seeded_counts(site: Site) -> None:
    """Totals, per-state and per-scope counts, and the duplicate-rate chart."""
    site.get("")
    assert site.text("#total") == "9"
    assert [site.text(f"#count-{s}") for s in ("in_progress", "completed", "failed", "dead")] == [
        "1", "5", "1", "2",
    ]  # fmt: skip
    rows = site.driver.find_elements(By.CSS_SELECTOR, "#scopes tbody tr")
    cells = [[c.text for c in r.find_elements(By.TAG_NAME, "td")][:5] for r in rows]
    assert cells == [["billing", "1", "3", "1", "2"], ["shipping", "0", "2", "0", "0"]]
    bars = site.driver.find_elements(By.CSS_SELECTOR, "#duplicate-rate svg rect.bar")
    assert len(bars) >= 2
    assert "DuplicateRecorder" in site.text("#rate-source")
    late = site.driver.find_elements(By.CSS_SELECTOR, "#lateness rect[id^=lateness-bin-]")
    assert [e.get_attribute("data-count") for e in late] == [
        "216", "132", "72", "48", "24", "0", "0", "0", "0", "24", "24",
    ]  # fmt: skip
    assert late[0].size["height"] > late[1].size["height"] > late[4].size["height"] > 0
    assert "ttl = 1h 0m" in site.text("#lateness")  # the ttl marker's label
    path = site.shot("overview" if site.kind == "sqlite" else "overview-postgres")
    assert path.stat().st_size > 10_000


def test_filter_then_read_a_dead_records_error(sqlite_site: Site) -> None:
    """Filter by scope, state and error text; the dead record's page shows its error."""
    site = sqlite_site
    site.get("")
    site.click(site.driver.find_element(By.CSS_SELECTOR, "a.card.dead"))
    keys = [e.text for e in site.driver.find_elements(By.CSS_SELECTOR, "#records td.key")]
    assert keys == ["pay-dead-1", "pay-dead-2"]
    form = site.driver.find_element(By.ID, "filters")
    form.find_element(By.NAME, "scope").send_keys("billing")
    form.find_element(By.NAME, "q").send_keys("timeout")
    Select(form.find_element(By.NAME, "state")).select_by_value("dead")
    site.click(form.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    keys = [e.text for e in site.driver.find_elements(By.CSS_SELECTOR, "#records td.key")]
    assert keys == ["pay-dead-2"]
    site.shot("records")
    site.click(site.driver.find_element(By.LINK_TEXT, "pay-dead-2"))
    assert "TimeoutError: bank did not answer in 30 s" in site.text("#record-error")
    assert site.text("#record-state") == "dead"


def test_redrive_from_the_page_and_the_next_delivery_runs(sqlite_site: Site) -> None:
    """Log in, redrive a dead message from its page; the next delivery runs the handler."""
    site = sqlite_site
    inbox = onceonly.Inbox(site.store, consumer="payments", max_attempts=1)
    runs: list[str] = []
    broken = [True]

    def handler(msg: Any, tx: Any) -> str:
        runs.append(msg["id"])
        if broken[0]:
            raise RuntimeError("card processor said: 503 Service Unavailable")
        return "charged"

    with pytest.raises(RuntimeError):
        inbox.process("order-77", {"id": "order-77"}, handler)
    broken[0] = False
    site.get("login")
    site.shot("login")
    site.login()
    site.get("records?scope=payments&state=dead")
    site.click(site.driver.find_element(By.LINK_TEXT, "order-77"))
    assert "503 Service Unavailable" in site.text("#record-error")
    site.shot("record")
    site.click(site.driver.find_element(By.ID, "redrive"))
    assert "Redriven" in site.text("#notice")
    assert site.text("#record-state") == "failed"
    assert "waiting for the next delivery" in site.text("#record-redriven")
    assert site.driver.find_elements(By.ID, "redrive") == []
    assert site.state("payments", "order-77") is State.FAILED
    outcome = inbox.process("order-77", {"id": "order-77"}, handler)
    assert outcome.result == "charged" and runs == ["order-77", "order-77"]
    site.driver.refresh()
    assert site.text("#record-state") == "completed"


def test_filtered_redrive_asks_for_confirmation(sqlite_site: Site) -> None:
    """The dry-run count first, nothing changed; confirming redrives the set."""
    site = sqlite_site
    site.login()
    site.get("records?scope=billing&state=dead")
    site.click(site.driver.find_element(By.ID, "redrive-filtered"))
    assert site.text("#match-count") == "2"
    assert site.state("billing", "pay-dead-1") is State.DEAD
    site.shot("redrive")
    site.driver.find_element(By.ID, "confirm-redrive").click()  # box not ticked: the
    assert site.state("billing", "pay-dead-1") is State.DEAD  # browser refuses to submit
    site.driver.find_element(By.ID, "confirm").click()
    site.click(site.driver.find_element(By.ID, "confirm-redrive"))
    assert "Redriven" in site.text("#notice") and "(2)" in site.text("#notice")
    assert site.state("billing", "pay-dead-1") is State.FAILED
    assert site.state("billing", "pay-dead-2") is State.FAILED


def test_a_write_without_the_token_is_refused(sqlite_site: Site) -> None:
    """Logged out: no action buttons; a form posted after the session is gone is a 401."""
    site = sqlite_site
    site.get("records/billing/pay-dead-1")
    assert site.driver.find_elements(By.ID, "redrive") == []
    assert site.driver.find_element(By.LINK_TEXT, "Log in")
    site.login()
    site.get("records/billing/pay-dead-1")
    button = site.driver.find_element(By.ID, "redrive")
    site.driver.delete_all_cookies()
    site.click(button)
    assert site.text("h1") == "401"
    assert "log in" in site.text("#error").lower()
    site.shot("refused")
    assert site.state("billing", "pay-dead-1") is State.DEAD


def test_a_key_holding_markup_renders_as_text(sqlite_site: Site) -> None:
    """A key and an error with <script> and an onerror handler show as text; none runs."""
    site = sqlite_site
    key = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    put(
        site.store,
        "evil",
        key,
        State.DEAD,
        attempts=1,
        error="<b>bold?</b><script>alert(2)</script>",
    )
    site.get("records?scope=evil")
    link = site.driver.find_element(By.CSS_SELECTOR, "#records td.key a")
    assert link.text == key
    site.click(link)
    assert site.text("#record-key") == key
    assert site.text("#record-error") == "<b>bold?</b><script>alert(2)</script>"
    assert site.driver.title != "pwned"
    with pytest.raises(NoAlertPresentException):
        site.driver.switch_to.alert.text  # noqa: B018
    site.shot("xss")


def test_outbox_page(sqlite_site: Site) -> None:
    """Dead outbox rows are listed with their error and redriven from the page."""
    from onceonly.outbox import Outbox

    site = sqlite_site
    outbox = Outbox(site.store)
    with site.store.transaction() as s:
        for i in range(3):
            outbox.write(s, outbox.prepare("receipts", {"order": i}, key=f"order-{i}"))
    with site.store.transaction() as s:
        s.execute(
            f"UPDATE {outbox.sql.table} SET state = 'dead', attempts = 10,"
            " last_error = 'PublishError: exchange receipts not found' WHERE key != 'order-2'"
        )
    site.login()
    site.get("outbox")
    assert site.text("#outbox-dead") == "2" and site.text("#outbox-pending") == "1"
    assert "exchange receipts not found" in site.text("#outbox-rows")
    site.shot("outbox")
    site.click(site.driver.find_element(By.ID, "outbox-redrive-all"))
    assert site.text("#outbox-dead") == "0" and site.text("#outbox-pending") == "3"
