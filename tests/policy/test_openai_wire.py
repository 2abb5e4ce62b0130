"""Properties of ``spadekit.policy.openai_wire``, the reading of OpenAI-compatible answers: token
ids and logprobs come back exactly from every shape servers send (vLLM's ``token_id:N`` tokens
and ``token_ids`` field, chat ``logprobs.content``, llama.cpp's ``id``), any JSON a server sends
is read or refused with ``MalformedResponse`` (never another exception), finish reasons are
``stop`` or ``length``, and specs and base URLs parse back to what was written."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.policy.base import PolicyError
from spadekit.policy.openai_wire import (MalformedResponse, chat_tokens, completion_tokens,
                                        finish_reason, first_choice, normalize_base_url,
                                        parse_spec)

ids_st = st.lists(st.integers(0, 200_000), min_size=1, max_size=20)
lp = st.floats(-50, 0, allow_nan=False)
json_st = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                       | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.sampled_from(["text", "logprobs", "tokens",
                                                          "token_logprobs", "content", "token",
                                                          "logprob", "id", "token_ids",
                                                          "message", "choices"]), inner,
                                         max_size=5), max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(ids_st, st.data())
def test_completion_shapes_give_the_ids_and_logprobs_back(ids, data):
    lps = data.draw(st.lists(lp, min_size=len(ids), max_size=len(ids)))
    vllm = {"text": "t", "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                      "token_logprobs": lps}}
    assert completion_tokens(vllm) == (ids, lps, "t")
    with_field = {"text": "t", "token_ids": ids, "logprobs": {"tokens": ["a"] * len(ids),
                                                              "token_logprobs": lps}}
    assert completion_tokens(with_field) == (ids, lps, "t")
    llama = {"text": "t", "logprobs": {"content": [{"id": i, "logprob": v}
                                                   for i, v in zip(ids, lps)]}}
    assert completion_tokens(llama) == (ids, lps, "t")
    no_lp = {"text": "t", "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                       "token_logprobs": [None] * len(ids)}}
    assert completion_tokens(no_lp) == (ids, None, "t")


@settings(max_examples=60, deadline=None)
@given(ids_st, st.data())
def test_chat_shapes_give_the_ids_and_logprobs_back(ids, data):
    lps = data.draw(st.lists(lp, min_size=len(ids), max_size=len(ids)))
    entries = [{"token": f"token_id:{i}", "logprob": v} for i, v in zip(ids, lps)]
    choice = {"message": {"content": "hi"}, "logprobs": {"content": entries}}
    assert chat_tokens(choice) == (ids, lps, "hi")
    plain = {"message": {"content": "hi"}, "logprobs": {"content": [
        {"token": "x", "logprob": v} for v in lps]}}
    assert chat_tokens(plain) == (None, lps, "hi")


@settings(max_examples=200, deadline=None)
@given(json_st)
def test_any_json_is_read_or_refused_as_malformed(value):
    for read in (first_choice, completion_tokens, chat_tokens):
        try:
            read(value) if isinstance(value, dict) else read({"choices": value})
        except MalformedResponse:
            pass


@given(st.one_of(st.none(), st.text(max_size=12)), st.integers(0, 50), st.integers(1, 50))
def test_finish_reasons_are_stop_or_length(reason, n, max_tokens):
    out = finish_reason(reason, n, max_tokens)
    assert out in ("stop", "length")
    if reason in ("stop", "eos", "length", "max_tokens"):
        assert out == ("length" if reason in ("length", "max_tokens") else "stop")
    elif reason is None:
        assert out == ("length" if n >= max_tokens else "stop")


names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_./@:"),
                max_size=20).filter(lambda m: "@http" not in m)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?", fullmatch=True)


@settings(max_examples=80, deadline=None)
@given(names, st.sampled_from(["http", "https"]), hosts, st.integers(1, 65535),
       st.sampled_from(["", "/", "/v1", "/v1/", "/api/v1"]))
def test_specs_and_urls_parse_back(model, scheme, host, port, path):
    url = f"{scheme}://{host}:{port}{path}"
    assert parse_spec(f"openai:{model}@{url}") == (model, url)
    assert parse_spec(f"openai:{model}") == (model, None)
    base = normalize_base_url(url)
    assert normalize_base_url(base) == base and base.startswith(f"{scheme}://{host}:{port}/")
    assert not base.endswith("/") and (path.strip("/") or "v1") == base.split(f":{port}/")[1]


@pytest.mark.parametrize("bad", ["ftp://x", "http://", "localhost:8000", "http://h:99999/v1"])
def test_bad_base_urls_are_policy_errors(bad):
    with pytest.raises(PolicyError):
        normalize_base_url(bad)
