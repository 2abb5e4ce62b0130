"""Thinking models: separate a turn's ``<think>...</think>`` block from what it says.

The environment sees only the answer; the trainer still trains every sampled token.
``split_thinking(text) -> (thinking, visible)``: with a closing tag, ``visible`` is the text after
the LAST one (leading whitespace removed) and ``thinking`` all before it; with an opening tag not
closed after it, everything from it on is thinking and ``visible`` the text before it (trailing
whitespace removed); without tags, ``("", text)``. Tags match case-insensitively with inner
whitespace; only ``think`` counts. Linear time. ``ends_inside_thinking(text, prompt_opens)``:
whether a reply ended inside an unclosed block (``prompt_opens``: the template opened it).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

__all__ = ["split_thinking", "has_thinking", "ends_inside_thinking", "prompt_opens_thinking",
           "count_thinking_cut"]

_OPEN = re.compile(r"<\s*think\s*>", re.IGNORECASE)
_CLOSE = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)


def split_thinking(text: str) -> tuple[str, str]:
    """``(thinking, visible)`` of one assistant turn; ``thinking + visible`` covers the text up
    to the whitespace trimmed at the seam. See the module docstring for the rules."""
    if "think" not in text.lower():
        return "", text
    last_close = None
    for last_close in _CLOSE.finditer(text):
        pass
    cut = last_close.end() if last_close is not None else 0
    rest = text[cut:]
    opened = _OPEN.search(rest)
    if opened is not None:  # unclosed: from the opening tag on is thinking
        before = rest[:opened.start()]
        visible = before.strip() if cut else before.rstrip()
        return text[:cut] + rest[opened.start():], visible
    if last_close is None:
        return "", text
    return text[:cut], rest.lstrip()


def has_thinking(text: str) -> bool:
    """Whether ``split_thinking`` would take anything out of ``text``."""
    return bool(split_thinking(text)[0])


def ends_inside_thinking(text: str, prompt_opens: bool = False) -> bool:
    """Whether ``text`` ends inside an unclosed ``<think>`` block (see the module docstring)."""
    if prompt_opens and _CLOSE.search(text) is None:
        return True
    if "think" not in text.lower():
        return False
    last_close = None
    for last_close in _CLOSE.finditer(text):
        pass
    return _OPEN.search(text, last_close.end() if last_close is not None else 0) is not None


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether a rendered prompt ends with an opening ``<think>`` (the reply starts inside it)."""
    tail = prompt_text.rstrip()
    last_open = None
    for last_open in _OPEN.finditer(tail[-64:]):
        pass
    return last_open is not None and last_open.end() == len(tail[-64:])


def count_thinking_cut(generations: Iterable[Any], tokenizer: Any = None) -> int:
    """How many generations (objects with ``text`` and ``prompt_ids``, e.g.
    ``spadekit.policy.base.Generation``) end inside an unclosed thinking block; with a
    ``tokenizer`` the end of each prompt is decoded to see whether the template opened the
    block itself."""
    count = 0
    for gen in generations:
        opens = False
        if tokenizer is not None and getattr(gen, "prompt_ids", None):
            try:
                opens = prompt_opens_thinking(tokenizer.decode(list(gen.prompt_ids[-16:])))
            except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: text only
                opens = False
        count += ends_inside_thinking(gen.text, opens)
    return count
