"""The daemon's dashboard and its JSON API, against a real daemon that has compacted real tables:
the documents as docs/dashboard.md describes them, the token, the redaction, and the pages in
headless Chromium (charts drawn, links followed, no console error, nothing from another host).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from compactor.bench.sample import create_events_table
from compactor.daemon.history import History
from compactor.redaction import MASK

from support import REPOSITORY
from support.browser import console_errors, headless_chromium, other_hosts, requested_urls
from support.daemon import COMPACT_EVERY_SECOND, EVENT_TIMEOUT_S, DaemonProcess, Setup
from support.deletes import commit_delete_files, write_position_delete_file
from support.json_output import assert_documented
from support.tables import live_data_files

pytestmark = pytest.mark.slow  # a daemon, its compactions, a browser

DOC = REPOSITORY / "docs" / "dashboard.md"
DOCS_SCREENSHOTS = {
    name: REPOSITORY / "docs" / "images" / name
    for name in (
        "dashboard-overview.png",
        "dashboard-table.png",
        "dashboard-runs.png",
        "dashboard-jobs.png",
    )
}
TOKEN = "dashboard-test-token-7f3a"
EVENTS, AUDIT, ORDERS = "db.events", "db.audit", "db.orders"
# A job whose every tick fails: the table it names does not exist.
BROKEN_JOB = 'tables = ["db.missing"]\n\n[compact]\nevery = "1s"\n'
# An access key id in an old run's error: the API must mask it (the shape is secret anywhere).
LEAKED = "AKIAIOSFODNN7EXAMPLE"


@dataclass
class Served:
    daemon: DaemonProcess
    setup: Setup

    @property
    def url(self) -> str:
        return str(self.daemon.url)

    def get(self, path: str, token: str | None = TOKEN) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body of GET ``path`` (with the bearer token, if given)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def api(self, path: str) -> dict[str, Any]:
        status, _, body = self.get(path)
        assert status == 200, body
        document: dict[str, Any] = json.loads(body)
        return document


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A daemon with a token, two tables compacted (one had a position delete file), one never
    due (a position delete file, no small files) and a job that keeps failing; an old run in
    its state file carries a secret-shaped error."""
    root = tmp_path_factory.mktemp("dashboard")
    (root / "wh").mkdir()
    catalog = SqlCatalog(
        "default", uri=f"sqlite:///{root}/catalog.db", warehouse=(root / "wh").as_uri()
    )
    catalog.create_namespace("db")
    create_events_table(catalog, EVENTS, commits=8, rows_per_commit=200, days=2)
    audit = create_events_table(catalog, AUDIT, commits=4, rows_per_commit=100, days=1)
    data_file = next(iter(live_data_files(audit).values()))
    commit_delete_files(audit, [write_position_delete_file(audit, {data_file: [0]})])
    orders = create_events_table(catalog, ORDERS, commits=1, rows_per_commit=100, days=1)
    data_file = next(iter(live_data_files(orders).values()))
    commit_delete_files(orders, [write_position_delete_file(orders, {data_file: [1]})])
    setup = Setup(root, catalog)
    with (root / "compactor.toml").open("a") as config:
        config.write(f'http_token = "{TOKEN}"\n')
    setup.job("lake", COMPACT_EVERY_SECOND)
    setup.job("broken", BROKEN_JOB)
    history = History(setup.state)
    history.close()
    with sqlite3.connect(setup.state) as db:
        db.execute(
            "INSERT INTO runs (table_name, action, job, started_at, ended_at, outcome, error) "
            "VALUES (?, 'expire', 'lake', 1, 2, 'failed', ?)",
            (EVENTS, f"access denied for {LEAKED}"),
        )
    daemon = setup.start()
    try:
        waiting = {EVENTS, AUDIT, "broken"}

        def compacted(event: dict[str, Any]) -> bool:
            if event.get("event") == "run_finished" and event["snapshot_ids"]:
                waiting.discard(event["table"])
            if event.get("event") == "tick_failed" and event["job"] == "broken":
                waiting.discard("broken")
            return not waiting

        daemon.wait_for(compacted, "a compaction of each table")
        yield Served(daemon, setup)
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)


# --- the JSON API ------------------------------------------------------------------------------


def test_api_documents_have_the_documented_shapes(served: Served) -> None:
    tables = served.api("/api/v1/tables")
    assert_documented("GET /api/v1/tables", tables, DOC)
    assert [t["table"] for t in tables["tables"]][0] == ORDERS  # the neediest first
    assert {t["table"] for t in tables["tables"]} == {EVENTS, AUDIT, ORDERS}
    orders = tables["tables"][0]
    assert orders["delete_files_by_kind"] == {"position": 1, "equality": 0, "deletion_vector": 0}
    assert (orders["health_score"], orders["last_run"]) == (80, None)  # 1 of 5 files is a delete
    (failing,) = tables["failing_jobs"]
    assert (failing["job"], failing["action"]) == ("broken", "compact")
    assert "db.missing" in failing["last_error"]
    # The position delete file, until the compaction applied it.
    over_time = served.api(f"/api/v1/tables/{AUDIT}")["deletes_over_time"]
    assert [s["delete_files"] for s in over_time][-3:] == [0, 1, 0]
    assert tables["totals"]["day"]["files_saved"] > 0

    events = served.api(f"/api/v1/tables/{quote(EVENTS)}")
    assert_documented("GET /api/v1/tables/{table}", events, DOC)
    sizes = events["sizes"]
    # Before and after the compaction: the same rows in fewer files.
    assert sum(sizes["before"]["counts"]) > sum(sizes["after"]["counts"]) > 0
    assert sizes["note"] is None
    compaction = next(r for r in events["runs"] if r["id"] == sizes["compaction_run_id"])
    assert compaction["snapshot_ids"][-1] == sizes["after"]["snapshot_id"]
    assert events["deletes_over_time"][-1]["data_files"] == events["data_files"]
    assert events["worst_partitions"]

    runs = served.api("/api/v1/runs?limit=500")
    assert_documented("GET /api/v1/runs", runs, DOC)
    assert {(r["table"], r["action"]) for r in runs["runs"] if r["snapshot_ids"]} >= {
        (EVENTS, "compact"),
        (AUDIT, "compact"),
    }
    jobs = served.api("/api/v1/jobs")
    assert_documented("GET /api/v1/jobs", jobs, DOC)
    broken, lake = jobs["jobs"]
    assert (lake["job"], [a["action"] for a in lake["actions"]]) == ("lake", ["compact"])
    assert lake["actions"][0]["schedule"] == "every 1s"
    assert lake["actions"][0]["last_outcome"] == "ok"
    assert broken["actions"][0]["consecutive_failures"] > 0


def test_a_table_never_compacted_shows_its_current_sizes_only(served: Served) -> None:
    orders = served.api(f"/api/v1/tables/{ORDERS}")
    sizes = orders["sizes"]
    assert (sizes["before"], sizes["after"], sizes["compaction_run_id"]) == (None, None, None)
    assert sizes["note"].startswith("no compaction committed")
    assert sum(sizes["current"]["counts"]) == orders["data_files"] == 4


def test_unknown_tables_and_paths_are_404(served: Served) -> None:
    status, _, body = served.get("/api/v1/tables/db.nope")
    assert (status, json.loads(body)["error"]) == (404, "no job covers table db.nope")
    assert served.get("/api/v1/nothing")[0] == 404
    assert served.get("/static/../routes.py")[0] == 404
    assert served.get("/elsewhere")[0] == 404


def test_no_secret_in_any_document(served: Served) -> None:
    bodies = [
        served.get(path)[2].decode()
        for path in ("/api/v1/tables", f"/api/v1/tables/{EVENTS}", "/api/v1/runs", "/api/v1/jobs")
    ]
    assert not [b for b in bodies if LEAKED in b or TOKEN in b]
    (old,) = [r for r in json.loads(bodies[2])["runs"] if r["action"] == "expire"]
    assert old["error"] == f"access denied for {MASK}"


def test_the_token_guards_pages_and_api_but_not_health_or_metrics(served: Served) -> None:
    for path in ("/", f"/tables/{EVENTS}", "/runs", "/static/app.js", "/api/v1/tables"):
        assert served.get(path, token=None)[0] == 401, path
        assert served.get(path, token="wrong-token")[0] == 401, path
        assert served.get(path)[0] == 200, path
    assert served.get("/api/v1/tables?token=" + TOKEN, token=None)[0] == 401
    assert served.get("/metrics", token=None)[0] == 200
    # ok, or degraded once the failing job has failed 3 ticks: an answer, without a token.
    status, _, body = served.get("/healthz", token=None)
    assert (status, json.loads(body)["status"]) in ((200, "ok"), (503, "degraded"))
    # A page opened once with ?token= sets a cookie and drops the token from the address.
    status, headers, _ = served.get(f"/runs?token={TOKEN}&limit=5", token=None)
    assert (status, headers["Location"]) == (303, "/runs?limit=5")
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in headers["Set-Cookie"]
    request = urllib.request.Request(served.url + "/api/v1/jobs", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


# --- in a browser ------------------------------------------------------------------------------


def test_pages_in_headless_chromium(served: Served, tmp_path: Path) -> None:
    with headless_chromium(tmp_path) as browser:
        wait = WebDriverWait(browser, EVENT_TIMEOUT_S)

        def loaded(path: str) -> None:
            browser.get(served.url + path)
            wait.until(
                expected_conditions.presence_of_element_located(
                    (By.CSS_SELECTOR, "main[data-loaded]")
                )
            )
            assert not browser.find_elements(By.ID, "load-error"), browser.find_element(
                By.ID, "load-error"
            ).text

        loaded(f"/?token={TOKEN}")
        assert browser.current_url == served.url + "/"
        rows = browser.find_elements(By.CSS_SELECTOR, "tr[data-table]")
        assert {r.get_attribute("data-table") for r in rows} == {EVENTS, AUDIT, ORDERS}
        assert "db.missing" in browser.find_element(By.ID, "failing-jobs").text
        assert browser.find_elements(By.CSS_SELECTOR, "svg.health rect")
        _screenshot(browser, tmp_path, "dashboard-overview.png")

        browser.find_element(By.LINK_TEXT, AUDIT).click()
        wait.until(expected_conditions.url_to_be(f"{served.url}/tables/{AUDIT}"))
        wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "main[data-loaded]"))
        )
        assert browser.find_element(By.TAG_NAME, "h1").text == AUDIT
        charts = browser.find_elements(By.CSS_SELECTOR, "figure.chart svg")
        assert len(charts) == 2
        assert len(browser.find_elements(By.CSS_SELECTOR, "figure.chart rect.bar")) > 0
        assert browser.find_elements(By.CSS_SELECTOR, "figure.chart path.line")
        _screenshot(browser, tmp_path, "dashboard-table.png")

        for link, heading in (("Runs", "Recent runs"), ("Jobs", "Jobs and schedules")):
            browser.find_element(By.LINK_TEXT, link).click()
            wait.until(
                expected_conditions.text_to_be_present_in_element((By.TAG_NAME, "h1"), heading)
            )
            _screenshot(browser, tmp_path, f"dashboard-{link.lower()}.png")
        assert browser.find_elements(By.CSS_SELECTOR, "table.grid tbody tr")

        assert console_errors(browser) == []
        urls = requested_urls(browser)
        assert any(u.endswith("/api/v1/tables") for u in urls)
        assert other_hosts(urls, served.url) == []


def _screenshot(browser: Any, tmp_path: Path, name: str) -> None:
    """Keep a screenshot as a test artifact (in the test's temporary directory); with
    COMPACTOR_DOCS_SCREENSHOTS=1, every page's also replaces docs/'s."""
    path = tmp_path / name
    assert browser.save_screenshot(str(path))
    if os.environ.get("COMPACTOR_DOCS_SCREENSHOTS") == "1" and name in DOCS_SCREENSHOTS:
        shutil.copy2(path, DOCS_SCREENSHOTS[name])
