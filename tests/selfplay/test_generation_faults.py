"""The generation engine dies mid-round: self-play generating through a separate
``spadekit serve --allow-weight-updates`` server (``generation_model=openai:tiny@URL``) whose
process is killed, killed and restarted at the same address, or frozen while round 1 runs. Each
ends in a typed ``EngineLost`` naming the server within a bounded time (never a hang), with round
0 committed and nothing of round 1, and a resume against a new server completes the run.

The runs are ``benchmarks/chaos.py``'s (the tiny model, really trained; a scripted designer; real
sandboxes; a real run database). Below them, the client against a fake server that freezes,
breaks off or garbles its answers, or is another server instance than the one pushed to; and
vLLM's EngineCore in its own process killed or frozen in the middle of a generation (skipped
without vLLM).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.policy.openai_backend import OpenAIPolicy  # noqa: E402
from spadekit.policy.openai_wire import EngineLost  # noqa: E402
from spadekit.policy.weight_sync import WeightSyncError, push_weights  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402
import prefork  # noqa: E402

chaos.POPEN = prefork.popen  # the run's processes fork from preloaded interpreters

SRC = str(ROOT / "src")
TOKEN = "generation-faults-token"


# -- a real server, a real run ------------------------------------------------------------------

def _server(tmp: Path, port: int = 0) -> tuple[subprocess.Popen, int]:
    """``spadekit serve --model tiny --allow-weight-updates`` on loopback; (process, port)."""
    token = tmp / "token"
    if not token.exists():
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
    proc = prefork.popen(
        [sys.executable, "-m", "spadekit", "serve", "--model", "tiny", "--allow-weight-updates",
         "--weights-token-file", str(token), "--port", str(port)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": SRC})
    line = proc.stderr.readline()  # "spadekit: serving tiny at http://127.0.0.1:PORT/v1 ..."
    found = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    if not found:
        proc.kill()
        raise AssertionError(f"the server did not start: {line}{proc.stderr.read()}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never a full pipe
    return proc, int(found.group(1))


def _episodes_of(run: Path, step: int) -> int:
    with sqlite3.connect(run / "run.sqlite") as db:
        return db.execute("SELECT count(*) FROM episodes WHERE step >= ?", (step,)).fetchone()[0]


@pytest.fixture
def servers():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def _round_0_then(tmp_path: Path, servers: list, monkeypatch, fault, k: int = 0
                  ) -> tuple[dict, Path, int]:
    """A 3-round run generating through a server (``rollout.max_staleness=k``); once round 0
    is committed the run is paused, ``fault(server, port)`` is done to the server, and the run
    goes on; how it ended."""
    monkeypatch.setenv("SPADEKIT_WEIGHTS_TOKEN", TOKEN)  # the run's pushes carry it
    server, port = _server(tmp_path)
    servers.append(server)
    run = tmp_path / "run"
    spec = f"generation_model=openai:tiny@http://127.0.0.1:{port}/v1"
    proc = chaos.start(run, 3, extra=[spec, f"rollout.max_staleness={k}"])
    try:
        line = proc.stdout.readline()
        assert json.loads(line or "{}").get("done") == 0, proc.stderr.read()
        proc.send_signal(signal.SIGSTOP)  # round 1 has begun; nothing goes on while we act
        servers.extend(fault(server, port) or [])
        t = time.monotonic()
        proc.send_signal(signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=120)  # generous: it takes seconds
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the run hung after the server fault: {err[-3000:]}")
        elapsed = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"rc": proc.returncode, "err": err, "out": out, "elapsed": elapsed, "spec": spec}, \
        run, port


def _killed(tmp_path):
    def fault(server, port):
        server.kill()
        server.wait()
    return fault


def _restarted(tmp_path):
    def fault(server, port):  # back at once, at the same address, without the pushed weights
        server.kill()
        server.wait()
        return [_server(tmp_path, port)[0]]
    return fault


def _frozen(tmp_path):
    def fault(server, port):  # the process lives, holds its port, and never answers
        server.send_signal(signal.SIGSTOP)
    return fault


@pytest.mark.parametrize("fault,k", [("killed", 0), ("restarted", 0), ("frozen", 0),
                                     ("killed", 1), ("frozen", 1)])
def test_a_generation_server_lost_mid_round_is_engine_lost_and_the_round_rolls_back(
        tmp_path, servers, monkeypatch, fault, k):
    """Killed: the generations fail and the push after the update is refused, saying the server
    was lost (not that a push could not be undone). Restarted at the same address: its
    generations would come from other weights than the pushed ones, silently, and round 1 would
    commit; it must be refused the same way. Frozen: every request waits for the timeout
    (``SPADEKIT_OPENAI_TIMEOUT``, 5 s here), not ten minutes per weight call. With
    ``rollout.max_staleness=1`` the update of round 0's batch runs beside the lost
    generation: the round still ends in ``EngineLost``, and the resume trains that batch."""
    monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", "5")
    make = {"killed": _killed, "restarted": _restarted, "frozen": _frozen}[fault]
    result, run, port = _round_0_then(tmp_path, servers, monkeypatch, make(tmp_path), k)
    err = result["err"]
    assert result["rc"] not in (0, -signal.SIGKILL), (result["out"], err[-3000:])
    assert "EngineLost" in err and f"http://127.0.0.1:{port}/v1" in err, err[-3000:]
    assert result["elapsed"] < 120
    assert chaos.completed(run) == 1  # round 0 intact
    assert _episodes_of(run, 1) == 0  # nothing of round 1
    if fault != "restarted":  # a new server where the lost one was
        old = servers.pop(0)
        if old.poll() is None:
            os.kill(old.pid, signal.SIGCONT)
            old.kill()
            old.wait()
        servers.append(_server(tmp_path, port)[0])
    again = chaos.run_through(run, 3, extra=[result["spec"], f"rollout.max_staleness={k}"])
    assert again["rc"] == 0, again["stderr"]
    assert chaos.completed(run) == 3
    if k:  # every round's ledger balances; round 1 (redone) trained round 0's batch once
        with sqlite3.connect(run / "run.sqlite") as db:
            rows = db.execute("SELECT step, generated, trained, discarded, in_flight "
                              "FROM token_ledger").fetchall()
            trained = db.execute("SELECT value FROM metrics WHERE name = "
                                 "'async/samples_trained' ORDER BY step").fetchall()
        assert rows and all(g == t + d + f for _, g, t, d, f in rows)
        assert trained[0][0] == 0 and trained[1][0] > 0


# -- the client against a fake server ---------------------------------------------------------

class _Fake(BaseHTTPRequestHandler):
    """A ``spadekit serve`` stand-in: ``mode`` says how its weights route (and, for
    ``generation``, its completions) answer; ``instance`` is the server instance it claims."""

    mode = "ok"
    raw = b""
    instance = "first"
    release = threading.Event()
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _misbehave(self) -> bool:
        if self.mode == "frozen":
            self.release.wait(120)
            self.close_connection = True
            return True
        if self.mode == "raw" or (self.mode == "raw_post" and self.command == "POST"):
            self.wfile.write(self.raw)
            self.close_connection = True
            return True
        return False

    def do_GET(self):
        if self.path == "/version":
            self.send_error(404)
        elif self.path.endswith("/spadekit/weights"):
            if not self._misbehave():
                self._json({"weight_updates": True, "restore": True, "version": 1,
                            "updates": 1, "max_request_bytes": 1 << 30,
                            "instance": type(self).instance})
        else:
            self.send_error(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path.endswith("/completions"):
            if self.mode == "generation_frozen":
                self.release.wait(120)
                self.close_connection = True
                return
            self._json({"choices": [{"text": "a", "token_ids": [97],
                                     "logprobs": {"token_logprobs": [-0.5],
                                                  "tokens": ["token_id:97"]},
                                     "finish_reason": "stop"}]})
        elif not self._misbehave():
            self._json({"loaded": 1, "version": 2, "bytes": length, "seconds": 0.0,
                        "instance": type(self).instance})


@pytest.fixture
def fake():
    handler = type("Handler", (_Fake,), {"release": threading.Event(), "mode": "ok"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def _client(url: str) -> OpenAIPolicy:
    return OpenAIPolicy("tiny", base_url=url, probe=False, timeout=1.0, retries=1,
                        backoff=0.05, weights_token=TOKEN)


WEIGHTS = {"w": torch.zeros(4)}
REQUEST = [GenerationRequest(prompt_ids=[1, 2], params=SamplingParams(max_new_tokens=1))]


def _within(seconds: float, call) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised (None if none), or a failure when it
    has not returned within ``seconds``."""
    box: dict = {}

    def target():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return box.get("exc")


def test_a_frozen_server_during_a_push_is_a_typed_error_within_the_timeout(fake):
    handler, url = fake
    policy = _client(url)
    handler.mode = "frozen"
    exc = _within(30, lambda: push_weights(policy, WEIGHTS, verify=False))  # was 10 minutes
    assert isinstance(exc, WeightSyncError) and url in str(exc), repr(exc)


def test_a_push_whose_answer_breaks_off_is_a_typed_error_naming_the_server(fake):
    handler, url = fake
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    handler.mode, handler.raw = "raw_post", (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n"
                                        b"Connection: close\r\n\r\n{\"loaded\"")
    with pytest.raises(WeightSyncError, match=re.escape(url)):
        push_weights(policy, WEIGHTS, verify=False)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda status, body: b"HTTP/1.1 %d X\r\n\r\n" % status + body,
                           st.integers(100, 999), st.binary(max_size=100))))
def test_whatever_a_server_answers_a_push_the_error_is_typed(fake, raw):
    handler, url = fake
    policy = _client(url)
    policy._vllm_server = False  # asked once, as after a first push
    handler.mode, handler.raw = "raw", raw
    try:
        push_weights(policy, WEIGHTS, verify=False)
    except SpadekitError:
        pass


def test_generations_lost_after_a_push_fail_every_later_call_at_once(fake):
    handler, url = fake
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    assert policy.generate(REQUEST)[0].token_ids == [97]  # the pushed server answers
    handler.mode = "generation_frozen"
    with pytest.raises(EngineLost, match=re.escape(url)):
        policy.generate(REQUEST)
    handler.mode = "ok"  # answering again does not make the lost generations good
    t = time.monotonic()
    for call in (lambda: policy.generate(REQUEST),
                 lambda: push_weights(policy, WEIGHTS, verify=False)):
        with pytest.raises(EngineLost, match="no answer within"):
            call()
    assert time.monotonic() - t < 5


def test_another_server_instance_at_the_address_is_engine_lost(fake):
    handler, url = fake
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    policy.generate(REQUEST)
    handler.instance = "second"  # restarted: the pushed weights are gone
    with pytest.raises(EngineLost, match="restarted"):
        policy.generate(REQUEST)
    with pytest.raises(EngineLost):
        push_weights(policy, WEIGHTS, verify=False)


def test_a_server_that_was_never_pushed_to_is_not_watched(fake):
    """Generation only (evaluation, a frozen designer): a timeout is the request's, as before."""
    from spadekit.policy.openai_wire import ServerTimeout

    handler, url = fake
    policy = _client(url)
    handler.mode = "generation_frozen"
    with pytest.raises(ServerTimeout) as info:
        policy.generate(REQUEST)
    assert not isinstance(info.value, EngineLost)
    handler.mode = "ok"
    assert policy.generate(REQUEST)[0].token_ids == [97]


# -- vLLM's engine in another process -----------------------------------------------------------

VLLM_SCRIPT = r'''
import json, os, sys, threading, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the EngineCore in a child process
os.environ["SPADEKIT_VLLM_TIMEOUT"] = "10"
import psutil, torch
from spadekit.policy import load_policy
from spadekit.policy.base import GenerationRequest, SamplingParams
from spadekit.policy.weight_sync import push_weights

mode = sys.argv[1]
policy = load_policy("vllm:smollm2-135m", seed=0)
short = [GenerationRequest(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=2))]
assert policy.generate(short)[0].token_ids
kids = psutil.Process().children(recursive=True)
core = [p for p in kids if "EngineCore" in p.name()]
assert core, [p.name() for p in kids]
long = [GenerationRequest(prompt_ids=[1, 2, 3],
                          params=SamplingParams(max_new_tokens=4000, temperature=1.0))
        for _ in range(4)]

def fault():
    time.sleep(3)  # inside the long generation
    for p in core:
        p.kill() if mode == "killed" else p.suspend()

def timed(call):
    box = {}
    def target():
        try:
            call()
        except BaseException as exc:
            box["exc"] = exc
    t = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(90)
    exc = box.get("exc")
    return {"returned": not thread.is_alive(), "s": round(time.monotonic() - t, 1),
            "error": type(exc).__name__ if exc else None, "message": str(exc)[:400]}

threading.Thread(target=fault, daemon=True).start()
result = {"generate": timed(lambda: policy.generate(long))}
result["again"] = timed(lambda: policy.generate(short))
result["push"] = timed(lambda: push_weights(policy, {"model.norm.weight": torch.ones(576)},
                                            verify=False))
print("RESULT " + json.dumps(result), flush=True)
for p in psutil.Process().children(recursive=True):
    try:
        p.resume()
        p.kill()
    except psutil.Error:
        pass
os._exit(0)
'''


@pytest.mark.extra("vllm")
@pytest.mark.parametrize("mode", ["killed", "frozen"])
def test_a_vllm_engine_process_lost_mid_generation_is_engine_lost_not_a_hang(mode):
    """vLLM's EngineCore in its own process, killed (or frozen) in the middle of a generation:
    vLLM alone waits for its outputs forever; the generation must end in ``EngineLost`` naming
    the engine (frozen: after ``SPADEKIT_VLLM_TIMEOUT``, 10 s here), and the next generation and
    the weight push after it must fail the same way at once. One engine start (~40 s) each."""
    proc = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, mode], capture_output=True,
                          text=True, timeout=500, env={**os.environ, "PYTHONPATH": SRC})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, (proc.stdout[-2000:], proc.stderr[-3000:])
    # vLLM's own logs go to stderr: stdout is the program's (a --json command's document)
    assert [x for x in proc.stdout.splitlines() if x.strip()] == lines, proc.stdout[-2000:]
    result = json.loads(lines[-1][len("RESULT "):])
    for step in ("generate", "again", "push"):
        got = result[step]
        assert got["returned"], (step, result)  # not still waiting after 90 s
        assert got["error"] == "EngineLost" and "vllm:" in got["message"], (step, result)
    assert result["again"]["s"] < 5 and result["push"]["s"] < 5


def test_the_timeout_comes_from_the_environment_and_a_bad_one_is_refused(fake, monkeypatch):
    """``generation_model=openai:...`` has no option of its own for it: the environment sets it."""
    from spadekit.policy.base import PolicyError

    _handler, url = fake
    monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", "2.5")
    assert OpenAIPolicy("tiny", base_url=url, probe=False).timeout == 2.5
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", bad)
        with pytest.raises(PolicyError, match="SPADEKIT_OPENAI_TIMEOUT"):
            OpenAIPolicy("tiny", base_url=url, probe=False)
