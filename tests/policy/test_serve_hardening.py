"""``spadekit serve`` against hostile or careless clients (issue 25, items 8 and 9).

Real servers on ephemeral loopback ports with the tiny model, real clients: raw sockets for
malformed framing, ``http.client`` for malformed bodies, the official ``openai`` client where
it is installed. What is checked:

- framing: a negative, signed or disagreeing ``Content-Length`` is 400 and never read "until
  the end"; no ``Content-Length`` or any ``Transfer-Encoding`` is 411; over ``max_body`` 413;
- fields: every bad input found on the old server (500s, and wrong types it took) is a 400 with
  an OpenAI-style error body; an unknown model 404; ``max_tokens`` above the server's limit
  400; random JSON bodies never give a 500 (hypothesis, at the decoder and over HTTP);
- fairness: a long request does not hold a short one from another client; sliced generation is
  the same greedy continuation, stop strings across a slice boundary are found, and a weight
  update waits for a sequence under way;
- exposure: the servers bind loopback by default, refuse a non-loopback address without an API
  key (model server, dashboard and the command), and with a key answer 401 without it; secrets
  on the command line are refused.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import GenerationRequest, PolicyError, SamplingParams  # noqa: E402
from spadekit.policy.serve import PolicyServer, serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "k3y-for-tests-only"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def server(tiny):
    with serve(tiny, model_name="tiny") as srv:
        yield srv


def post(srv, path, body, headers=None, timeout=60):
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json",
                                                      **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data.startswith(b"{") else data
    finally:
        conn.close()


def get(srv, path, headers=None):
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def raw_exchange(srv, head: bytes, body: bytes = b"", close_write: bool = True) -> bytes:
    """Send a hand-written request; the answer's bytes (until the server closes)."""
    with socket.create_connection((srv.host, srv.port), timeout=60) as s:
        s.sendall(head + body)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                part = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not part:
                break
            chunks.append(part)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def error_body(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def assert_client_error(status, body, want=400, param=None):
    assert status == want, body
    assert body["object"] == "error" and isinstance(body["error"]["message"], str)
    assert body["error"]["type"] != "server_error" and body["error"]["code"] == want
    if param is not None:
        assert body["error"]["param"] == param


GOOD = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()


# -- framing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths", [
    lambda n: ["-1"], lambda n: [f"+{n}"], lambda n: [f"{n // 10}_{n % 10}"],
    lambda n: [str(n), "99"]], ids=["negative", "signed", "underscore", "two"])
def test_content_length_must_be_one_plain_number(server, lengths):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for value in lengths(len(GOOD)):
        head += f"Content-Length: {value}\r\n".encode()
    answer = raw_exchange(server, head + b"\r\n", GOOD)
    assert status_of(answer) == 400, answer[:300]  # the old server answered 200
    assert "Content-Length" in error_body(answer)["message"]


def test_negative_length_does_not_read_a_huge_body(server):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
    with socket.create_connection((server.host, server.port), timeout=60) as s:
        s.sendall(head)
        s.settimeout(30)
        answer = s.recv(4096)  # answered before any body was sent (the old server waited)
    assert status_of(answer) == 400


@pytest.mark.parametrize("extra", [b"", b"Transfer-Encoding: gzip\r\nContent-Length: %d\r\n"])
def test_no_length_or_a_transfer_encoding_is_411(server, extra):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + (extra.replace(
        b"%d", str(len(GOOD)).encode()) if extra else b"") + b"\r\n"
    answer = raw_exchange(server, head, GOOD if extra else b"")
    assert status_of(answer) == 411, answer[:300]
    assert error_body(answer)["type"] == "invalid_request_error"


def test_a_body_over_max_body_is_413_unread(tiny):
    with serve(tiny, max_body=1024) as srv:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n"
        answer = raw_exchange(srv, head, b"", close_write=False)
        assert status_of(answer) == 413
        status, out = post(srv, "/v1/completions", {"prompt": "a" * 900, "max_tokens": 1})
        assert status == 200


# -- fields -------------------------------------------------------------------------------------

BAD_BODIES = {
    # 500 on the old server
    "content part text null": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "messages"),
    "content part text a number": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
    "max_tokens 1e400": ("/v1/completions", b'{"prompt": "a", "max_tokens": 1e400}',
                         "max_tokens"),
    "max_tokens Infinity": ("/v1/completions", b'{"prompt": "a", "max_tokens": Infinity}', None),
    "seed over 64 bits": ("/v1/completions", {"prompt": "a", "max_tokens": 2, "seed": 2 ** 64},
                          "seed"),
    "nested too deeply": ("/v1/completions", b"[" * 200000 + b"]" * 200000, None),
    # taken by the old server although of the wrong type
    "logprobs a string": ("/v1/completions", {"prompt": "a", "max_tokens": 2, "logprobs": "x"},
                          "logprobs"),
    "top_logprobs a string": ("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": "x"},
        "top_logprobs"),
    "stream_options a list": ("/v1/completions", {
        "prompt": "a", "max_tokens": 2, "stream": True, "stream_options": []}, "stream_options"),
    "model a number": ("/v1/completions", {"prompt": "a", "max_tokens": 2, "model": 5}, "model"),
    "stream a string": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                                 "stream": "yes"}, "stream"),
    "n times prompts": ("/v1/completions", {"prompt": ["a"] * 20, "n": 10, "max_tokens": 1},
                        "n"),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_inputs_are_400_with_an_openai_error(server, name):
    path, body, param = BAD_BODIES[name]
    status, out = post(server, path, body)
    assert_client_error(status, out, 400, param)


def test_unknown_model_is_404(server):
    status, out = post(server, "/v1/completions", {"model": "gpt-9", "prompt": "a",
                                                   "max_tokens": 2})
    assert_client_error(status, out, 404, "model")
    assert "gpt-9" in out["error"]["message"]


def test_max_tokens_over_the_limit_is_400(server):
    status, out = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 16385,
                                                   "temperature": 0}, timeout=30)
    assert_client_error(status, out, 400, "max_tokens")  # the old server generated them all
    assert "16384" in out["error"]["message"]


def test_the_openai_client_gets_typed_errors(server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60) as c:
        with pytest.raises(openai.BadRequestError) as bad:
            c.completions.create(model="tiny", prompt="a", max_tokens=2, seed=2 ** 64)
        assert "seed" in str(bad.value)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="tiny", max_tokens=2, messages=[
                {"role": "user", "content": [{"type": "text", "text": None}]}])
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="nope", prompt="a", max_tokens=2)
        ok = c.completions.create(model="tiny", prompt="a", max_tokens=3)
        assert ok.choices[0].finish_reason in ("stop", "length")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=10)
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "n", "stop", "seed", "logprobs", "top_logprobs", "stream", "stream_options",
          "echo", "suffix", "best_of", "tools", "add_special_tokens", "return_token_ids",
          "return_tokens_as_token_ids", "include_stop_str_in_output", "chat_template_kwargs"]
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]) | JSON},
                                          optional={"content": JSON | st.text(max_size=8)}),
                    max_size=3)
BODIES = st.builds(lambda fields, extra: {**fields, **extra},
                   st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8),
                   st.fixed_dictionaries({}, optional={
                       "prompt": st.text(min_size=1, max_size=6)
                       | st.lists(st.integers(-3, 300), min_size=1, max_size=4),
                       "messages": MESSAGES,
                       "max_tokens": st.integers(-2, 6)}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BODIES, st.binary(max_size=40))
def test_the_decoder_never_fails_untyped(body, raw):
    from spadekit.policy.serve_request import (Limits, RequestError, decode_chat,
                                               decode_completion, parse_json)

    limits = Limits(max_tokens=8)
    for decode in (decode_completion, decode_chat):
        try:
            out = decode(body, limits)
        except RequestError as exc:
            assert 400 <= exc.status < 500 and exc.body()["error"]["message"]
        else:
            params, n = out[-2], out[-1]
            assert isinstance(params, SamplingParams) and 1 <= params.max_new_tokens <= 8
            assert 1 <= n <= limits.max_choices
    for data in (raw, json.dumps(body).encode()):
        try:
            assert isinstance(parse_json(data), dict)
        except RequestError:
            pass


@pytest.fixture(scope="module")
def small_server(tiny):
    with serve(tiny, model_name="tiny", max_tokens_limit=4) as srv:
        yield srv


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(BODIES, st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
@example({"prompt": "0", "temperature": 2.225073858507e-311}, "/v1/completions")  # was a 500
@example({"prompt": "0", "max_tokens": 3, "top_p": 5e-324}, "/v1/completions")  # was a 500
def test_random_bodies_never_give_500(small_server, body, path):
    status, out = post(small_server, path, body)
    assert status < 500, out
    if status >= 400:
        assert out["object"] == "error" and out["error"]["type"] != "server_error"


# -- fairness -----------------------------------------------------------------------------------

def test_a_long_request_does_not_hold_a_short_one(tiny):
    with serve(tiny, model_name="tiny") as srv:
        done = {}

        def long_request():
            done["long"] = post(srv, "/v1/completions", {
                "prompt": "Once", "max_tokens": 3000, "temperature": 0}, timeout=600)
            done["long_at"] = time.monotonic()

        thread = threading.Thread(target=long_request, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while srv.stats()["batches"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, out = post(srv, "/v1/completions", {"prompt": "Hi", "max_tokens": 4,
                                                    "temperature": 0})  # another client
        short_at = time.monotonic()
        assert status == 200 and out["usage"]["completion_tokens"] >= 1
        assert thread.is_alive(), "the short request waited for the whole long one"
        thread.join(600)
        status, out = done["long"]
        assert status == 200 and out["usage"]["completion_tokens"] == 3000
        assert out["choices"][0]["finish_reason"] == "length"
        assert done["long_at"] > short_at and srv.stats()["slices"] >= 3000 // 256


def test_sliced_greedy_is_the_unsliced_continuation(tiny):
    prompt = tiny.render(CHAT)
    direct = tiny.generate([GenerationRequest(prompt_ids=prompt, params=SamplingParams(
        temperature=0, max_new_tokens=90))])[0]
    with serve(tiny, model_name="tiny", slice_tokens=16) as srv:
        status, out = post(srv, "/v1/completions", {
            "prompt": prompt, "max_tokens": 90, "temperature": 0, "logprobs": 1,
            "return_token_ids": True})
        assert srv.stats()["slices"] >= 90 // 16
    choice = out["choices"][0]
    assert status == 200 and choice["token_ids"] == direct.token_ids
    assert choice["text"] == direct.text and choice["finish_reason"] == "length"
    got = choice["logprobs"]["token_logprobs"]
    assert max(abs(a - b) for a, b in zip(got, direct.logprobs)) < 1e-4


def test_a_stop_string_across_a_slice_boundary(tiny):
    printable = set(range(33, 127))
    with serve(tiny, model_name="tiny", slice_tokens=16) as srv:
        for seed in range(300):  # a sampled text whose tokens 15 and 16 are printable
            base = {"prompt": "Once", "max_tokens": 40, "seed": seed, "return_token_ids": True}
            full = post(srv, "/v1/completions", base)[1]["choices"][0]
            ids = full["token_ids"]
            if len(ids) < 40 or not {ids[15], ids[16]} <= printable:
                continue
            stop = tiny.tokenizer.decode(ids[15:17])
            if stop in tiny.tokenizer.decode(ids[:16], skip_special_tokens=True):
                continue
            break
        else:
            pytest.skip("no seed gave a printable pair at the boundary")
        cut = post(srv, "/v1/completions", {**base, "stop": [stop]})[1]["choices"][0]
    assert cut["token_ids"] == ids[:17] and cut["finish_reason"] == "stop"
    assert cut["stop_reason"] == stop and not cut["text"].endswith(stop)


def test_a_weight_update_waits_for_a_sequence_under_way(tiny):
    pytest.importorskip("safetensors")
    from safetensors.torch import save

    from spadekit.policy.weight_sync import TOKEN_HEADER, WEIGHTS_PATH

    body = {"prompt": "Once", "max_tokens": 1200, "temperature": 0, "return_token_ids": True}
    before = tiny.generate([GenerationRequest(prompt_ids=list(tiny.tokenizer("Once")[
        "input_ids"]), params=SamplingParams(temperature=0, max_new_tokens=1200))])[0]
    served = load_policy("tiny")
    flipped = {"model.norm.weight": -served.model.state_dict()["model.norm.weight"].clone()}
    with serve(served, allow_weight_updates=True, weights_token="t0ken",
               slice_tokens=64) as srv:
        box = {}
        thread = threading.Thread(target=lambda: box.update(out=post(
            srv, "/v1/completions", body, timeout=600)), daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while srv.stats()["slices"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert thread.is_alive()
        status, answer = post(srv, WEIGHTS_PATH, save(flipped), {
            TOKEN_HEADER: "t0ken", "Content-Type": "application/octet-stream"}, timeout=600)
        thread.join(600)
        assert status == 200 and answer["loaded"] == 1
        long_ids = box["out"][1]["choices"][0]["token_ids"]
        assert long_ids == before.token_ids  # every token from the weights it started with
        after = post(srv, "/v1/completions", {**body, "max_tokens": 4})[1]
        assert after["choices"][0]["token_ids"] != before.token_ids[:4]  # the update landed


# -- exposure -----------------------------------------------------------------------------------

def test_loopback_by_default_and_no_exposure_without_a_key(tiny, tmp_path):
    from spadekit.cli.app import serve as serve_cmd
    from spadekit.report import server as dashboard

    with serve(tiny) as srv:
        assert srv.host == "127.0.0.1"
    import inspect

    assert inspect.signature(serve_cmd).parameters["host"].default.default == "127.0.0.1"
    assert inspect.signature(dashboard.serve_run).parameters["host"].default == "127.0.0.1"
    for host in ("0.0.0.0", "::", "10.1.2.3", ""):
        with pytest.raises(PolicyError, match="API key"):
            PolicyServer(tiny, host=host, port=0)
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run_before_layout", run)
    with pytest.raises(SpadekitError, match="API key"):
        dashboard.make_server(run, "0.0.0.0", 0)


def test_a_key_is_required_once_set(tiny):
    openai = pytest.importorskip("openai")
    with serve(tiny, model_name="tiny", api_key=KEY) as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": "Basic " + base64.b64encode(b"u:" + KEY.encode())
                         .decode()}):
            status, out = post(srv, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                               headers)
            assert_client_error(status, out, 401)
            assert get(srv, "/v1/models", headers)[0] == 401
        assert get(srv, "/health")[0] == 200  # liveness stays open
        good = {"Authorization": f"Bearer {KEY}"}
        assert get(srv, "/v1/models", good)[0] == 200
        assert post(srv, "/v1/completions", {"prompt": "a", "max_tokens": 1}, good)[0] == 200
        with openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.completions.create(model="tiny", prompt="a", max_tokens=1)
        with openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0) as c:
            assert c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).choices


def test_the_dashboard_asks_for_its_key(tmp_path):
    from spadekit.report import server as dashboard

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "run_before_layout", run)
    srv = dashboard.make_server(run, "127.0.0.1", 0, api_key=KEY)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        def status(headers):
            conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
            try:
                conn.request("GET", "/api/snapshot", headers=headers)
                resp = conn.getresponse()
                resp.read()
                return resp.status, resp.getheader("WWW-Authenticate") or ""
            finally:
                conn.close()

        code, challenge = status({})
        assert code == 401 and challenge.startswith("Basic")  # a browser asks for it
        assert status({"Authorization": "Bearer nope"})[0] == 401
        assert status({"Authorization": f"Bearer {KEY}"})[0] == 200
        basic = base64.b64encode(f"me:{KEY}".encode()).decode()
        assert status({"Authorization": f"Basic {basic}"})[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def _cli(args, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("SPADEKIT_API_KEY",
                                                            "SPADEKIT_WEIGHTS_TOKEN")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "spadekit", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_the_command_refuses_exposure_and_secrets_in_argv(tmp_path):
    res = _cli(["serve", "--model", "tiny", "--host", "0.0.0.0", "--port", "0"])
    assert res.returncode == 2 and "API key" in res.stderr, res.stderr
    for flag in ("--api-key", "--weights-token"):
        res = _cli(["serve", "--model", "tiny", flag, "s3cret", "--port", "0"])
        assert res.returncode == 2 and "command line" in res.stderr, res.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    res = _cli(["serve", "--model", "tiny", "--api-key-file", str(empty), "--port", "0"])
    assert res.returncode == 2 and "empty" in res.stderr


@pytest.mark.parametrize("sent", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le",        # in the head
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 5000\r\n\r\n{\"model\": \"tiny\", \"mess",                   # in the body
])
def test_a_client_that_resets_mid_request_is_counted_and_prints_nothing(server, capfd, sent):
    """A client killed while it sends its request (a TCP reset) used to print a traceback on
    the server's console, or get a 500 written to nobody; now it counts in
    ``stats()["disconnects"]`` and the server goes on."""
    from test_http_server import reset, wait_for

    before = server.stats()["disconnects"]
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(sent)
    time.sleep(0.2)
    reset(sock)
    wait_for(lambda: server.stats()["disconnects"] != before)
    assert server.stats()["disconnects"] == before + 1
    status, body = post(server, "/v1/chat/completions",
                        {"model": "tiny", "messages": CHAT, "max_tokens": 2})
    assert status == 200, body
    time.sleep(0.1)
    assert server.stats()["disconnects"] == before + 1  # counted once
    assert "Traceback" not in capfd.readouterr().err
