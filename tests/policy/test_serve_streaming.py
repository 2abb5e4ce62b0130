"""``spadekit serve`` streams token by token (issue 26): events go out while the sequence is still
being generated, a client that disconnects frees its slot, streamed text equals the plain answer
(also with stop strings, and from a policy that cannot call back per token), and
``chat_template_kwargs`` reach the chat template.

Real parts: the tiny transformer behind the real HTTP server, the official ``openai`` client and
raw sockets; the text-delta logic under hypothesis.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import cut_at_stop  # noqa: E402
from spadekit.policy.serve import serve  # noqa: E402
from spadekit.policy.serve_batch import DEFAULT_SLICE  # noqa: E402
from spadekit.policy.serve_stream import REPLACEMENT, StreamText  # noqa: E402

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def server(tiny):
    with serve(tiny, model_name="tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120) as c:
        yield c


class NoCallback:
    """The tiny policy without the per-token hook (as a remote ``openai:`` policy is): the server
    must stream it in short slices instead."""

    def __init__(self, policy):
        self._p = policy
        self.tokenizer, self.name = policy.tokenizer, policy.name
        self.capabilities = policy.capabilities - {"stream"}

    def generate(self, requests):
        return self._p.generate(requests)

    def render(self, *a, **kw):
        return self._p.render(*a, **kw)


# -- the text deltas, pure ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab c\u00e9x", max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=8),
       broken=st.lists(st.booleans(), max_size=8),
       stops=st.lists(st.text(alphabet="abcx", min_size=1, max_size=3), max_size=2),
       keep_stop=st.booleans())
def test_deltas_concatenate_to_the_answer(text, cuts, broken, stops, keep_stop):
    """Partial texts are prefixes of the decoded tokens (one may end in U+FFFD, a character
    whose bytes are not all in); the answer is the text cut at the first stop string, the stop
    left out unless kept. Whatever the partials, the deltas add up to the answer."""
    full, found = cut_at_stop(text, tuple(stops))
    answer = full
    if found and not keep_stop:
        stop = next(s for s in stops if full.endswith(s))
        answer = full[:-len(stop)]
    stream = StreamText(stops)
    sent = ""
    for cut, bad in zip(sorted(cuts), broken + [False] * len(cuts)):
        prefix = cut_at_stop(text[:cut], tuple(stops))[0]
        sent += stream.partial(prefix + (REPLACEMENT if bad else ""))
        assert answer.startswith(sent)
    sent += stream.final(answer)
    assert sent == answer


# -- streaming for real ------------------------------------------------------------------------


def _long_greedy_prompt(client) -> str:
    """A prompt whose greedy continuation runs to the length limit (no end token)."""
    for prompt in ("Once", "The", "a b c", "Hello there", "x"):
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=300,
                                      temperature=0)
        if r.choices[0].finish_reason == "length":
            return prompt
    pytest.skip("every greedy continuation of the tiny model ends early")


def test_the_first_event_comes_long_before_the_last(client):
    prompt = _long_greedy_prompt(client)
    t0 = time.perf_counter()
    stamps = []
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=300,
                                           temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter() - t0)
    total = time.perf_counter() - t0
    assert len(stamps) >= 100  # a token (or a few) an event, not one event at the end
    assert stamps[0] < 0.5 * total, (stamps[0], total)


def test_a_disconnected_stream_frees_its_slot(server, client, tiny, monkeypatch):
    prompt = _long_greedy_prompt(client)
    before = server.stats()["cancelled"]
    left = server.stats()["disconnects"]
    made: list = []  # what the policy generated, call by call
    real = type(tiny).generate
    monkeypatch.setattr(tiny, "generate", lambda reqs: made.append(real(tiny, reqs)) or made[-1])
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4000,
                       "temperature": 0, "stream": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        got = b""
        while b"data: {" not in got:
            got += sock.recv(4096)
    # the client is gone after its first event: the rest of the 4,000 tokens never generate
    deadline = time.monotonic() + 120
    while server.stats()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stats()["cancelled"] == before + 1
    assert server.stats()["queued"] == 0
    assert server.stats()["disconnects"] == left + 1  # and the client counts as gone
    # the sampler stopped the sequence at the token after the client was found gone (the hook
    # answered False), not at the end of its slice (that ended by "length")
    assert len(made) == 1 and len(made[0]) == 1, [len(m) for m in made]
    assert made[0][0].finish_reason == "abort"
    assert len(made[0][0].token_ids) < DEFAULT_SLICE
    r = client.completions.create(model="tiny", prompt="Hi", max_tokens=4)  # the slot is free
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("stop", [["e"], [" t", "ab"]])
def test_streamed_text_with_stop_strings_equals_the_plain_one(client, stop):
    kwargs = dict(model="tiny", prompt="Once upon", max_tokens=40, temperature=1.0, seed=3,
                  stop=stop)
    plain = client.completions.create(**kwargs).choices[0]
    parts = [c.choices[0] for c in client.completions.create(stream=True, **kwargs)
             if c.choices]
    assert "".join(p.text for p in parts) == plain.text
    assert parts[-1].finish_reason == plain.finish_reason


def test_a_policy_without_the_hook_streams_in_slices(tiny):
    policy = NoCallback(tiny)
    with serve(policy, model_name="tiny") as srv, openai.OpenAI(
            base_url=srv.url, api_key="none", max_retries=0, timeout=120) as c:
        prompt = _long_greedy_prompt(c)
        plain = c.completions.create(model="tiny", prompt=prompt, max_tokens=120,
                                     temperature=0).choices[0]
        slices = srv.stats()["slices"]
        parts = [x.choices[0] for x in c.completions.create(
            model="tiny", prompt=prompt, max_tokens=120, temperature=0, stream=True)
            if x.choices]
        assert "".join(p.text for p in parts) == plain.text  # greedy: the unsliced tokens
        # 4 + 8 + 16 + 32 + 64 > 120: five slices, four of them streamed before the end
        assert srv.stats()["slices"] - slices == 5
        assert sum(1 for p in parts if p.text) >= 4


def test_chat_template_kwargs_reach_the_template(tiny):
    from spadekit.policy.hf import HFPolicy
    from spadekit.policy.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if loud %}!!!{% endif %}")
    policy = HFPolicy(tiny.model, tok, name="tiny")
    with serve(policy, model_name="tiny") as srv, openai.OpenAI(
            base_url=srv.url, api_key="none", max_retries=0, timeout=120) as c:
        msgs = [{"role": "user", "content": "hi"}]

        def prompt(**extra):
            r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=1,
                                          extra_body={"return_token_ids": True, **extra})
            return r.model_extra["prompt_token_ids"]

        quiet, loud = prompt(), prompt(chat_template_kwargs={"loud": True})
        assert tok.decode(quiet) == "hi" and tok.decode(loud) == "hi!!!"


def test_a_cancel_the_stream_did_not_make_ends_with_an_error_event():
    """Only the stream's own cancel (its client is gone) ends it silently; a sequence cancelled
    from elsewhere leaves a client that is still reading, so it gets an error event."""
    from concurrent.futures import Future

    from spadekit.policy.serve_stream import LiveStream

    class Ticket:
        def __init__(self):
            self.futures = [Future()]

        def cancel(self):
            for f in self.futures:
                f.cancel()

    def stream():
        return LiveStream("completion", {"id": "x"}, 1, [], submit=lambda watch: Ticket(),
                          answer=lambda gens: {}, part=lambda *a: {},
                          visible=lambda toks: "", body={}, timeout=5.0)

    theirs = stream()
    theirs.ticket.futures[0].cancel()  # e.g. a server closing its line
    events = list(theirs)
    assert events and events[-1]["object"] == "error"
    assert "cancelled" in events[-1]["error"]["message"]

    ours = stream()
    ours.cancel()  # the client went away
    assert list(ours) == []


@pytest.mark.parametrize("slice_tokens", [0, 40])
def test_a_request_dropped_mid_batch_always_fails_as_cancelled(tiny, slice_tokens):
    """However a running sequence is dropped (its watcher breaks, or its ticket is cancelled
    with or without a stream), its future fails with "the request was cancelled" and counts in
    ``cancelled``, whole or sliced; the policy stopped a streamed one at once ("abort")."""
    import threading

    from concurrent.futures import wait

    from spadekit.policy import GenerationRequest, SamplingParams
    from spadekit.policy.serve_batch import FairBatcher, UpdateGate

    made: list = []
    running = threading.Event()

    class Recording:
        def __init__(self, policy):
            self.tokenizer, self.name = policy.tokenizer, policy.name
            self.capabilities, self._p = policy.capabilities, policy

        def generate(self, requests):
            running.set()
            made.append(self._p.generate(requests))
            return made[-1]

    prompt = tiny.tokenizer("Once upon a time")["input_ids"]

    def requests(n, budget):
        return [GenerationRequest(prompt_ids=prompt, params=SamplingParams(
            temperature=0, max_new_tokens=budget)) for _ in range(n)]

    heard: list[int] = []

    def breaks(index, tokens, logprobs):
        heard.append(index)
        if len(heard) == 3:
            raise RuntimeError("the watcher broke")

    def run(n, watch, cancel):
        batcher = FairBatcher(Recording(tiny), 0.0, 8, UpdateGate(), slice_tokens=slice_tokens)
        made.clear()
        running.clear()
        try:
            # a budget the 0.05 s before a cancel can never use up
            ticket = batcher.submit(requests(n, 1000 if cancel else 100), watch)
            if cancel:
                assert running.wait(60)
                time.sleep(0.05)
                ticket.cancel()
            wait(ticket.futures, timeout=120)
            errors = [f.exception() for f in ticket.futures]
            deadline = time.monotonic() + 10
            while batcher.stats()["cancelled"] < n and time.monotonic() < deadline:
                time.sleep(0.02)
            return errors, batcher.stats()["cancelled"]
        finally:
            batcher.close()

    for watch, cancel in ((breaks, False), (lambda i, t, lp: None, True), (None, True)):
        heard.clear()
        errors, cancelled = run(2, watch, cancel)
        assert [str(e) for e in errors] == ["the request was cancelled"] * 2, (watch, errors)
        assert cancelled == 2
        if watch is breaks:  # at its third token: the sampler ended both rows at once
            assert [g.finish_reason for g in made[0]] == ["abort", "abort"]
            assert [len(g.token_ids) for g in made[0]] == [2, 2]
        elif watch is not None:  # cancelled while it streamed: stopped long before its budget
            assert all(g.finish_reason in ("abort", "length") for g in made[-1])
            assert sum(len(g.token_ids) for m in made for g in m) < 2 * 1000
