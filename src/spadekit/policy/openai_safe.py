"""Untrusted text sent to an OpenAI-compatible server as text, never as forged control tokens.

Token-id prompts need nothing (``render`` already escapes special-token strings in content).
Two paths send text, which the server tokenizes with its special tokens live:
:func:`text_of_ids` decodes ids so that only real control ids come back as control strings (every
run of ordinary ids is decoded, then broken with ``escape_content``); :func:`neutral_messages`
breaks every special-token string in chat content (the tokenizer's own list, else the common
families: ChatML/Qwen/Llama 3/Phi ``<|...|>``, ``<s>``, Gemma's turns, ``[INST]``). The break is
``escape_content``'s (U+FDD0 after a token's first character).
"""

from __future__ import annotations

import re
from typing import Any

from spadekit.policy.base import _BREAK, escape_content, escape_structure

__all__ = ["neutral_messages", "neutral_value", "text_of_ids"]

GENERIC_SPECIALS = re.compile(
    r"<\|[^<>|\s]{0,48}\|>|</?s>|<(?:start|end)_of_turn>|\[/?INST\]|<(?:bos|eos|pad)>")
"""Special-token spellings of the common chat templates (used without a tokenizer)."""


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            ids.update(tokenizer.convert_tokens_to_ids([token.content]))
    return {int(i) for i in ids if isinstance(i, int) and i >= 0}


def text_of_ids(tokenizer: Any, ids: list[int]) -> str:
    """``ids`` as text a server re-tokenizes to the same control tokens and no others."""
    specials = _special_ids(tokenizer)
    out: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            out.append(escape_content(tokenizer, tokenizer.decode(run, skip_special_tokens=False)))
            run.clear()

    for i in ids:
        if int(i) in specials:
            flush()
            out.append(tokenizer.decode([int(i)], skip_special_tokens=False))
        else:
            run.append(int(i))
    flush()
    return "".join(out)


def _generic(text: str) -> str:
    return GENERIC_SPECIALS.sub(lambda m: m.group(0)[0] + _BREAK + m.group(0)[1:], text)


def _generic_structure(value: Any) -> Any:
    if isinstance(value, str):
        return _generic(value)
    if isinstance(value, dict):
        return {_generic_structure(k): _generic_structure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_generic_structure(v) for v in value]
    return value


def neutral_value(tokenizer: Any, value: Any) -> Any:
    """Every string inside ``value`` (a tool schema) broken as in :func:`neutral_messages`."""
    if tokenizer is not None:
        value = escape_structure(tokenizer, value)
    return _generic_structure(value)


def neutral_messages(tokenizer: Any, messages: list[dict]) -> list[dict]:
    """``messages`` with every special-token string in their content (and any other string in
    them) broken, for a server that renders them itself. Keys like ``role`` are left alone."""
    out = []
    for message in messages:
        m = dict(message)
        for key, value in message.items():
            if key == "role":
                continue
            m[key] = neutral_value(tokenizer, value)  # its own list and the common families
        out.append(m)
    return out
