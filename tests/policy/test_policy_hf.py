"""The ``hf`` backend's sampler on the tiny model: exact logprobs, batching, seeds, stops, params,
plus the registry and the ``hf`` loader's error paths. CPU only, a few seconds in all."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.policy import registry  # noqa: E402
from spadekit.policy.base import (MIN_TEMPERATURE, Generation, GenerationRequest,  # noqa: E402
                                  Policy, PolicyError, SamplingParams, cut_at_stop)
from spadekit.policy.hf import HFPolicy, sequence_logprobs  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402

TOL = 1e-4
CHATS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Write code"}],
    [{"role": "user", "content": "x" * 40}],
    [{"role": "user", "content": "a"}],
]


def sharpen(policy: HFPolicy, seed: int = 1234) -> HFPolicy:
    """Re-initialise the tiny model so its distributions have structure.

    As built, the tiny model's logits are nearly uniform and greedy decoding just repeats the last
    prompt token, which would let batching or cache bugs go unseen. Untied, larger weights give
    varied greedy continuations, peaked and flat positions, and natural end-of-turn tokens."""
    model = policy.model
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        for name, w in model.named_parameters():
            if w.ndim != 2:
                continue
            std = {"model.embed_tokens.weight": 1.0, "lm_head.weight": 0.3}.get(
                name, 1.0 / math.sqrt(w.shape[1]))
            w.copy_(torch.randn(w.shape, generator=gen) * std)
    model.config.tie_word_embeddings = False
    return policy


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    return sharpen(load_policy("tiny"))


def fresh_policy(max_batch_size: int = 64, seed: int = 0) -> HFPolicy:
    """Another policy over the same (sharpened) weights."""
    base = sharpen(load_policy("tiny"))
    return HFPolicy(base.model, base.tokenizer, name="tiny", max_batch_size=max_batch_size,
                    seed=seed)


def req(chat_or_ids, **params) -> GenerationRequest:
    sp = SamplingParams(**params)
    if isinstance(chat_or_ids, list) and chat_or_ids and isinstance(chat_or_ids[0], dict):
        return GenerationRequest(messages=chat_or_ids, params=sp)
    return GenerationRequest(prompt_ids=list(chat_or_ids), params=sp)


def assert_logprobs_exact(policy: HFPolicy, g: Generation, temperature: float) -> None:
    assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
    ref = sequence_logprobs(policy.model, g.prompt_ids, g.token_ids, temperature)
    worst = max(abs(a - b) for a, b in zip(g.logprobs, ref))
    assert worst < TOL, f"sampler logprobs differ from a fresh forward by {worst:.2e}"


# -- logprobs --------------------------------------------------------------------------------

def test_protocol_and_capabilities(policy):
    assert isinstance(policy, Policy)
    assert {"token_ids", "logprobs", "train"} <= policy.capabilities


def test_logprobs_match_fresh_forward_mixed_temperatures(policy):
    temps = [0.0, 0.5, 1.0, 1.7, 0.0, 1.0]
    requests = [req(CHATS[i % len(CHATS)], temperature=t, max_new_tokens=24, seed=i)
                for i, t in enumerate(temps)]
    requests.append(req(CHATS[0], temperature=0.8, top_p=0.7, max_new_tokens=24, seed=99))
    temps.append(0.8)
    gens = policy.generate(requests)
    assert len(gens) == len(requests)
    for g, t in zip(gens, temps):
        assert g.token_ids
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
        assert_logprobs_exact(policy, g, t)
    # greedy logprobs come from the unscaled distribution and the chosen token is its argmax
    g = gens[0]
    ids = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.inference_mode():
        logits = policy.model(input_ids=ids).logits[0, len(g.prompt_ids) - 1:-1]
    assert logits.argmax(-1).tolist() == g.token_ids


def test_logprobs_exact_for_prompt_id_requests_of_different_lengths(policy):
    prompts = [policy.render(c) for c in CHATS]
    gens = policy.generate([req(p, temperature=1.0, max_new_tokens=16, seed=i)
                            for i, p in enumerate(prompts)])
    for p, g in zip(prompts, gens):
        assert g.prompt_ids == p
        assert_logprobs_exact(policy, g, 1.0)


# -- batching --------------------------------------------------------------------------------

def test_batched_greedy_equals_one_by_one(policy):
    # different prompt lengths (left padding) and budgets (rows leave the batch at different steps)
    budgets = [3, 25, 9, 17, 1]
    requests = [req(c, temperature=0, max_new_tokens=n) for c, n in zip(CHATS, budgets)]
    batched = policy.generate(requests)
    for r, b in zip(requests, batched):
        alone = policy.generate([r])[0]
        assert b.token_ids == alone.token_ids
        assert b.finish_reason == alone.finish_reason
        assert b.text == alone.text
        assert max(abs(x - y) for x, y in zip(b.logprobs, alone.logprobs)) < TOL
    assert [len(b.token_ids) <= n for b, n in zip(batched, budgets)] == [True] * len(budgets)
    # the greedy continuations are not all alike (the check above would then be weak)
    assert len({tuple(b.token_ids) for b in batched}) >= 3


def test_max_batch_size_chunking_matches_one_batch(policy):
    requests = [req(c, temperature=0, max_new_tokens=12) for c in CHATS * 2]
    one = policy.generate(requests)
    chunked = fresh_policy(max_batch_size=2).generate(requests)
    assert [g.token_ids for g in chunked] == [g.token_ids for g in one]
    assert [g.finish_reason for g in chunked] == [g.finish_reason for g in one]
    for a, b in zip(one, chunked):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < TOL


def test_mixed_prompt_ids_and_messages_in_one_call(policy):
    ids = policy.render(CHATS[1])
    gens = policy.generate([req(CHATS[0], temperature=0, max_new_tokens=8),
                            req(ids, temperature=0, max_new_tokens=8),
                            req(CHATS[1], temperature=0, max_new_tokens=8)])
    assert gens[0].prompt_ids == policy.render(CHATS[0])
    assert gens[1].prompt_ids == ids
    # the same prompt as ids or as messages gives the same tokens
    assert gens[1].token_ids == gens[2].token_ids
    assert gens[1].prompt_ids == gens[2].prompt_ids


def test_empty_request_list(policy):
    assert policy.generate([]) == []


# -- seeds -----------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible_and_seeds_differ(policy):
    def sample(seed, extra=()):
        rs = [req(CHATS[0], temperature=1.0, max_new_tokens=20, seed=seed), *extra]
        return policy.generate(rs)[0]

    a, b = sample(7), sample(7)
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=TOL)
    others = [sample(s).token_ids for s in (8, 9, 10)]
    assert any(o != a.token_ids for o in others)
    # a seeded row draws from its own stream: its sample does not depend on the batch around it
    c = sample(7, extra=[req(CHATS[2], temperature=1.3, max_new_tokens=5, seed=3),
                         req(CHATS[3], temperature=0, max_new_tokens=30)])
    assert c.token_ids == a.token_ids


def test_policy_seed_makes_unseeded_sampling_reproducible():
    r = [req(CHATS[0], temperature=1.0, max_new_tokens=20)]
    p1, p2, p3 = fresh_policy(seed=5), fresh_policy(seed=5), fresh_policy(seed=6)
    a, b, c = p1.generate(r)[0], p2.generate(r)[0], p3.generate(r)[0]
    assert a.token_ids == b.token_ids
    # a second call continues the policy's stream rather than repeating the first draw
    runs = [a.token_ids, c.token_ids, p1.generate(r)[0].token_ids]
    assert len({tuple(x) for x in runs}) >= 2


@pytest.mark.parametrize("top_p", [5e-324, 1e-46])
def test_a_top_p_below_float32s_least_keeps_the_likeliest_token(policy, top_p):
    """A top_p that is 0 in float32 kept no token at all and the sampler raised (a 500 from
    ``spadekit serve``): the likeliest token is always in the nucleus."""
    nucleus = policy.generate([req(c, temperature=1.0, top_p=top_p, max_new_tokens=10, seed=i)
                               for i, c in enumerate(CHATS)])
    greedy = policy.generate([req(c, temperature=0, max_new_tokens=10) for c in CHATS])
    assert [n.token_ids for n in nucleus] == [g.token_ids for g in greedy]


def test_tiny_top_p_behaves_like_greedy(policy):
    requests = [req(c, temperature=1.0, top_p=1e-6, max_new_tokens=15, seed=i)
                for i, c in enumerate(CHATS)]
    nucleus = policy.generate(requests)
    greedy = policy.generate([req(c, temperature=0, max_new_tokens=15) for c in CHATS])
    for n, g in zip(nucleus, greedy):
        assert n.token_ids == g.token_ids
        # logprobs are those of the untruncated distribution (T=1 here, like greedy's)
        assert n.logprobs == pytest.approx(g.logprobs, abs=TOL)


@pytest.mark.parametrize("temperature", [5e-324, 2.225073858507e-311, 1e-38, 1e-6, 1e-5,
                                         0.00999])
def test_a_temperature_too_small_to_divide_by_is_greedy(policy, temperature):
    """2.2e-311 made ``logits / temperature`` inf and the sampler raise (a 500 from
    ``spadekit serve``, found by its fuzzer). Below MIN_TEMPERATURE (0.01) it is greedy on
    every backend: the same tokens and logprobs as temperature 0, seeded or not."""
    tiny = policy.generate([req(c, temperature=temperature, max_new_tokens=12, seed=s)
                            for c, s in zip(CHATS, (None, 3, 4, None))])
    greedy = policy.generate([req(c, temperature=0, max_new_tokens=12) for c in CHATS])
    for t, g in zip(tiny, greedy):
        assert t.token_ids == g.token_ids and t.logprobs == pytest.approx(g.logprobs, abs=TOL)
        assert all(math.isfinite(x) for x in t.logprobs)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.0, max_value=4.0, allow_subnormal=True))
def test_sampling_params_store_a_temperature_below_the_minimum_as_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    if temperature < MIN_TEMPERATURE:
        assert params.temperature == 0.0
    else:
        assert params.temperature == temperature  # anything else is kept as given


# -- stopping --------------------------------------------------------------------------------

def test_max_new_tokens_gives_length(policy):
    gens = policy.generate([req(CHATS[3], temperature=0, max_new_tokens=n) for n in (1, 4)])
    for g, n in zip(gens, (1, 4)):
        if g.token_ids[-1] not in policy.stop_ids:
            assert g.finish_reason == "length" and len(g.token_ids) == n


def test_stop_string_keeps_completing_tokens_and_cuts_text(policy):
    tok = policy.tokenizer
    full = policy.generate([req(CHATS[2], temperature=0, max_new_tokens=40)])[0]
    text = tok.decode(full.token_ids, skip_special_tokens=True)
    def plain(ch):
        return ch.isascii() and ch.isprintable()

    tail = text[3:]  # a stop string past the first tokens
    singles = [ch for ch in tail if plain(ch)]
    pairs = [tail[i:i + 2] for i in range(len(tail) - 1) if plain(tail[i]) and plain(tail[i + 1])]
    stops = singles[:1] + pairs[:1]
    assert stops, f"no printable ASCII text in the greedy continuation {text!r}"
    checked = 0
    for stop in stops:
        # the expected result: the shortest prefix of the tokens whose text holds the stop
        k = next((k for k in range(1, len(full.token_ids) + 1)
                  if stop in tok.decode(full.token_ids[:k], skip_special_tokens=True)), None)
        if k is None:
            continue
        g = policy.generate([req(CHATS[2], temperature=0, max_new_tokens=40,
                                 stop=("never-appears-here", stop))])[0]
        assert g.finish_reason == "stop"
        assert g.token_ids == full.token_ids[:k]
        expected, found = cut_at_stop(tok.decode(full.token_ids[:k], skip_special_tokens=True),
                                      (stop,))
        assert found and g.text == expected and g.text.endswith(stop)
        assert len(g.logprobs) == k
        checked += 1
    assert checked
    # a plain string is accepted as one stop string
    assert SamplingParams(stop="\n").stop == ("\n",)


def test_text_is_cut_right_after_the_stop_string(policy):
    # a stop string completed in the middle of a token: the token is kept, the text is cut
    full = policy.generate([req(CHATS[4], temperature=0, max_new_tokens=30)])[0]
    tok = policy.tokenizer
    text = tok.decode(full.token_ids, skip_special_tokens=True)
    assert cut_at_stop(text + "abcSTOPdef", ("STOP", "cS")) == (text + "abcS", True)
    assert cut_at_stop("xyz", ("q",)) == ("xyz", False)


def test_end_of_turn_token_stops():
    p = fresh_policy()
    eot = p.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eot in p.stop_ids
    with torch.no_grad():  # make <|im_end|> the model's first choice everywhere
        p.model.lm_head.bias = torch.nn.Parameter(torch.zeros(p.model.config.vocab_size))
        p.model.lm_head.bias[eot] = 100.0
    for t in (0.0, 1.0):
        g = p.generate([req(CHATS[0], temperature=t, max_new_tokens=20, seed=1)])[0]
        assert g.token_ids == [eot] and g.finish_reason == "stop" and g.text == ""
        assert g.logprobs[0] == pytest.approx(0.0, abs=1e-4)
        assert_logprobs_exact(p, g, t)


def test_finish_reasons_are_consistent_over_many_samples(policy):
    n = 40
    gens = policy.generate([req(CHATS[i % len(CHATS)], temperature=1.0, max_new_tokens=n,
                                seed=100 + i) for i in range(12)])
    stopped = 0
    for g in gens:
        assert all(t not in policy.stop_ids for t in g.token_ids[:-1])
        if g.token_ids[-1] in policy.stop_ids:
            assert g.finish_reason == "stop"
            stopped += 1
        else:
            assert g.finish_reason == "length" and len(g.token_ids) == n
        assert "<|im_end|>" not in g.text
        assert_logprobs_exact(policy, g, 1.0)
    assert stopped >= 1, "no sample reached an end-of-turn token"


# -- rendering -------------------------------------------------------------------------------

def _template_ids(tokenizer, messages, **kw) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kw)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return list(out)


def test_render_equals_tokenizers_own_template_ids(policy):
    tok = policy.tokenizer
    for chat in CHATS:
        for agp in (True, False):
            assert policy.render(chat, add_generation_prompt=agp) == \
                _template_ids(tok, chat, add_generation_prompt=agp)
    tools = [{"type": "function", "function": {"name": "move", "parameters": {}}}]
    assert policy.render(CHATS[0], tools=tools) == \
        _template_ids(tok, CHATS[0], add_generation_prompt=True, tools=tools)
    assert policy.render(CHATS[0], tools=tools) != policy.render(CHATS[0])


# -- invalid input ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": float("inf")},
    {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": 0},
    {"seed": 1 << 64}, {"seed": -(1 << 63) - 1}, {"seed": 1.5}, {"seed": True}, {"seed": "3"},
])
def test_invalid_sampling_params_raise(kwargs):
    with pytest.raises(PolicyError):
        SamplingParams(**kwargs)


def test_invalid_requests_raise(policy):
    with pytest.raises(PolicyError):
        GenerationRequest()
    with pytest.raises(PolicyError):
        GenerationRequest(prompt_ids=[1], messages=[{"role": "user", "content": "x"}])
    with pytest.raises(PolicyError):
        policy.generate([req([], temperature=0, max_new_tokens=2)])
    vocab = policy.model.get_input_embeddings().num_embeddings
    for bad in ([vocab], [-1], [5, vocab + 7]):
        with pytest.raises(PolicyError):
            policy.generate([req(bad, temperature=0, max_new_tokens=2)])
    # the policy still works after a refused request
    assert policy.generate([req(CHATS[0], temperature=0, max_new_tokens=2)])[0].token_ids


# -- registry and the hf loader --------------------------------------------------------------

def test_unknown_backend_prefix_falls_to_hf():
    assert registry.split_spec("tiny:3") == ("tiny", "tiny:3")
    assert registry.split_spec("nosuchbackend:foo") == ("hf", "nosuchbackend:foo")
    assert registry.split_spec("org/model") == ("hf", "org/model")
    with pytest.raises(PolicyError, match="nosuchbackend:foo"):
        load_policy("nosuchbackend:foo")


def test_nonexistent_local_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    for spec in (str(missing), f"hf:{missing}", f"{missing}::model.gguf", "./no/such/dir"):
        with pytest.raises(PolicyError, match="no such local model path"):
            load_policy(spec)
    with pytest.raises(PolicyError, match="no GGUF file"):
        load_policy(f"{tmp_path}::missing.gguf")
    with pytest.raises(PolicyError):
        load_policy(str(tmp_path))  # a directory with no model in it
    with pytest.raises(PolicyError):
        load_policy("")


def test_hub_id_not_in_offline_cache():
    with pytest.raises(PolicyError, match="not available offline"):
        load_policy("hf:spadekit-test/definitely-not-cached-model")


def test_local_directory_round_trip_and_missing_chat_template(policy, tmp_path):
    from spadekit.policy.loading import load_hf

    d = tmp_path / "saved"
    policy.model.save_pretrained(d)
    policy.tokenizer.save_pretrained(d)
    loaded = load_policy(f"hf:{d}", device="cpu", dtype="fp32", max_batch_size=3, seed=1)
    assert isinstance(loaded, HFPolicy) and loaded.max_batch_size == 3
    r = [req(CHATS[1], temperature=0, max_new_tokens=10)]
    assert loaded.generate(r)[0].token_ids == policy.generate(r)[0].token_ids
    assert next(loaded.model.parameters()).dtype == torch.float32
    bf16 = load_hf(str(d), dtype="bf16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16

    bare = tmp_path / "no-template"
    policy.model.save_pretrained(bare)
    tok = load_policy("tiny").tokenizer
    tok.chat_template = None
    tok.save_pretrained(bare)
    for f in bare.glob("chat_template*"):
        f.unlink()
    with pytest.raises(PolicyError, match="no chat template"):
        load_policy(str(bare))
    # a template can be supplied
    from spadekit.policy.tiny import CHAT_TEMPLATE
    assert load_hf(str(bare), chat_template=CHAT_TEMPLATE).render(CHATS[0]) == \
        policy.render(CHATS[0])
    with pytest.raises(PolicyError, match="dtype"):
        load_hf(str(d), dtype="int3")
    with pytest.raises(PolicyError, match="max_batch_size"):
        load_hf(str(d), max_batch_size=0)


def test_device_and_dtype_helpers():
    from spadekit.policy.loading import choose_device, choose_dtype

    assert choose_device("cpu") == "cpu"
    assert choose_device(None) in ("cpu", "cuda")
    assert choose_dtype(None, "cpu") == torch.float32
    assert choose_dtype(None, "cuda") == torch.bfloat16
    assert choose_dtype("bf16") == torch.bfloat16 and choose_dtype(torch.float16) == torch.float16
    with pytest.raises(PolicyError):
        choose_device("not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(PolicyError, match="CUDA"):
            choose_device("cuda")


def test_register_backend_type_checks(monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    for bad_name in (None, "", "a:b", 3):
        with pytest.raises(TypeError):
            registry.register_backend(bad_name, lambda spec, **kw: None)
    for bad_loader in (None, 42, "no_colon_here"):
        with pytest.raises(TypeError):
            registry.register_backend("mine", bad_loader)
    with pytest.raises(ValueError):
        registry.register_backend("tiny", lambda spec, **kw: None)

    seen = {}

    def loader(spec, **options):
        seen.update(spec=spec, **options)
        return load_policy("tiny")

    registry.register_backend("mine", loader)
    assert "mine" in registry.backends()
    assert isinstance(load_policy("mine:abc", seed=4), HFPolicy)
    assert seen == {"spec": "mine:abc", "seed": 4}
    registry.register_backend("broken", lambda spec, **kw: object())
    with pytest.raises(PolicyError, match="not a Policy"):
        load_policy("broken")
    registry.register_backend("lazy", "spadekit.policy.tiny:load_tiny_policy")
    assert isinstance(load_policy("lazy"), HFPolicy)
    registry.register_backend("gone", "spadekit.no_such_module:f")
    with pytest.raises(PolicyError, match="not available"):
        load_policy("gone")
