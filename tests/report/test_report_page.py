"""The dashboard without a browser: the page (embedded JSON stays inert, CSP, no network), the
report file and CLI, the ``serve RUN`` usage rules, and the read-only server's routes, status
codes and headers, on a real run with a hostile environment (see report_run.py)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import shutil
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from report_run import HOSTILE_MARK, HOSTILE_STRINGS, build_run
from spadekit.cli.app import app
from spadekit.report import data, page, server
from spadekit.runs.store import RunStore

NASTY = list(HOSTILE_STRINGS) + ["<!--", "<script>", "]]>", "&amp;", "\u2028\u2029", "</SCRIPT >",
                                 "\\u003c/script>", "'\"`"]
DATA_RE = re.compile(r'<script type="application/json" id="data">(.*?)</script>', re.S)
APP_RE = re.compile(r"<script>(.*?)</script>", re.S)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report-page"))


@pytest.fixture(scope="module")
def report_html(run) -> str:
    return page.build_report(run)


# -- the page ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", NASTY)
def test_script_json_cannot_leave_the_script_element(text):
    out = page.script_json({"k" + text: [text, {"x": text}]})
    assert not set(out) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(out) == {"k" + text: [text, {"x": text}]}


def test_script_json_makes_non_finite_numbers_null():
    assert json.loads(page.script_json({"a": float("nan"), "b": [float("inf")], "c": (1, 2)})) \
        == {"a": None, "b": [None], "c": [1, 2]}


def test_page_has_csp_hash_of_its_only_script_and_nothing_remote():
    html = page.render_page({"format": "x", "note": HOSTILE_STRINGS[0]})
    assert html.count("<script") == 2 and html.lower().count("</script") == 2
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html)
    assert csp
    for part in ("default-src 'none'", "style-src 'unsafe-inline'", "img-src data:",
                 "connect-src 'self'"):
        assert part in csp.group(1)
    script = APP_RE.search(html).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp.group(1)
    assert html.index("Content-Security-Policy") < html.index("<script")
    # no remote resources: only the SVG namespace is an http URL, and no src/href but data:
    urls = set(re.findall(r"https?://[^\s\"'`)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert re.findall(r'(?:src|href)="([^"]*)"', html) == ["data:,"]


def test_script_never_writes_html():
    script = APP_RE.search(page.render_page({})).group(1)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "setTimeout(\"", "srcdoc", "DOMParser"):
        assert sink not in script, sink


def test_report_embeds_hostile_run_inertly(run, report_html):
    html = report_html
    assert html.count("<script") == 2 and html.lower().count("</script") == 2
    for text in HOSTILE_STRINGS:
        assert text not in html
    bundle = json.loads(DATA_RE.search(html).group(1))
    assert bundle["format"] == "spadekit-report/1" and bundle["rounds"]
    hostile = [d for d in bundle["details"].values() if HOSTILE_MARK in (d["env"]["code"] or "")]
    assert len(hostile) == 1
    env = hostile[0]["env"]
    for text in HOSTILE_STRINGS:  # verbatim after parsing: escaping is the DOM's job
        assert text in env["code"] and text in env["hint"]
    assert bundle["episodes"], "sample episodes are embedded"


def test_report_cli_writes_file(run, tmp_path):
    out = tmp_path / "sub" / "r.html"
    res = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--max-episodes", "1"])
    assert res.exit_code == 0, res.output
    assert out.is_file() and str(out.name) in res.output and "KiB" in res.output
    assert DATA_RE.search(out.read_text()) and not list(out.parent.glob(".*.tmp"))
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    res = CliRunner().invoke(app, ["report", str(copy)])
    assert res.exit_code == 0 and (copy / "report.html").is_file()


def test_report_cli_missing_run_is_usage_error(tmp_path):
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "cannot report" in res.output


@pytest.mark.parametrize("args", [["serve"], ["serve", "RUN", "--model", "tiny"]])
def test_serve_cli_needs_exactly_one_of_run_and_model(args, tmp_path):
    args = [str(tmp_path) if a == "RUN" else a for a in args]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "usage" in res.output
    assert ("both" if len(args) > 1 else "neither") in res.output


def test_serve_cli_missing_run(tmp_path):
    res = CliRunner().invoke(app, ["serve", str(tmp_path / "nope"), "--port", "0"])
    assert res.exit_code == 2 and "cannot serve" in res.output


def test_is_loopback():
    assert all(map(server.is_loopback, ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"]))
    assert not any(map(server.is_loopback, ["0.0.0.0", "10.0.0.1", "example.com", ""]))


# -- the server -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(run, tmp_path_factory):
    """A server on a copy of the run (tests append rounds to it)."""
    copy = tmp_path_factory.mktemp("served") / "run"
    shutil.copytree(run, copy)
    started = threading.Event()
    box = {}

    def ready(srv):
        box["srv"] = srv
        started.set()

    thread = threading.Thread(target=server.serve_run, args=(copy, "127.0.0.1", 0),
                              kwargs={"ready": ready}, daemon=True)
    thread.start()
    assert started.wait(30)
    yield box["srv"]
    box["srv"].shutdown()
    thread.join(10)


def request(srv, method, path, host=None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
    try:
        conn.putrequest(method, path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.getheaders()), body
    finally:
        conn.close()


def test_server_page_and_security_headers(live):
    status, headers, body = request(live, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert b'"live":true' in body and b"</html>" in body
    status, headers, body = request(live, "HEAD", "/")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000


def test_server_api_routes(live, run):
    status, headers, body = request(live, "GET", "/api/snapshot")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    snap = json.loads(body)
    assert snap["format"] == "spadekit-report/1" and snap["environments"]
    sha = snap["environments"][0]["sha"]
    for path in (f"/api/env/{sha}", f"/api/env/{sha[:10].upper()}"):
        status, headers, body = request(live, "GET", path)
        assert status == 200 and json.loads(body)["env"]["sha"] == sha
    detail = json.loads(body)
    ep = detail["episodes"][0]["id"]
    status, _, body = request(live, "GET", f"/api/episode/{ep}")
    assert status == 200 and json.loads(body)["id"] == ep
    status, _, body = request(live, "GET", f"/api/search?q={HOSTILE_MARK}")
    hostile = json.loads(body)["shas"]
    assert status == 200 and len(hostile) == 1
    assert HOSTILE_MARK in data.env_detail(run, hostile[0])["env"]["code"]


@pytest.mark.parametrize("path,status", [
    ("/api/env/xyz", 400), ("/api/env/abc", 400), ("/api/env/" + "a" * 65, 400),
    ("/api/env/00000000", 404), ("/api/episode/-1", 400), ("/api/episode/1e3", 400),
    ("/api/episode/99999999", 404), ("/api/search", 400), ("/api/search?q=" + "x" * 201, 400),
    ("/nope", 404), ("/api/env/../../../etc/passwd", 400), ("/..%2f..%2fetc/passwd", 404),
    ("/static/../../run.sqlite", 404), ("/run.sqlite", 404), ("/favicon.ico", 204),
])
def test_server_errors_are_json_and_leak_no_paths(live, path, status):
    got, headers, body = request(live, "GET", path)
    assert got == status
    if status >= 400:
        assert headers["Content-Type"].startswith("application/json") and json.loads(body)["error"]
        assert str(live.run_dir.parent) not in body.decode()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_server_is_read_only(live, method):
    status, headers, _ = request(live, method, "/api/snapshot")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_server_rejects_foreign_host_header(live):
    assert request(live, "GET", "/api/snapshot", host="evil.example:80")[0] == 400
    assert request(live, "GET", "/api/snapshot", host=f"localhost:{live.server_address[1]}")[0] \
        == 200


def test_server_internal_error_hides_details(live, monkeypatch):
    def boom(_run):
        raise RuntimeError(f"secret {live.run_dir.resolve()} /home/someone")

    monkeypatch.setattr(data, "snapshot", boom)
    monkeypatch.setattr(live, "db_state", lambda: ("changed",))
    status, _, body = request(live, "GET", "/api/snapshot")
    assert status == 500 and json.loads(body) == {"error": "internal error (RuntimeError)"}


def test_server_follows_new_rounds(live):
    before = json.loads(request(live, "GET", "/api/snapshot")[2])
    step = before["run"]["latest_step"] + 1
    with RunStore(live.run_dir) as store, store.round(step):
        store.log_metrics(step, {"agent_mean_return": 0.75, "regret": 0.125})
    after = json.loads(request(live, "GET", "/api/snapshot")[2])
    assert after["run"]["rounds_completed"] == before["run"]["rounds_completed"] + 1
    assert after["rounds"][-1]["step"] == step
    assert after["rounds"][-1]["metrics"]["agent_mean_return"] == 0.75


def _reset_after(live, sent: bytes, answer_begun: bool) -> None:
    """Send ``sent``, wait (for the first bytes of the answer, or a moment), close with a TCP
    reset as a closed tab or a killed client does, and wait until the server has counted it."""
    import socket
    import time

    from test_dashboard_disconnects import reset, wait_for

    before = live.disconnects
    sock = socket.create_connection(("127.0.0.1", live.server_address[1]))
    sock.sendall(sent)
    if answer_begun:
        assert sock.recv(1024).startswith(b"HTTP/1.")
    else:
        time.sleep(0.2)
    reset(sock)
    wait_for(lambda: live.disconnects != before, seconds=30)
    assert live.disconnects == before + 1


def test_server_counts_a_client_that_resets_and_prints_nothing(live, capfd):
    """A browser tab closed mid-request (a TCP reset) is counted, not a traceback."""
    _reset_after(live, b"GET /api/snap", answer_begun=False)
    assert request(live, "GET", "/api/snapshot")[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_server_counts_a_client_that_resets_while_its_answer_is_written(live, monkeypatch, capfd):
    """The closed tab of a long answer: the write fails, the count goes up, nothing prints."""
    monkeypatch.setattr(data, "snapshot", lambda _run: {"big": "x" * (64 << 20)})
    monkeypatch.setattr(live, "db_state", lambda: ("big",))
    _reset_after(live, b"GET /api/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 answer_begun=True)
    monkeypatch.undo()
    assert request(live, "GET", "/api/snapshot")[0] == 200
    assert "Traceback" not in capfd.readouterr().err
