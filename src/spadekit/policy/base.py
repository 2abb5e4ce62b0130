"""The policy protocol: a batch of generation requests in, sampled tokens with logprobs out.

The agent and the designer are the same model behind one ``Policy``. A request carries either
token ids (the rollout engine's token-in/token-out path) or chat messages (rendered through the
tokenizer's chat template). A ``Generation`` carries the sampled ids, their logprobs under the
sampling distribution (``log_softmax(logits / temperature)``, before top-p truncation: the same
quantity a training forward pass computes), the decoded text and a finish reason.

Backends (``spadekit.policy.registry``): ``hf`` (transformers, CPU or GPU), ``tiny`` (a random
model built in code for tests), ``smollm2-135m`` (bundled default), ``openai`` (any
OpenAI-compatible server), ``vllm`` (in-process, GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from spadekit.common.errors import SpadekitError

CAPABILITIES = ("token_ids", "logprobs", "train")
"""What a backend can give: ``token_ids`` (token-in/token-out), ``logprobs`` of sampled tokens,
``train`` (a differentiable torch model behind it, so it can be updated in-process)."""


class PolicyError(SpadekitError):
    """A policy backend failed (server unreachable, bad response, missing capability, ...)."""

    reason = "policy_error"


class CapabilityError(PolicyError):
    """The backend cannot do what was asked (e.g. logprobs from a server that does not give them)."""

    reason = "capability"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy decoding (logprobs then come from the unscaled distribution)."""
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    """Generation ends once the decoded new text contains one of these; the tokens that completed
    the stop string are kept (token-exact), and the text is cut after it."""
    seed: int | None = None
    """Seed for this request's sampling stream; None draws from the backend's generator."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise PolicyError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PolicyError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise PolicyError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))


@dataclass
class GenerationRequest:
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    tools: list[dict[str, Any]] | None = None
    """OpenAI-style tool schemas passed to the chat template (messages requests only)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra chat-template options for this request (messages requests only), e.g.
    ``{"enable_thinking": False}``; the config's ``chat_template`` section per role."""

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.messages is None):
            raise PolicyError("a request needs exactly one of prompt_ids or messages")


@dataclass
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str
    """``stop`` (end-of-sequence token or a stop string) or ``length`` (max_new_tokens)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Policy(Protocol):
    """What the rollout engine, the designer and the trainer need from a model."""

    name: str
    capabilities: frozenset[str]
    tokenizer: Any
    """A Hugging Face tokenizer with a chat template (``apply_chat_template``, ``decode``)."""

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        """One ``Generation`` per request, in order."""
        ...

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of ``messages`` through the chat template."""
        ...


def render_text(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None,
                chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template's text for ``messages`` (shared by every backend);
    ``chat_template_kwargs`` become template variables (``enable_thinking`` ...)."""
    kwargs: dict[str, Any] = {**(chat_template_kwargs or {}), "tokenize": False,
                              "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(messages, **kwargs)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-rendered template text (no extra BOS/EOS: the template has them).
    Fast tokenizers go straight to their Rust backend (the same encoding, without the Python
    wrapper's per-call overhead, which dominated multi-turn bookkeeping)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``encode_text`` for many texts in one call (the Rust backend encodes them in parallel)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return [encode_text(tokenizer, t) for t in texts]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut right after the first stop string it contains, and whether one was found."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return (text, False) if best is None else (text[:best], True)
