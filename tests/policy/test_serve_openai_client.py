"""``spadekit serve`` through the official ``openai`` Python client: chat and completions with
logprobs and ``n``, ``stream=True`` (deltas that add up to the non-streamed answer, logprobs per
token, the usage chunk), and each logprob entry's ``bytes`` holding the token's own bytes (not
U+FFFD's 239 191 189) for the byte-level pieces of a character.

The served model is ``tiny`` (a byte-level tokenizer: every non-ASCII character is several
tokens); the bytes of SmolLM2's tokenizer are checked too when its cache exists."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.serve import serve  # noqa: E402
from spadekit.policy.token_bytes import TokenBytes, byte_alphabet  # noqa: E402
from spadekit.policy.tiny import tiny_tokenizer  # noqa: E402

REPLACEMENT = [239, 191, 189]


@pytest.fixture(scope="module")
def server():
    with serve(load_policy("tiny"), model_name="tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60) as c:
        yield c


def smollm2_tokenizer():
    from spadekit.policy import bundled

    path = bundled.status().get("cache_path")
    if not bundled.status().get("cached"):
        pytest.skip("the smollm2-135m cache is not built")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# -- token bytes ------------------------------------------------------------------------------

def test_byte_alphabet_is_a_bijection_onto_bytes():
    table = byte_alphabet()
    assert sorted(table.values()) == list(range(256)) and len(table) == 256
    assert table["A"] == 65 and table["\u0120"] == 32  # GPT-2's 'Ġ' is the space


def test_pieces_of_a_character_get_their_own_bytes():
    tok = tiny_tokenizer()
    ids = tok("é😀", add_special_tokens=False)["input_ids"]
    got = [TokenBytes(tok)(i) for i in ids]
    assert got == [bytes([b]) for b in "é😀".encode()]  # one byte per token
    assert all(list(b) != REPLACEMENT for b in got)


def test_smollm2_pieces_of_an_emoji():
    tok = smollm2_tokenizer()
    ids = tok("hi 😀", add_special_tokens=False)["input_ids"]
    tb = TokenBytes(tok)
    assert tb.byte_level
    assert b"".join(tb(i) for i in ids) == "hi 😀".encode()
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)  # the old field was wrong here
    assert tb(tok.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_token_bytes_rebuild_any_text(text):
    tok = tiny_tokenizer()
    tb = TokenBytes(tok)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert b"".join(tb(i) for i in ids) == text.encode("utf-8")


# -- through the openai client ----------------------------------------------------------------

def test_chat_with_logprobs_and_n(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hé"}],
                                       max_tokens=10, n=2, logprobs=True, top_logprobs=1,
                                       temperature=1.0, seed=3)
    assert len(r.choices) == 2
    for c in r.choices:
        entries = c.logprobs.content
        assert entries and all(e.logprob <= 0 for e in entries)
        joined = b"".join(bytes(e.bytes) for e in entries)
        assert joined.decode("utf-8", "replace") == c.message.content
        assert all(e.top_logprobs[0].bytes == e.bytes for e in entries)


def test_chat_logprob_bytes_are_each_tokens_own(client):
    """tiny's tokens are single bytes: entry k's bytes must be exactly that byte (the old
    server sent U+FFFD's 239 191 189 for every byte >= 0x80)."""
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "ö"}], max_tokens=24, n=2,
        logprobs=True, temperature=1.0, seed=5,
        extra_body={"return_tokens_as_token_ids": True})
    tok = tiny_tokenizer()
    high = 0
    for c in r.choices:
        for e in c.logprobs.content:
            tid = int(e.token.split(":")[1])
            want = list(tok.convert_ids_to_tokens(tid).encode()) if tid in tok.all_special_ids \
                else [byte_alphabet()[tok.convert_ids_to_tokens(tid)]]
            assert e.bytes == want
            high += want[0] >= 0x80
    assert high > 0  # the case that was broken does occur in this sample


def test_completions_with_logprobs_and_n(client):
    r = client.completions.create(model="tiny", prompt="Once", max_tokens=8, n=3, logprobs=1,
                                  temperature=1.0, seed=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(len(c.logprobs.token_logprobs) == len(c.logprobs.tokens) > 0 for c in r.choices)


def test_streamed_completion_equals_the_plain_one(client):
    kwargs = dict(model="tiny", prompt="Hello", max_tokens=12, logprobs=1, temperature=1.0,
                  seed=11)
    plain = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(stream=True, **kwargs))
    parts = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in parts) == plain.text
    streamed = [lp for p in parts if p.logprobs for lp in p.logprobs.token_logprobs]
    assert streamed == pytest.approx(plain.logprobs.token_logprobs, abs=0)
    assert parts[-1].finish_reason == plain.finish_reason
    assert sum(p.finish_reason is not None for p in parts) == 1


def test_streamed_chat_equals_the_plain_one(client):
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "Say ñ"}], max_tokens=14,
                  logprobs=True, temperature=1.0, seed=12, n=2)
    plain = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs))
    for want in plain.choices:
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == want.index]
        assert parts[0].delta.role == "assistant"
        assert "".join(p.delta.content or "" for p in parts) == want.message.content
        entries = [e for p in parts if p.logprobs for e in p.logprobs.content]
        assert [e.bytes for e in entries] == [e.bytes for e in want.logprobs.content]
        assert parts[-1].finish_reason == want.finish_reason
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == plain.usage.completion_tokens
