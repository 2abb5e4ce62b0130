"""The ``openai`` backend against a real vLLM server (the CPU build here), started the way a user
starts it: ``spadekit serve --model smollm2-135m``. Token ids in and out with the trainer's
logprobs, chat rendered locally or by the server, stop strings, length, concurrent requests,
capability detection, specs and the registry; Ctrl-C stops the server.

One server for the module (about 1-2 min to start on CPU), in its own process group, stopped
after the module by SIGINT as a terminal's Ctrl-C does. Marked ``extra("vllm")``: skipped,
naming the extra and its install command, where vLLM is not installed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.extra("vllm")

from spadekit.policy import (GenerationRequest, Policy, SamplingParams,  # noqa: E402
                             load_policy)
from spadekit.policy.base import CapabilityError, cut_at_stop  # noqa: E402
from spadekit.policy.hf import sequence_logprobs  # noqa: E402
from spadekit.policy.openai_backend import OpenAIPolicy, load_openai  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")
MESSAGES = [{"role": "user", "content": "Say something."}]
TOL = 1e-3
"""|vLLM - transformers| logprob bound, float32 on CPU (as tests/policy/test_vllm_engine.py)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """``spadekit serve --model smollm2-135m`` on a free loopback port; its /v1 URL."""
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="spadekit-openai-test-")) / "server.log"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    env.pop("SPADEKIT_API_KEY", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spadekit", "serve", "--model", "smollm2-135m", "--port",
             str(port), "--vllm-args", f"--max-model-len 2048 --kv-cache-memory-bytes {1 << 30}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"spadekit serve exited {proc.returncode}:\n"
                            + log.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(1)
        yield f"{url}/v1"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole foreground group
        try:
            assert proc.wait(120) is not None
        except subprocess.TimeoutExpired:
            pytest.fail("spadekit serve did not stop on Ctrl-C within 120 s")
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="module")
def hf(bundled_hf):
    """The trainer's side: the session's bundled model (conftest.py)."""
    return bundled_hf


@pytest.fixture(scope="module")
def client(server, hf):
    c = load_openai(f"openai:smollm2-135m@{server}", tokenizer=hf.tokenizer, timeout=120,
                    max_concurrency=8)
    yield c
    c.close()


def gen(policy, prompt_ids=None, messages=None, **params):
    req = GenerationRequest(prompt_ids=prompt_ids, messages=messages,
                            params=SamplingParams(**params))
    return policy.generate([req])[0]


def assert_exact_logprobs(hf, g, temperature):
    ref = sequence_logprobs(hf.model, g.prompt_ids, g.token_ids, temperature)
    assert len(g.logprobs) == len(g.token_ids) == len(ref)
    assert max(abs(a - b) for a, b in zip(ref, g.logprobs)) < TOL


def test_full_capabilities(client):
    assert isinstance(client, Policy)
    assert client.capabilities == frozenset({"token_ids", "logprobs"})
    assert client.features.token_prompts and client.features.extras
    assert "Training: possible" in client.explain_capabilities()
    assert client.weights.cannot_restore() is None and client.cannot_restore_weights() is None
    assert client._server_instance()  # vLLM names its instance: a restart is seen (transport)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_in_token_out_logprobs_match_the_trainer(client, hf, temperature):
    prompt = hf.render(MESSAGES)
    g = gen(client, prompt_ids=prompt, temperature=temperature, max_new_tokens=12, seed=3)
    assert g.prompt_ids == prompt
    assert 1 <= len(g.token_ids) <= 12
    assert_exact_logprobs(hf, g, temperature)
    assert g.text == cut_at_stop(hf.tokenizer.decode(g.token_ids, skip_special_tokens=True),
                                 ())[0]
    again = gen(client, prompt_ids=prompt, temperature=temperature, max_new_tokens=12, seed=3)
    assert again.token_ids == g.token_ids  # the seed travels to the server


def test_chat_messages_are_rendered_locally(client, hf):
    g = gen(client, messages=MESSAGES, max_new_tokens=6, seed=1)
    assert g.prompt_ids == hf.render(MESSAGES)
    assert_exact_logprobs(hf, g, 1.0)
    assert client.render(MESSAGES) == hf.render(MESSAGES)


def test_stop_strings(client, hf):
    prompt = hf.render(MESSAGES)
    full = gen(client, prompt_ids=prompt, max_new_tokens=40, seed=7)
    first = {}
    for i, ch in enumerate(full.text):
        first.setdefault(ch, i)
    candidates = [ch for ch, i in first.items() if i >= 2 and ch.isascii() and ch.isprintable()
                  and ch != " "]
    assert candidates, f"no usable stop character in {full.text!r}"
    stop = candidates[0]
    g = gen(client, prompt_ids=prompt, max_new_tokens=40, seed=7, stop=(stop,))
    assert g.finish_reason == "stop"
    assert g.text == cut_at_stop(full.text, (stop,))[0] and g.text.endswith(stop)
    assert g.token_ids == full.token_ids[:len(g.token_ids)] and len(g.token_ids) < 40
    assert stop in hf.tokenizer.decode(g.token_ids)  # the stop tokens are kept


def test_max_tokens_gives_length(client, hf):
    g = gen(client, prompt_ids=hf.render(MESSAGES), max_new_tokens=5, seed=0,
            stop=("\u2603",))
    assert (len(g.token_ids), g.finish_reason) == (5, "length")


def test_concurrent_requests_come_back_in_order_and_exact(client, hf):
    reqs = [GenerationRequest(prompt_ids=hf.render([{"role": "user", "content": "q" * (i + 1)}]),
                              params=SamplingParams(max_new_tokens=6, seed=i))
            for i in range(12)]
    gens = client.generate(reqs)
    for r, g in zip(reqs, gens):
        assert g.prompt_ids == r.prompt_ids and 1 <= len(g.token_ids) <= 6
    for g in gens[:2] + gens[-2:]:
        assert_exact_logprobs(hf, g, 1.0)


def test_client_without_tokenizer_uses_chat(server, hf):
    c = load_openai(f"openai:@{server}", timeout=120)  # empty model: the server's first
    assert c.model == "smollm2-135m" and c.tokenizer is None
    assert c.capabilities == frozenset({"logprobs"})
    assert "no tokenizer" in c.explain_capabilities()
    assert "token-id prompts accepted: untested" in c.explain_capabilities()
    with pytest.raises(CapabilityError):
        c.render(MESSAGES)
    g = gen(c, messages=MESSAGES, max_new_tokens=5, seed=4)
    assert g.prompt_ids == hf.render(MESSAGES)  # the server's prompt_token_ids
    assert len(g.token_ids) == len(g.logprobs) >= 1
    assert_exact_logprobs(hf, g, 1.0)
    c.features.token_prompts = False  # ...a server that takes no token ids, and no tokenizer
    with pytest.raises(CapabilityError):
        gen(c, prompt_ids=[1, 2, 3], max_new_tokens=2)
    c.close()


def test_specs_and_registry(server, hf, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p = load_policy("openai:smollm2-135m", tokenizer=hf.tokenizer, timeout=120)
    assert isinstance(p, OpenAIPolicy) and p.base_url == server
    assert p.capabilities == frozenset({"token_ids", "logprobs"})
    p.close()


def test_a_second_role_over_http_renders_with_the_trained_model_s_tokenizer(server, hf):
    """``designer.hint_model`` / a separate designer as ``openai:NAME@URL`` (``load_beside``):
    the server's answers are decoded with the tokenizer of the policy it stands beside."""
    from spadekit.policy.registry import load_beside

    p = load_beside(f"openai:smollm2-135m@{server}", hf, timeout=120)
    assert p.tokenizer is hf.tokenizer and "token_ids" in p.capabilities
    g = gen(p, messages=MESSAGES, max_new_tokens=4, seed=5)
    assert g.prompt_ids == hf.render(MESSAGES) and g.text
    p.close()
