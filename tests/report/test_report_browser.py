"""The dashboard in headless Chromium (Debian's ``chromium`` package, driven by Playwright with
``executable_path``; no downloaded browser): the report file over file:// and ``serve`` over
HTTP load without console errors, draw their charts, open an environment with its code and an
episode, keep hostile strings inert, and ``serve`` follows a run that gains a round.
Screenshots go to tests/artifacts/. Skipped when chromium or playwright is missing."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from report_run import HOSTILE_MARK, HOSTILE_STRINGS, build_run
from spadekit.report import data, page, server
from spadekit.runs.store import RunStore

CHROMIUM = next((p for p in (os.environ.get("SPADEKIT_CHROMIUM"), "/usr/bin/chromium",
                             shutil.which("chromium"), shutil.which("chromium-browser"))
                 if p and os.path.isfile(p)), None)
if CHROMIUM is None:
    pytest.skip("no chromium binary (install.sh installs Debian's chromium with the dev extra)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report-browser"))


@pytest.fixture(scope="module")
def hostile_sha(run) -> str:
    shas = [e["sha"] for e in data.snapshot(run)["environments"]
            if HOSTILE_MARK in data.env_detail(run, e["sha"], 0)["env"]["code"]]
    assert len(shas) == 1
    return shas[0]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


class Watched:
    """A page whose console errors, page errors, dialogs and failed requests are recorded."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type in ("error", "warning")
                     and self.problems.append(f"console {m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", self._dialog)
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url}"))

    def _dialog(self, dialog):
        self.problems.append(f"dialog: {dialog.type} {dialog.message}")
        dialog.dismiss()

    def close(self):
        self.context.close()


@pytest.fixture
def watched(browser):
    w = Watched(browser)
    yield w
    w.close()


def assert_inert(pg, problems):
    """No dialog fired, no injected element exists, the only scripts are the page's two."""
    assert not [p for p in problems if p.startswith("dialog")], problems
    assert pg.locator("img").count() == 0
    assert pg.locator("script").count() == 2
    assert pg.evaluate("typeof window.alert") == "function"


def check_overview(pg):
    pg.wait_for_selector("body[data-ready='1']", state="attached", timeout=15000)
    assert pg.locator("#tab-overview .chart svg path.line").count() >= 5
    assert pg.locator("#tab-overview .chart svg circle").count() >= 3
    assert pg.locator("#tab-overview .chart svg rect.band").count() >= 1  # the plateau band
    assert pg.locator("#tab-overview .chart svg rect.bar").count() >= 3  # phase timings


def check_environment(pg, sha):
    """Open the hostile environment from the table; its code, hint and an episode show."""
    pg.click(".tab[data-tab=envs]")
    pg.click(f"tr.env-row[data-sha='{sha}']")
    pg.wait_for_selector(f".detail[data-sha='{sha}'] #env-code .ln")
    code = pg.inner_text("#env-code")
    assert HOSTILE_MARK in code and "class LettersEnv" in code
    assert pg.locator("#env-code .t-kw").count() > 3  # highlighted
    hint = pg.inner_text("#env-hint")
    for text in HOSTILE_STRINGS:
        assert text in code and text in hint
    pg.wait_for_selector("#episode-view .transcript .bubble")
    assert pg.locator("#episode-view .bubble.role-assistant").count() >= 1
    assert "reward" in pg.inner_text("#episode-view .turn-info >> nth=0")


def test_report_file_in_chromium(run, hostile_sha, watched, tmp_path):
    out = page.write_report(run, tmp_path / "report.html")
    pg = watched.page
    pg.goto(out.as_uri())
    check_overview(pg)
    assert pg.inner_text("#run-rounds") == "3"
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    check_environment(pg, hostile_sha)
    pg.screenshot(path=str(ARTIFACTS / "report-environment.png"), full_page=True)
    # search reaches the code of embedded environments; filters combine
    pg.fill("#env-search", HOSTILE_MARK)
    assert pg.locator("tr.env-row").count() == 1
    pg.fill("#env-search", "")
    pg.click("#env-table th[data-key=win_rate]")
    assert pg.locator("#env-table th.sorted").count() == 1
    for tab in ("rejected", "curriculum"):
        pg.click(f".tab[data-tab={tab}]")
    pg.wait_for_selector("#tab-curriculum .effect .transcript")
    assert pg.locator("#tab-curriculum .bucket .env-card").count() >= 1
    pg.click(".tab[data-tab=rejected]")
    pg.click("details.reason[data-reason=no_code] summary")
    assert "found no code" in pg.inner_text("details.reason[data-reason=no_code]")
    assert_inert(pg, watched.problems)
    assert watched.problems == []


def test_an_async_run_shows_its_staleness_and_token_ledger(watched, tmp_path):
    """``rollout.max_staleness=1`` (issue 24): the overview draws the ledger and the staleness
    of the trained batches per round, from the run's own metrics."""
    run = build_run(tmp_path, rounds=3, generation_model="tiny",
                    **{"rollout.max_staleness": 1})
    out = page.write_report(run, tmp_path / "async.html")
    pg = watched.page
    pg.goto(out.as_uri())
    check_overview(pg)
    titles = pg.locator("#tab-overview .chart-title").all_inner_texts()
    for title in ("Token ledger (loss tokens, cumulative)",
                  "Staleness of trained batches (policy versions)"):
        chart = pg.locator(".chart", has=pg.locator(".chart-title", has_text=title))
        assert title in titles and chart.locator("path.line").count() >= 3, titles
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "report-async.png"), full_page=True)
    assert watched.problems == []


def test_empty_run_says_no_data_yet(watched, tmp_path):
    RunStore(tmp_path / "empty", create=True).close()
    out = page.write_report(tmp_path / "empty", tmp_path / "empty.html")
    pg = watched.page
    pg.goto(out.as_uri())
    pg.wait_for_selector("body[data-ready='1']", state="attached")
    assert "no data yet" in pg.inner_text("#tab-overview")
    pg.click(".tab[data-tab=envs]")
    assert "no environments yet" in pg.inner_text("#env-count")
    assert watched.problems == []


def test_serve_in_chromium_follows_the_run(run, hostile_sha, watched, tmp_path):
    live = tmp_path / "run"
    shutil.copytree(run, live)
    started, box = threading.Event(), {}
    thread = threading.Thread(target=server.serve_run, args=(live, "127.0.0.1", 0), kwargs={
        "ready": lambda srv: (box.setdefault("srv", srv), started.set())}, daemon=True)
    thread.start()
    assert started.wait(30)
    srv = box["srv"]
    try:
        pg = watched.page
        pg.goto(srv.url + "?poll=300")
        check_overview(pg)
        assert pg.inner_text("#run-rounds") == "3"
        check_environment(pg, hostile_sha)
        pg.fill("#env-search", HOSTILE_MARK)  # found through /api/search (code is server-side)
        sync_api.expect(pg.locator("tr.env-row")).to_have_count(1)
        polls = int(pg.evaluate("document.body.dataset.polls"))
        with RunStore(live) as store, store.round(3):
            store.log_metrics(3, {"agent_mean_return": 0.9, "regret": 0.2, "valid_share": 1.0})
        pg.wait_for_selector("body[data-rounds='4']", state="attached", timeout=15000)
        assert int(pg.evaluate("document.body.dataset.polls")) > polls
        assert pg.inner_text("#run-rounds") == "4"
        # the update kept the user's state: tab, search, open environment and episode
        assert pg.eval_on_selector(".tab.active", "e => e.dataset.tab") == "envs"
        assert pg.input_value("#env-search") == HOSTILE_MARK
        assert pg.locator(f".detail[data-sha='{hostile_sha}']").count() == 1
        assert pg.locator("#episode-view .transcript").count() == 1
        pg.screenshot(path=str(ARTIFACTS / "serve.png"), full_page=True)
        assert_inert(pg, watched.problems)
        assert watched.problems == []
    finally:
        srv.shutdown()
        thread.join(10)
