"""``spadekit serve`` bounds the prompt, not only ``max_tokens``
(``spadekit.policy.serve_request.fit_context``): a prompt over ``max_prompt_tokens`` or one
whose ``max_tokens`` does not fit in the model's context is a 400 before anything is queued;
an unset ``max_tokens`` is cut to the room left. Property-tested, plus the chat route of a
real server on the tiny model (its context: 16,384 positions). CPU, seconds."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.common.errors import SpadekitError
from spadekit.policy.base import Generation, SamplingParams
from spadekit.policy.serve_request import (DEFAULT_MAX_PROMPT_TOKENS, Limits, RequestError,
                                           fit_context)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 3000), st.one_of(st.none(), st.integers(2, 4000)),
       st.one_of(st.none(), st.integers(1, 5000)), st.booleans())
def test_what_fits_is_generated_and_the_rest_is_a_400(prompt, max_new, context, cap, explicit):
    limits = Limits(max_tokens=4096, context=context, max_prompt=cap)
    body = {"max_tokens": max_new} if explicit else {}
    params = SamplingParams(max_new_tokens=max_new)
    try:
        out = fit_context(prompt, params, body, limits)
    except RequestError as exc:
        assert exc.status == 400 and exc.param in ("prompt", "max_tokens")
        over_cap = prompt > (cap or context or DEFAULT_MAX_PROMPT_TOKENS)
        no_room = context is not None and (prompt >= context
                                          or explicit and prompt + max_new > context)
        assert over_cap or no_room, (prompt, max_new, context, cap, explicit)
        return
    assert prompt <= limits.max_prompt
    assert 1 <= out.max_new_tokens <= max_new
    if context is not None:
        assert prompt + out.max_new_tokens <= context
    if explicit or context is None or prompt + max_new <= context:
        assert out == params  # an explicit max_tokens is never changed, only refused


def test_the_limits_refuse_nonsense():
    with pytest.raises(SpadekitError):
        Limits(context=1)
    with pytest.raises(SpadekitError):
        Limits(max_prompt=0)
    assert Limits().max_prompt == DEFAULT_MAX_PROMPT_TOKENS
    assert Limits(context=100).max_prompt == 100


def test_the_chat_route_refuses_an_overlong_conversation_and_cuts_a_default():
    from spadekit.policy.serve import PolicyServer
    from spadekit.policy.tiny import load_tiny_policy

    policy = load_tiny_policy()
    seen = []

    def generate(reqs):
        seen.append([(len(r.prompt_ids), r.params.max_new_tokens) for r in reqs])
        return [Generation(prompt_ids=list(r.prompt_ids), token_ids=[5], logprobs=[0.0],
                           text="x", finish_reason="length") for r in reqs]

    policy.generate = generate
    srv = PolicyServer(policy, context_length=64, max_prompt_tokens=60).start()

    def ask(route, body):
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        conn.request("POST", route, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, json.loads(res.read())

    try:
        long_chat = {"messages": [{"role": "user", "content": "word " * 200}]}
        status, body = ask("/v1/chat/completions", long_chat)
        assert status == 400 and body["error"]["param"] == "prompt", body
        status, body = ask("/v1/completions", {"prompt": [5] * 50, "max_tokens": 20})
        assert status == 400 and body["error"]["param"] == "max_tokens", body
        assert "64" in body["error"]["message"]
        assert not seen
        status, _ = ask("/v1/completions", {"prompt": [5] * 50})  # default 16: cut to 14
        status2, _ = ask("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "hi"}]})  # default 256: cut to the room left
    finally:
        srv.close()
    assert (status, status2) == (200, 200)
    assert seen[0] == [(50, 14)]
    (prompt_len, new), = seen[1]
    assert prompt_len + new == 64
