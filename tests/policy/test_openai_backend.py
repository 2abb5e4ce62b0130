"""The ``openai`` backend against real HTTP servers on 127.0.0.1.

``spadekit.policy.serve`` serves the tiny model; ``OpenAIPolicy`` talks to it through the real
client path (token ids in and out, logprobs, chat, stop strings, batching, capability
detection). Small scripted stdlib servers exercise retries, timeouts and malformed answers.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spadekit.policy import GenerationRequest, Policy, PolicyError, SamplingParams, load_policy
from spadekit.policy.base import CapabilityError, cut_at_stop
from spadekit.policy.openai_backend import (MalformedResponse, OpenAIPolicy, ServerHTTPError,
                                            ServerTimeout, ServerUnreachable, load_openai,
                                            normalize_base_url, parse_spec)
from spadekit.policy.serve import serve

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def tiny():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 70k-parameter model: threads only add contention
    yield load_policy("tiny")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(tiny):
    srv = serve(tiny, batch_window=0.05, max_batch=64)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(server, tiny):
    c = load_openai(f"openai:tiny@{server.url}", tokenizer=tiny.tokenizer, timeout=30,
                    max_concurrency=16)
    yield c
    c.close()


def gen(policy, prompt_ids=None, messages=None, **params):
    req = GenerationRequest(prompt_ids=prompt_ids, messages=messages,
                            params=SamplingParams(**params))
    return policy.generate([req])[0]


def assert_exact_logprobs(tiny, g, temperature):
    from spadekit.policy.hf import sequence_logprobs

    ref = sequence_logprobs(tiny.model, g.prompt_ids, g.token_ids, temperature)
    assert len(g.logprobs) == len(g.token_ids) == len(ref)
    assert max(abs(a - b) for a, b in zip(ref, g.logprobs)) < 1e-4


# -- the real client path against spadekit serve ---------------------------------------------

def test_full_capabilities(client):
    assert isinstance(client, Policy)
    assert client.capabilities == frozenset({"token_ids", "logprobs"})
    assert client.features.token_prompts and client.features.extras
    assert "Training: possible" in client.explain_capabilities()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_in_token_out_logprobs_match_the_model(client, tiny, temperature):
    prompt = tiny.render(MESSAGES)
    g = gen(client, prompt_ids=prompt, temperature=temperature, max_new_tokens=12, seed=3)
    assert g.prompt_ids == prompt
    assert 1 <= len(g.token_ids) <= 12
    assert_exact_logprobs(tiny, g, temperature)
    assert g.text == cut_at_stop(tiny.tokenizer.decode(g.token_ids, skip_special_tokens=True),
                                 ())[0]
    again = gen(client, prompt_ids=prompt, temperature=temperature, max_new_tokens=12, seed=3)
    assert again.token_ids == g.token_ids  # the seed travels to the server


def test_chat_messages_are_rendered_locally(client, tiny):
    g = gen(client, messages=MESSAGES, max_new_tokens=6, seed=1)
    assert g.prompt_ids == tiny.render(MESSAGES)
    assert_exact_logprobs(tiny, g, 1.0)
    assert client.render(MESSAGES) == tiny.render(MESSAGES)


def test_stop_strings(client, tiny):
    prompt = tiny.render(MESSAGES)
    full = gen(client, prompt_ids=prompt, max_new_tokens=40, seed=7)
    first = {}
    for i, ch in enumerate(full.text):
        first.setdefault(ch, i)
    candidates = [ch for ch, i in first.items() if i >= 2 and ch.isascii() and ch.isprintable()]
    assert candidates, f"no usable stop character in {full.text!r}"
    stop = candidates[0]
    g = gen(client, prompt_ids=prompt, max_new_tokens=40, seed=7, stop=(stop,))
    assert g.finish_reason == "stop"
    assert g.text == cut_at_stop(full.text, (stop,))[0] and g.text.endswith(stop)
    assert g.token_ids == full.token_ids[:len(g.token_ids)] and len(g.token_ids) < 40
    assert stop in tiny.tokenizer.decode(g.token_ids)  # the stop tokens are kept


def test_max_tokens_gives_length(client, tiny):
    g = gen(client, prompt_ids=tiny.render(MESSAGES), max_new_tokens=5, seed=0)
    assert (len(g.token_ids), g.finish_reason) == (5, "length")


def test_parallel_requests_are_batched(client, server, tiny):
    before = server.stats()
    reqs = [GenerationRequest(prompt_ids=tiny.render([{"role": "user", "content": "q" * (i + 1)}]),
                              params=SamplingParams(max_new_tokens=6, seed=i))
            for i in range(16)]
    gens = client.generate(reqs)
    after = server.stats()
    assert after["requests"] - before["requests"] == 16
    assert after["batches"] - before["batches"] < 16
    assert after["largest_batch"] >= 2
    for r, g in zip(reqs, gens):  # in order, and exact despite left padding in the batch
        assert g.prompt_ids == r.prompt_ids
    for g in gens[:3] + gens[-3:]:
        assert_exact_logprobs(tiny, g, 1.0)


# -- capability detection ----------------------------------------------------------------------

def test_server_without_logprobs(tiny):
    with serve(tiny, logprobs=False) as srv:
        c = load_openai(f"openai:tiny@{srv.url}", tokenizer=tiny.tokenizer, timeout=30)
        assert c.capabilities == frozenset({"token_ids"})
        text = c.explain_capabilities()
        assert "Generation only" in text and "no logprobs" in text
        g = gen(c, prompt_ids=tiny.render(MESSAGES), max_new_tokens=4, seed=2)
        assert g.logprobs is None and len(g.token_ids) == 4


def test_server_without_token_ids(tiny):
    with serve(tiny, token_ids=False) as srv:
        c = load_openai(f"openai:tiny@{srv.url}", tokenizer=tiny.tokenizer, timeout=30)
        assert c.capabilities == frozenset({"logprobs"})
        assert "Generation only" in c.explain_capabilities()
        assert "no token ids" in c.explain_capabilities()
        g = gen(c, prompt_ids=tiny.render(MESSAGES), max_new_tokens=4, seed=2)
        assert len(g.logprobs) == 4 and g.text


def test_server_without_token_prompts(tiny):
    with serve(tiny, token_prompts=False) as srv:
        c = load_openai(f"openai:tiny@{srv.url}", tokenizer=tiny.tokenizer, timeout=30)
        assert not c.features.token_prompts
        assert c.capabilities == frozenset({"logprobs"})
        prompt = tiny.render(MESSAGES)
        g = gen(c, prompt_ids=prompt, max_new_tokens=4, seed=2)  # sent as decoded text
        assert g.prompt_ids == prompt and len(g.token_ids) == 4


def test_client_without_tokenizer_uses_chat(server, tiny):
    c = load_openai(f"openai:@{server.url}", timeout=30)  # empty model: the server's first
    assert c.model == "tiny" and c.tokenizer is None
    assert c.capabilities == frozenset({"logprobs"})
    assert "no tokenizer" in c.explain_capabilities()
    assert "token-id prompts accepted: untested" in c.explain_capabilities()
    with pytest.raises(CapabilityError):
        c.render(MESSAGES)
    g = gen(c, messages=MESSAGES, max_new_tokens=5, seed=4)
    assert g.prompt_ids == tiny.render(MESSAGES)  # vLLM-style prompt_token_ids
    assert len(g.token_ids) == 5
    assert_exact_logprobs(tiny, g, 1.0)
    c.features.token_prompts = False  # ...a server that takes no token ids, and no tokenizer
    with pytest.raises(CapabilityError):
        gen(c, prompt_ids=[1, 2, 3], max_new_tokens=2)


# -- the server's own HTTP surface --------------------------------------------------------------

def http_call(url, method, path, body=None, raw=None):
    host, port = url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def test_server_endpoints(server, tiny):
    assert http_call(server.url, "GET", "/health") == (200, {"status": "ok"})
    status, models = http_call(server.url, "GET", "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "tiny"
    assert http_call(server.url, "GET", "/nope")[0] == 404
    assert http_call(server.url, "POST", "/v1/completions", raw=b"{not json")[0] == 400
    assert http_call(server.url, "POST", "/v1/completions",
                     {"prompt": "hi", "temperature": -1})[0] == 400
    assert http_call(server.url, "POST", "/v1/completions", {"prompt": [1, 99999]})[0] == 400
    assert http_call(server.url, "POST", "/v1/chat/completions", {"messages": []})[0] == 400
    status, out = http_call(server.url, "POST", "/v1/completions",
                            {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 3, "seed": 5,
                             "logprobs": 1})
    assert status == 200 and len(out["choices"]) == 4
    choice = out["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == 3 and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 12
    assert out["choices"][0]["logprobs"] != out["choices"][1]["logprobs"]  # n: distinct seeds


def test_server_drops_the_stop_string_unless_asked(server, tiny):
    prompt = tiny.render(MESSAGES)
    base = {"prompt": prompt, "max_tokens": 40, "seed": 7}
    full = http_call(server.url, "POST", "/v1/completions", base)[1]["choices"][0]["text"]
    stop = next(ch for i, ch in enumerate(full) if i >= 2 and full.index(ch) == i
                and ch.isascii() and ch.isprintable())
    plain = http_call(server.url, "POST", "/v1/completions",
                      {**base, "stop": [stop]})[1]["choices"][0]
    kept = http_call(server.url, "POST", "/v1/completions",
                     {**base, "stop": [stop], "include_stop_str_in_output": True})[1]
    assert plain["text"] == full[:full.index(stop)] and plain["stop_reason"] == stop
    assert kept["choices"][0]["text"] == full[:full.index(stop) + 1]


# -- transport: retries, timeouts, unreachable, malformed ---------------------------------------

CANNED = {"choices": [{"text": "ok", "finish_reason": "stop",
                       "logprobs": {"tokens": ["token_id:11", "token_id:12"],
                                    "token_logprobs": [-0.5, -0.25]}}]}


class Scripted:
    """A stdlib server whose POST answers follow ``script(call_number) -> (status, body)``;
    a body of None means: hang until closed."""

    def __init__(self, script):
        self.calls = 0
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.calls += 1
                status, body = script(outer.calls)
                if body is None:
                    outer.release.wait(10)
                    return
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                if status in (429, 503):
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def client(self, **kw):
        kw.setdefault("backoff", 0.01)
        return OpenAIPolicy("m", base_url=self.url, probe=False, **kw)

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(script):
        made.append(Scripted(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_retries_5xx_then_succeeds(scripted):
    srv = scripted(lambda n: (503, {"error": "busy"}) if n <= 2 else (200, CANNED))
    g = gen(srv.client(retries=3), prompt_ids=[1, 2], max_new_tokens=2)
    assert srv.calls == 3
    assert (g.token_ids, g.logprobs, g.text, g.finish_reason) == ([11, 12], [-0.5, -0.25],
                                                                   "ok", "stop")


def test_429_is_retried_and_retries_run_out(scripted):
    srv = scripted(lambda n: (429, {"error": "slow down"}))
    with pytest.raises(ServerHTTPError) as info:
        gen(srv.client(retries=2), prompt_ids=[1], max_new_tokens=2)
    assert srv.calls == 3 and info.value.status == 429 and "after 3 attempts" in str(info.value)


def test_4xx_is_not_retried(scripted):
    srv = scripted(lambda n: (400, {"error": {"message": "max_tokens is too large"}}))
    with pytest.raises(ServerHTTPError) as info:
        gen(srv.client(retries=3), prompt_ids=[1], max_new_tokens=2)
    assert srv.calls == 1
    assert info.value.status == 400 and "max_tokens is too large" in info.value.body
    assert info.value.reason == "http_status" and isinstance(info.value, PolicyError)


def test_malformed_answers(scripted):
    srv = scripted(lambda n: (200, b"<html>not json</html>") if n == 1 else (200, {"x": 1}))
    c = srv.client(retries=0)
    with pytest.raises(MalformedResponse, match="not JSON"):
        gen(c, prompt_ids=[1], max_new_tokens=2)
    with pytest.raises(MalformedResponse, match="no choices"):
        gen(c, prompt_ids=[1], max_new_tokens=2)


def test_timeout_is_a_policy_error_and_not_retried(scripted):
    srv = scripted(lambda n: (200, None))
    c = srv.client(retries=3, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(ServerTimeout):
        gen(c, prompt_ids=[1], max_new_tokens=2)
    assert time.monotonic() - t0 < 2.0 and srv.calls == 1


def test_unreachable_server():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ServerUnreachable) as info:
        load_openai(f"openai:m@http://127.0.0.1:{port}/v1", retries=1, backoff=0.01, timeout=2)
    assert time.monotonic() - t0 < 3 and isinstance(info.value, PolicyError)
    assert "after 2 attempts" in str(info.value)


# -- names ---------------------------------------------------------------------------------------

def test_specs_and_registry(server, tiny, monkeypatch):
    assert parse_spec("openai:llama-3@http://h:1/v1") == ("llama-3", "http://h:1/v1")
    assert parse_spec("openai:org/model@v2") == ("org/model@v2", None)
    assert normalize_base_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/v1"
    with pytest.raises(PolicyError):
        normalize_base_url("ftp://x")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "")
    p = load_policy("openai:tiny", tokenizer=tiny.tokenizer, timeout=30)
    assert isinstance(p, OpenAIPolicy) and p.base_url == server.url
    assert p.capabilities == frozenset({"token_ids", "logprobs"})
    lazy = load_openai("openai:tiny", probe=False)
    assert "not probed" in lazy.explain_capabilities() and lazy.capabilities == {"logprobs"}
