"""Grammar-constrained sampling for the in-process sampler (``SamplingParams.grammar``).

A grammar is Lark text in llguidance's dialect (as vLLM's ``guidance`` backend reads it).
``Constraint`` follows one request: :meth:`Constraint.allowed` gives the tokens that keep the reply
inside the grammar (end-of-turn only once complete), :meth:`Constraint.consume` advances it. The
sampler draws from the model's distribution renormalised over the allowed tokens, and each
logprob is under that distribution, as vLLM reports it. Failures are typed: no llguidance
(``CapabilityError``), a grammar that does not compile or a refused token (``GrammarError``);
never a silent unconstrained sample.
"""

from __future__ import annotations

import weakref
from typing import Any

from spadekit.policy.base import CapabilityError, PolicyError

__all__ = ["Constraint", "GrammarError", "constraint", "refuse_grammar"]


class GrammarError(PolicyError):
    """A grammar that does not compile, or a generation that left it."""

    reason = "grammar"


def _llg():
    try:
        import llguidance
        import llguidance.hf
    except ImportError as exc:
        raise CapabilityError("a grammar-constrained request needs llguidance (pip install "
                              "'spadekit[train]')") from exc
    return llguidance


_TOKENIZERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
"""Each policy's llguidance tokenizer, kept as long as the policy lives."""


def _tokenizer(policy: Any, stop_ids) -> Any:
    """llguidance's view of ``policy.tokenizer`` with ``stop_ids`` as its end tokens, built
    once per policy (about half a second)."""
    cached = _TOKENIZERS.get(policy)
    if cached is not None:
        return cached
    llg = _llg()
    try:
        tok = llg.hf.from_tokenizer(policy.tokenizer, eos_token=sorted(stop_ids))
    except (ValueError, TypeError) as exc:
        raise CapabilityError(f"{getattr(policy, 'name', 'policy')}: llguidance cannot read "
                              f"its tokenizer: {exc}") from exc
    _TOKENIZERS[policy] = tok
    return tok


class Constraint:
    """One request's grammar state (see the module)."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        llg = _llg()
        try:
            compiled = llg.LLMatcher.grammar_from_lark(grammar)
        except (ValueError, RuntimeError) as exc:
            raise GrammarError(f"the grammar does not compile: {exc}") from exc
        self.matcher = llg.LLMatcher(tokenizer, compiled, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {self.matcher.get_error()}")

    def allowed(self, vocab: int):
        """A bool tensor over ``vocab`` token ids: True where the token keeps the reply inside
        the grammar. ``GrammarError`` when no token does."""
        import torch

        raw = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.uint8)
        bits = ((raw.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()
        mask = torch.zeros(vocab, dtype=torch.bool)
        n = min(vocab, bits.numel())
        mask[:n] = bits[:n].bool()
        if not bool(mask.any()):
            raise GrammarError("no token continues the grammar: "
                               f"{self.matcher.get_error() or 'it is complete'}")
        return mask

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} leaves the grammar: {self.matcher.get_error()}")


def constraint(policy: Any, grammar: str | None, stop_ids) -> Constraint | None:
    """The :class:`Constraint` of one request of ``policy`` (None without a grammar)."""
    if grammar is None:
        return None
    return Constraint(_tokenizer(policy, stop_ids), grammar)


def refuse_grammar(policy: Any, requests) -> None:
    """``CapabilityError`` when a request of ``requests`` carries a grammar: for backends that
    cannot constrain their sampling (an unconstrained reply is never passed off as one)."""
    if any(r.params.grammar is not None for r in requests):
        raise CapabilityError(f"{getattr(policy, 'name', type(policy).__name__)} cannot follow "
                              "a grammar (SamplingParams.grammar): use the hf sampler or the "
                              "vllm engine, or set designer.grammar to null")
