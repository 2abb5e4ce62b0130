"""A generation server lost while a run follows it, from both sides of the wire.

Run level (``extra("vllm")``): self-play generating through ``spadekit serve --model smollm2-135m
--allow-weight-updates`` (``generation_model=openai:smollm2-135m@URL``, the run training the same
model with LoRA, so its pushes fit) whose server is frozen, killed, or killed and restarted at the
same address while round 1 runs. Each ends in a typed ``EngineLost`` naming the server within a
bounded time, with round 0 committed and nothing of round 1; a resume against a server at that
address completes the run. The runs are ``benchmarks/chaos.py``'s (real sandboxes and database).
Client level: pushes to a stand-in that answers vLLM's routes as vLLM does, then freezes, breaks
off, answers anything at all, or is another server instance. And (``extra("vllm")``) vLLM's
EngineCore in its own process killed or frozen in the middle of a generation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.policy.openai_backend import OpenAIPolicy  # noqa: E402
from spadekit.policy.openai_wire import EngineLost  # noqa: E402
from spadekit.train.weight_sync import WeightSyncError, push_weights  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402
import prefork  # noqa: E402

chaos.POPEN = prefork.popen  # the run's processes fork from preloaded interpreters

SRC = str(ROOT / "src")
KEY = "generation-faults-" + os.urandom(8).hex()
ROUNDS = 2
TIMEOUT = 60
"""``SPADEKIT_OPENAI_TIMEOUT`` of the runs: a CPU server on a loaded machine needs seconds."""
LIMIT = 420
"""Seconds a run may take to give up once its server is lost (never a hang)."""


# -- the client against a stand-in server -------------------------------------------------------

ROUTES = ("/version", "/v1/models", "/collective_rpc", "/reset_prefix_cache", "/metrics")
"""What a push asks of vLLM's server (dev mode), in the order it asks."""


class _Standin(BaseHTTPRequestHandler):
    """vLLM's OpenAI server as a push and a generation see it (behind the API key, as
    ``spadekit serve`` starts it), until ``mode`` makes ``route`` (None: every route)
    misbehave; ``instance`` is its process start time."""

    mode = "ok"
    route: str | None = None
    raw = b""
    instance = "1700000000.25"
    release = threading.Event()
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _answer(self, path: str) -> tuple[int, bytes]:
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return 401, b'{"error": {"message": "missing or wrong API key", "code": 401}}'
        body = {"/version": {"version": "0.32.0"},
                "/v1/models": {"object": "list", "data": [{
                    "id": "tiny", "object": "model", "root": "/nonexistent/standin-model",
                    "max_model_len": 2048}]},
                "/collective_rpc": {"results": ["1"]},
                "/reset_prefix_cache": {"success": True},
                "/v1/completions": {"choices": [{
                    "text": "a", "token_ids": [97], "finish_reason": "stop",
                    "logprobs": {"token_logprobs": [-0.5], "tokens": ["token_id:97"]}}]},
                }.get(path)
        if path == "/metrics":
            return 200, (f"# TYPE process_start_time_seconds gauge\n"
                         f"process_start_time_seconds {type(self).instance}\n").encode()
        if body is None:
            return 404, b'{"detail": "Not Found"}'
        return 200, json.dumps(body).encode()

    def _handle(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        if self.route in (None, path):
            if self.mode == "frozen":
                self.release.wait(120)
                self.close_connection = True
                return
            if self.mode == "raw":
                self.wfile.write(self.raw)
                self.close_connection = True
                return
        status, data = self._answer(path)
        self._send(status, data, "text/plain" if path == "/metrics" else "application/json")

    do_GET = do_POST = _handle


@pytest.fixture
def standin(tmp_path, monkeypatch):
    monkeypatch.setenv("SPADEKIT_VLLM_PUSH_DIR", str(tmp_path / "pushes"))
    handler = type("Handler", (_Standin,), {"release": threading.Event()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def _client(url: str) -> OpenAIPolicy:
    return OpenAIPolicy("tiny", base_url=url, api_key=KEY, probe=False, timeout=1.0, retries=1)


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


def test_a_push_to_a_frozen_server_is_a_typed_error_within_the_timeout(standin):
    """Frozen before the first push (its ``/version`` is asked) or between two pushes (its
    ``/metrics``: is it still the server pushed to?): a typed error naming the server within
    seconds, not ten minutes per weight call."""
    handler, url = standin
    handler.mode = "frozen"
    exc = _within(30, lambda: push_weights(_client(url), WEIGHTS, verify=False))
    assert isinstance(exc, WeightSyncError) and url in str(exc), repr(exc)
    handler.mode = "ok"
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    handler.mode = "frozen"
    exc = _within(30, lambda: push_weights(policy, WEIGHTS, verify=False))
    assert isinstance(exc, EngineLost) and url in str(exc), repr(exc)


def test_a_push_whose_answer_breaks_off_is_engine_lost_naming_the_server(standin):
    """The reload's answer breaks off: whether the weights were loaded is unknown, so the
    engine is lost (``EngineLost``, a ``WeightSyncError``), not merely refused."""
    handler, url = standin
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    handler.mode, handler.route, handler.raw = "raw", "/collective_rpc", (
        b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\n{\"results\"")
    with pytest.raises(EngineLost, match=re.escape(url)):
        push_weights(policy, WEIGHTS, verify=False)


def _http(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        status, len(body)) + body


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["data", "root", "id", "results", "success", "version"])
        | st.text(max_size=4), inner, max_size=3), max_leaves=8)
"""JSON of any shape, with the field names of vLLM's answers."""


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example("/v1/models", _http(200, b'{"data": 5}'))  # a model list that is not a list
@given(st.sampled_from(ROUTES), st.one_of(
    st.binary(max_size=300),
    st.builds(_http, st.integers(100, 999), st.binary(max_size=100)),
    st.builds(lambda value: _http(200, json.dumps(value).encode()), _JSON)))
def test_whatever_a_server_answers_a_push_the_error_is_typed(standin, route, raw):
    """One of the routes a push asks answers anything at all; two pushes (the second asks
    whether the server is still the one pushed to): they succeed or raise a typed error."""
    handler, url = standin
    handler.mode, handler.route, handler.raw = "raw", route, raw
    policy = _client(url)
    try:
        push_weights(policy, WEIGHTS, verify=False)
        push_weights(policy, WEIGHTS, verify=False)
    except SpadekitError:
        pass
    finally:
        policy.close()


def test_generations_lost_after_a_push_fail_every_later_call_at_once(standin):
    handler, url = standin
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    assert policy.generate(REQUEST)[0].token_ids == [97]  # the pushed server answers
    handler.mode, handler.route = "frozen", "/v1/completions"
    with pytest.raises(EngineLost, match=re.escape(url)):
        policy.generate(REQUEST)
    handler.mode = "ok"  # answering again does not make the lost generations good
    t = time.monotonic()
    for call in (lambda: policy.generate(REQUEST),
                 lambda: push_weights(policy, WEIGHTS, verify=False)):
        with pytest.raises(EngineLost, match="no answer within"):
            call()
    assert time.monotonic() - t < 5


def test_another_server_instance_at_the_address_is_engine_lost(standin):
    handler, url = standin
    policy = _client(url)
    push_weights(policy, WEIGHTS, verify=False)
    policy.generate(REQUEST)
    handler.instance = "1700000999.5"  # restarted: the pushed weights are gone
    with pytest.raises(EngineLost, match="restarted"):
        policy.generate(REQUEST)
    with pytest.raises(EngineLost):
        push_weights(policy, WEIGHTS, verify=False)
    fresh = _client(url)  # a push to the same server instance throughout stays good
    push_weights(fresh, WEIGHTS, verify=False)
    push_weights(fresh, WEIGHTS, verify=False)
    assert fresh.generate(REQUEST)[0].token_ids == [97] and fresh.lost is None


def test_a_server_that_was_never_pushed_to_is_not_watched(standin):
    """Generation only (evaluation, a frozen designer): a timeout is the request's, as before."""
    from spadekit.policy.openai_wire import ServerTimeout

    handler, url = standin
    policy = _client(url)
    handler.mode, handler.route = "frozen", "/v1/completions"
    with pytest.raises(ServerTimeout) as info:
        policy.generate(REQUEST)
    assert not isinstance(info.value, EngineLost)
    handler.mode = "ok"
    assert policy.generate(REQUEST)[0].token_ids == [97]


def test_the_timeout_comes_from_the_environment_and_a_bad_one_is_refused(standin, monkeypatch):
    """``generation_model=openai:...`` has no option of its own for it: the environment sets it."""
    from spadekit.policy.base import PolicyError

    _handler, url = standin
    monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", "2.5")
    assert OpenAIPolicy("tiny", base_url=url, probe=False).timeout == 2.5
    for bad in ("soon", "-1", "inf"):
        monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", bad)
        with pytest.raises(PolicyError, match="SPADEKIT_OPENAI_TIMEOUT"):
            OpenAIPolicy("tiny", base_url=url, probe=False)


# -- vLLM's engine in another process -----------------------------------------------------------

VLLM_SCRIPT = r'''
import json, os, sys, threading, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the EngineCore in a child process
os.environ["SPADEKIT_VLLM_TIMEOUT"] = "10"
import psutil, torch
from spadekit.policy import load_policy
from spadekit.policy.base import GenerationRequest, SamplingParams
from spadekit.train.weight_sync import push_weights

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


# -- a real server, a real run ------------------------------------------------------------------

WATCHDOG = """
import os, signal, subprocess, sys, time
server = subprocess.Popen(sys.argv[2:])
while server.poll() is None:
    if os.getppid() != int(sys.argv[1]):  # pytest is gone, without its teardown
        os.killpg(0, signal.SIGKILL)
    time.sleep(1)
sys.exit(server.returncode)
"""


class Served:
    """``spadekit serve --model smollm2-135m --allow-weight-updates`` (key file 0600) at one
    loopback port, in its own process group (the CLI, vLLM, its engine) under a watchdog that
    kills the group when pytest dies; the module's tests hand it on from one to the next."""

    def __init__(self, work: Path) -> None:
        self.work, self.proc, self.starts = work, None, 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.key_file = work / "key"
        self.key_file.write_text(KEY + "\n")
        self.key_file.chmod(0o600)

    def up(self) -> bool:
        self.signal(signal.SIGCONT)
        try:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(urllib.request.Request(
                    self.url[:-3] + "/version", headers={"Authorization": f"Bearer {KEY}"}),
                    timeout=5):
                return True
        except OSError:
            return False

    def start(self) -> None:
        """A new server at the port (a previous one is killed first); returns once it answers."""
        self.kill()
        log = self.work / f"server-{self.starts}.log"
        self.starts += 1
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
        env.pop("SPADEKIT_API_KEY", None)
        argv = [sys.executable, "-m", "spadekit", "serve", "--model", "smollm2-135m",
                "--allow-weight-updates", "--api-key-file", str(self.key_file),
                "--port", str(self.port),
                "--vllm-args", f"--max-model-len 2048 --kv-cache-memory-bytes {1 << 30}"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), *argv],
                                         stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + 600
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail("spadekit serve did not start:\n"
                            + log.read_text(errors="replace")[-3000:])
            time.sleep(1)

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """The whole group killed; returns once nothing listens at the port."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.5)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(tmp_path_factory.mktemp("vllm-serve"))
    yield server
    server.kill()
    shutil.rmtree(server.work, ignore_errors=True)  # pushed weights: 0.5 GB a file


def _episodes_of(run: Path, step: int) -> int:
    with sqlite3.connect(run / "run.sqlite") as db:
        return db.execute("SELECT count(*) FROM episodes WHERE step >= ?", (step,)).fetchone()[0]


def _round_0_then(run: Path, served: Served, fault: str, k: int) -> dict:
    """A run of ``ROUNDS`` rounds generating through ``served`` (``rollout.max_staleness=k``);
    once round 0 is committed the run is paused, ``fault`` is done to the server, and the run
    goes on; how it ended."""
    extra = [*chaos.BUNDLED, "envs_per_round=1", "num_generations=2",
             f"generation_model=openai:smollm2-135m@{served.url}", f"rollout.max_staleness={k}"]
    proc = chaos.start(run, ROUNDS, extra=extra)
    try:
        line = proc.stdout.readline()
        assert json.loads(line or "{}").get("done") == 0, proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGSTOP)  # round 1 has begun; nothing goes on while we act
        if fault == "frozen":  # the processes live, hold the port, and never answer
            served.signal(signal.SIGSTOP)
        elif fault == "killed":
            served.kill()
        else:  # restarted: back at the same address, without the pushed weights
            served.start()
        t = time.monotonic()
        proc.send_signal(signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the run hung after the server fault: {err[-3000:]}")
        elapsed = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"rc": proc.returncode, "err": err, "out": out, "elapsed": elapsed, "extra": extra}


@pytest.mark.extra("vllm")
@pytest.mark.parametrize("fault,k", [("frozen", 0), ("killed", 0), ("restarted", 1)])
def test_a_generation_server_lost_mid_round_is_engine_lost_and_the_round_rolls_back(
        tmp_path, served, monkeypatch, fault, k):
    """Killed: the generations fail and the push after the update is refused, saying the server
    was lost. Frozen: a request waits for the timeout (``SPADEKIT_OPENAI_TIMEOUT``), not ten
    minutes per weight call. Restarted at the same address: its generations would come from
    the checkpoint's weights, not the pushed ones, silently, and round 1 would commit; its new
    process start time (``/metrics``) refuses it the same way. With ``rollout.max_staleness=1``
    the update of round 0's batch runs beside the lost generation: the round still ends in
    ``EngineLost``, and the resume trains that batch. One server start per kill."""
    monkeypatch.setenv("SPADEKIT_OPENAI_TIMEOUT", str(TIMEOUT))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the run's requests and pushes carry it
    monkeypatch.setenv("SPADEKIT_VLLM_PUSH_DIR", str(served.work / "pushes"))
    if not served.up():
        served.start()
    run = tmp_path / "run"
    result = _round_0_then(run, served, fault, k)
    err = result["err"]
    assert result["rc"] not in (0, -signal.SIGKILL), (result["out"], err[-3000:])
    assert "EngineLost" in err and served.url in err, err[-3000:]
    if fault == "restarted":
        assert "restarted" in err, err[-3000:]
    assert result["elapsed"] < LIMIT
    assert chaos.completed(run) == 1  # round 0 intact
    assert _episodes_of(run, 1) == 0  # nothing of round 1
    if not served.up():  # killed: a new server where the lost one was; frozen: it goes on
        served.start()
    again = chaos.run_through(run, ROUNDS, extra=result["extra"])
    assert again["rc"] == 0, again["stderr"]
    assert chaos.completed(run) == ROUNDS
    if k:  # every round's ledger balances; round 1 (redone) trained round 0's batch once
        with sqlite3.connect(run / "run.sqlite") as db:
            rows = db.execute("SELECT step, generated, trained, discarded, in_flight "
                              "FROM token_ledger").fetchall()
            trained = db.execute("SELECT value FROM metrics WHERE name = "
                                 "'async/samples_trained' ORDER BY step").fetchall()
        assert rows and all(g == t + d + f for _, g, t, d, f in rows)
        assert trained[0][0] == 0 and trained[1][0] > 0
