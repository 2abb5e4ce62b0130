"""The policy protocol: a batch of generation requests in, sampled tokens with logprobs out.

A request carries token ids or chat messages; a ``Generation`` carries the sampled ids, their
logprobs under the sampling distribution (``log_softmax(logits / temperature)``, before top-p:
what a training forward pass computes), the text and a finish reason. Backends are listed in
``spadekit.policy.registry``. ``render_text``/``encode_text`` (and :class:`TemplatePolicy`'s
``render``) are shared by every backend and the rollout engine: a special-token string inside
content or a tool schema is encoded as text; only the template's own markers become control
tokens.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from spadekit.common.errors import SpadekitError


class PolicyError(SpadekitError):
    """A policy backend failed (server unreachable, bad response, missing capability, ...)."""

    reason = "policy_error"


def seconds_from_env(name: str, default: float) -> float:
    """A timeout in seconds from the environment variable ``name`` (unset or empty: ``default``);
    anything but a positive finite number is a ``PolicyError`` naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise PolicyError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


class CapabilityError(PolicyError):
    """The backend cannot do what was asked (e.g. logprobs from a server that does not give them)."""

    reason = "capability"


MIN_TEMPERATURE = 1e-2
"""A temperature below this (but above 0) is greedy on every backend. ``logits / temperature``
overflows to ``inf`` for a small enough one (2.2e-311 did, in the transformers sampler's
float32); vLLM (0.32) silently raises any temperature below 0.01 to 0.01, so its logprobs would
not be those of the temperature asked for; and the trainer's PPO ratio at such a temperature
overflows (``exp`` of a log-ratio of 100 at 1e-5). The distribution is one token anyway."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy decoding (logprobs then come from the unscaled distribution); so does
    any temperature below ``MIN_TEMPERATURE``, which is stored as 0."""
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    """Generation ends once the decoded new text contains one of these; the tokens that completed
    the stop string are kept (token-exact), and the text is cut after it."""
    seed: int | None = None
    """Seed for this request's sampling stream; None draws from the backend's generator."""
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect) the reply must follow: tokens are drawn from the
    model's distribution renormalised over those the grammar allows, and logprobs are under
    that distribution (``spadekit.policy.grammar``). The ``hf`` sampler and the ``vllm``
    engine take it; other backends refuse it (``CapabilityError``). None: free text."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise PolicyError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.temperature < MIN_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, numbers.Integral)
                                      or not -(1 << 63) <= self.seed < (1 << 64)):
            raise PolicyError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if not 0 < self.top_p <= 1:
            raise PolicyError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise PolicyError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar):
            raise PolicyError(f"grammar must be a non-empty string or None, got "
                              f"{self.grammar!r:.60}")


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
               tools: list[dict[str, Any]] | None = None,
               chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Token ids of ``messages`` through the chat template (``chat_template_kwargs``: its
        extra variables, as :func:`render_text`)."""
        ...


class TemplatePolicy:
    """Base of the policies that render with their own ``tokenizer``'s chat template."""

    tokenizer: Any

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None,
               chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """:meth:`Policy.render` through :func:`render_text` and :func:`encode_text`;
        ``CapabilityError`` without a tokenizer."""
        if self.tokenizer is None:
            raise CapabilityError(f"{getattr(self, 'name', type(self).__name__)}: render() needs "
                                  "a tokenizer (pass tokenizer= a Hugging Face tokenizer or a "
                                  "local path)")
        return encode_text(self.tokenizer, render_text(self.tokenizer, messages,
                                                       add_generation_prompt, tools,
                                                       chat_template_kwargs))


def render_text(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None,
                chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template's text for ``messages`` (shared by every backend);
    ``chat_template_kwargs`` become template variables (``enable_thinking`` ...).

    Every string of ``messages`` and ``tools`` goes in through ``escape_content``, so a
    special-token string written inside content comes back escaped, and ``encode_text`` reads
    it as text, never as the control token; the template's own markers stay real
    (``plain_text`` gives the text as the template would have written it)."""
    kwargs: dict[str, Any] = {**{k: escape_structure(tokenizer, v)
                                 for k, v in (chat_template_kwargs or {}).items()},
                              "tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = escape_structure(tokenizer, tools)
    return tokenizer.apply_chat_template(escape_structure(tokenizer, messages), **kwargs)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-rendered template text (no extra BOS/EOS: the template has them).
    Fast tokenizers go straight to their Rust backend (the same encoding). Content escaped by
    ``escape_content`` is encoded as text (the comment above ``_BREAK``)."""
    if _BREAK in text or _QUOTE in text:
        return _encode_escaped(tokenizer, text)
    backend = _backend(tokenizer)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``encode_text`` for many texts in one call (the Rust backend encodes them in parallel)."""
    if not texts:
        return []
    backend = _backend(tokenizer)
    if backend is None:
        return [encode_text(tokenizer, t) for t in texts]
    plain = [i for i, t in enumerate(texts) if _BREAK not in t and _QUOTE not in t]
    out: list[list[int]] = [[] for _ in texts]
    for i, e in zip(plain, backend.encode_batch([texts[i] for i in plain],
                                                add_special_tokens=False)):
        out[i] = e.ids
    for i in set(range(len(texts))) - set(plain):
        out[i] = _encode_escaped(tokenizer, texts[i])
    return out


# -- special-token strings in content -----------------------------------------------------------
# Content is escaped before it meets the template: ``_BREAK`` goes inside each special-token
# string (after its first character), ``_QUOTE`` quotes the two marks themselves, so the
# template's own markers are the only control tokens in rendered text; ``encode_text`` splits at
# them as the tokenizer does and encodes each stretch with special strings read as text
# (docs/design/policy.md, "Special-token strings in content").

_BREAK = "\ufdd0"
_QUOTE = "\ufdd1"
_UNESCAPE = re.compile("\ufdd1(.)|\ufdd0", re.DOTALL)


def escape_content(tokenizer: Any, text: str) -> str:
    """``text`` with every special-token string of ``tokenizer`` broken (see the section
    above); ``plain_text`` gives ``text`` back. Text without them (nearly all) is returned
    unchanged."""
    if not isinstance(text, str):
        return text
    table = _specials(tokenizer)
    quoted = _BREAK in text or _QUOTE in text
    if not quoted and not any(s in text for s in table.strings):
        return text
    if quoted:
        text = text.replace(_QUOTE, _QUOTE + _QUOTE).replace(_BREAK, _QUOTE + _BREAK)
    if table.find is None:
        return text
    parts, last = [], 0
    for m in table.find.finditer(text):  # every start, overlapping ones included
        cut = m.start() + 1
        parts += [text[last:cut], _BREAK]
        last = cut
    parts.append(text[last:])
    return "".join(parts)


def escape_structure(tokenizer: Any, value: Any) -> Any:
    """``escape_content`` on every string inside ``value`` (messages, tool schemas: dict keys
    and values, list items); other values as they are."""
    if isinstance(value, str):
        return escape_content(tokenizer, value)
    if isinstance(value, dict):
        return {escape_structure(tokenizer, k): escape_structure(tokenizer, v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [escape_structure(tokenizer, v) for v in value]
    if isinstance(value, tuple):
        return tuple(escape_structure(tokenizer, v) for v in value)
    return value


def plain_text(text: str) -> str:
    """Escaped text (``escape_content``, ``render_text``) as it reads: the marks removed."""
    if _BREAK not in text and _QUOTE not in text:
        return text
    return _UNESCAPE.sub(lambda m: m.group(1) or "", text)


class _Specials:
    """What escaping and encoding need to know about one tokenizer's special tokens."""

    def __init__(self, tokenizer: Any, size: int) -> None:
        self.size = size
        added = _added_tokens(tokenizer)
        by_text = {str(getattr(t, "content", t)): int(i) for i, t in added.items()
                   if getattr(t, "special", False)}
        for s in getattr(tokenizer, "all_special_tokens", None) or []:
            if isinstance(s, str) and s not in by_text:
                tid = tokenizer.convert_tokens_to_ids(s)
                if isinstance(tid, int):
                    by_text[s] = tid
        self.ids = frozenset(by_text.values())
        self.strings = tuple(sorted((s for s in by_text if len(s) > 1 and _BREAK not in s
                                     and _QUOTE not in s), key=len, reverse=True))
        alternatives = "|".join(re.escape(s) for s in self.strings)
        self.find = re.compile(f"(?=(?:{alternatives}))") if self.strings else None
        self.split = re.compile(alternatives) if self.strings else None
        self._plain: tuple[Any, Any] | None = None
        self._lock = threading.Lock()

    def plain_backends(self, backend: Any) -> tuple[Any, Any]:
        """Private copies of the Rust tokenizer that read special-token strings as text: one
        for a stretch at the start of the text, one for a stretch after a marker (differs only
        for a Metaspace pre-tokenizer that prepends its space to the first stretch alone)."""
        with self._lock:
            if self._plain is None:
                from tokenizers import Tokenizer

                data = json.loads(backend.to_str())
                first = Tokenizer.from_str(json.dumps(data))
                first.encode_special_tokens = True
                rest = first
                if _never_prepend(data.get("pre_tokenizer")):
                    rest = Tokenizer.from_str(json.dumps(data))
                    rest.encode_special_tokens = True
                self._plain = (first, rest)
            return self._plain


_TABLES: "weakref.WeakKeyDictionary[Any, _Specials]" = weakref.WeakKeyDictionary()


def _specials(tokenizer: Any) -> _Specials:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    size = backend.get_vocab_size(with_added_tokens=True) if backend is not None \
        else len(tokenizer)
    try:
        table = _TABLES.get(tokenizer)
    except TypeError:  # not weakly referenceable: no cache
        return _Specials(tokenizer, size)
    if table is None or table.size != size:  # built, or tokens were added since
        table = _Specials(tokenizer, size)
        _TABLES[tokenizer] = table
    return table


def _added_tokens(tokenizer: Any) -> dict[int, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    get = getattr(backend, "get_added_tokens_decoder", None)
    if callable(get):
        return dict(get())
    return dict(getattr(tokenizer, "added_tokens_decoder", None) or {})


def _never_prepend(node: Any) -> bool:
    """Turn a Metaspace ``prepend_scheme: first`` (inside ``node``) into ``never``; whether
    there was one."""
    if not isinstance(node, dict):
        return False
    found = False
    if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
        node["prepend_scheme"] = "never"
        found = True
    for sub in node.get("pretokenizers") or []:
        found = _never_prepend(sub) or found
    return found


def _backend(tokenizer: Any) -> Any:
    """The tokenizer's Rust backend with special tokens read as tokens: a call
    ``tokenizer(..., split_special_tokens=True)`` leaves them read as text until the next call
    without it, which would turn the template's markers into text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(backend, "encode_special_tokens", False):
        backend.encode_special_tokens = False
    return backend


def _encode_escaped(tokenizer: Any, text: str) -> list[int]:
    """``encode_text`` of text holding escaped content (the section above)."""
    table = _specials(tokenizer)
    backend = _backend(tokenizer)
    if backend is not None:
        found = backend.encode(text, add_special_tokens=False)
        markers = [(a, b, int(i)) for i, (a, b) in zip(found.ids, found.offsets)
                   if i in table.ids]
        first, rest = table.plain_backends(backend)
        encode = lambda piece, start: (first if start == 0 else rest).encode(  # noqa: E731
            piece, add_special_tokens=False).ids
    else:
        markers = [(m.start(), m.end(), int(tokenizer.convert_tokens_to_ids(m.group())))
                   for m in (table.split.finditer(text) if table.split else ())]
        encode = lambda piece, start: list(tokenizer(  # noqa: E731
            piece, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    ids: list[int] = []
    pos = 0
    for a, b, tid in markers + [(len(text), len(text), None)]:
        if a > pos:
            ids += encode(plain_text(text[pos:a]), pos)
        if tid is not None:
            ids.append(tid)
        pos = max(pos, b)
    return ids


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut right after the first stop string it contains, and whether one was found."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return (text, False) if best is None else (text[:best], True)
