"""Untrusted text sent to an OpenAI-compatible server as text, never as forged control tokens.

``OpenAIPolicy`` sends token-id prompts where the server takes them; the ids are built by
``render``, which already encodes special-token strings inside message content as ordinary
text (``spadekit.policy.base.escape_content``). Two paths send text instead, and the server
tokenizes that text with its special tokens live:

- a server that takes no token-id prompts gets the prompt as text: :func:`text_of_ids` decodes
  the ids so that only the real control ids come back as control strings, and every run of
  ordinary ids is decoded and then broken with ``escape_content`` (a ``<|im_end|>`` that was
  text stays text);
- without a tokenizer (or without ``/v1/completions``) messages go to ``/v1/chat/completions``
  and the server renders them: :func:`neutral_messages` breaks every special-token string in
  their content (the tokenizer's own list when there is one; else the common families:
  ``<|...|>`` as in ChatML, Qwen, Llama 3 and Phi, ``<s>``/``</s>``, Gemma's
  ``<start_of_turn>``/``<end_of_turn>``, ``[INST]``/``[/INST]``).

The break is the one ``escape_content`` uses (U+FDD0 after a token's first character), so the
model reads the same ordinary characters with one noncharacter among them.
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
