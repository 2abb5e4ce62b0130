"""Grammar-constrained sampling in the ``hf`` sampler (``SamplingParams.grammar``): a reply
stays inside its grammar on every seed, logprobs are those of the distribution it was drawn
from (renormalised over the allowed tokens), a seeded request is reproducible and a request
without a grammar is untouched in the same batch; backends that cannot constrain refuse, and a
grammar that does not compile is a typed error. The model is the in-code tiny transformer."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("llguidance")
torch = pytest.importorskip("torch")

from spadekit.policy.base import (CapabilityError, GenerationRequest, PolicyError,  # noqa: E402
                                  SamplingParams)
from spadekit.policy.grammar import GrammarError  # noqa: E402
from spadekit.policy.tiny import load_tiny_policy, tiny_tokenizer  # noqa: E402

YES_NO = 'start: "yes" | "no" | "maybe so"'
PROMPT = [{"role": "user", "content": "Well?"}]


def _ask(policy, grammar, seed, temperature=1.0, max_new_tokens=16):
    return policy.generate([GenerationRequest(messages=PROMPT, params=SamplingParams(
        temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
        grammar=grammar))])[0]


def test_every_seeded_reply_is_in_the_grammar_and_ends_there():
    policy = load_tiny_policy(seed=0)
    texts = set()
    for seed in range(40):
        gen = _ask(policy, YES_NO, seed)
        assert gen.text in ("yes", "no", "maybe so") and gen.finish_reason == "stop"
        assert gen.token_ids[-1] in policy.stop_ids
        texts.add(gen.text)
    assert len(texts) >= 2  # it samples, it is not a fixed answer
    free = {_ask(policy, None, seed).text for seed in range(5)}
    assert not free <= {"yes", "no", "maybe so"}  # the random model alone writes other text


def test_logprobs_are_those_of_the_distribution_within_the_grammar():
    policy = load_tiny_policy(seed=0)
    gen = _ask(policy, 'start: "a" | "b"', seed=3)
    prompt = torch.tensor([gen.prompt_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=prompt).logits[0, -1].float()
    tok = policy.tokenizer
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    pair = torch.log_softmax(logits[[a, b]], dim=0)
    expected = float(pair[0] if gen.token_ids[0] == a else pair[1])
    assert math.isclose(gen.logprobs[0], expected, rel_tol=1e-4, abs_tol=1e-5)
    # once the grammar is complete only the end tokens are allowed: renormalised over them
    with torch.no_grad():
        after = policy.model(input_ids=torch.tensor([gen.prompt_ids + gen.token_ids[:1]])
                             ).logits[0, -1].float()
    ends = sorted(policy.stop_ids)
    end = torch.log_softmax(after[ends], dim=0)[ends.index(gen.token_ids[1])]
    assert math.isclose(gen.logprobs[1], float(end), rel_tol=1e-4, abs_tol=1e-5)


def test_a_seeded_request_repeats_and_a_free_request_in_the_batch_is_untouched():
    policy = load_tiny_policy(seed=0)
    free = GenerationRequest(messages=PROMPT, params=SamplingParams(max_new_tokens=12, seed=7))
    ruled = GenerationRequest(messages=PROMPT, params=SamplingParams(
        max_new_tokens=12, seed=8, grammar=YES_NO))
    alone = policy.generate([free])[0]
    first = policy.generate([free, ruled])
    second = policy.generate([free, ruled])
    assert first[0].token_ids == alone.token_ids == second[0].token_ids
    assert first[1].token_ids == second[1].token_ids
    assert first[1].text in ("yes", "no", "maybe so")


def test_greedy_under_a_grammar_takes_the_likeliest_allowed_token():
    policy = load_tiny_policy(seed=0)
    gen = _ask(policy, 'start: "a" | "b"', seed=None, temperature=0.0)
    prompt = torch.tensor([gen.prompt_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=prompt).logits[0, -1]
    tok = policy.tokenizer
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    assert gen.text == ("a" if logits[a] >= logits[b] else "b")


def test_a_grammar_that_does_not_compile_is_a_typed_error():
    policy = load_tiny_policy(seed=0)
    with pytest.raises(GrammarError, match="does not compile"):
        _ask(policy, "start: undefined_rule", seed=0)
    with pytest.raises(PolicyError, match="grammar must be a non-empty string"):
        SamplingParams(grammar="")


def test_a_backend_that_cannot_constrain_refuses_a_grammar():
    from spadekit.policy.scripted import ScriptedPolicy

    policy = ScriptedPolicy(tiny_tokenizer(), lambda _ids, _text: "anything at all")
    assert _ask(policy, None, seed=0).text == "anything at all"
    with pytest.raises(CapabilityError, match="cannot follow a grammar"):
        _ask(policy, YES_NO, seed=0)
