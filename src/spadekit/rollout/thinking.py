"""Thinking models: separate a turn's ``<think>...</think>`` block from what it says.

Thinking models (Qwen3 with thinking on, DeepSeek-R1 distills, ...) write their reasoning in a
``<think>...</think>`` block before the answer. In an episode the environment must see only the
answer (a ``\\boxed{...}`` inside the reasoning is a draft, not a move), while the trainer still
trains every sampled token, the thinking included (``spadekit.rollout.engine`` strips the thinking from
the action only; the trajectory's tokens, ``loss_mask`` and messages keep it).

``split_thinking(text) -> (thinking, visible)``:

- Closed thinking: ``visible`` is the text after the LAST closing tag, with its leading
  whitespace removed (models put ``"\\n\\n"`` after ``</think>``); ``thinking`` is everything
  before it, tags included (so a template that put the opening ``<think>`` in the prompt, and
  the model's text starts inside the block with only a ``</think>``, works the same).
- Unclosed thinking: an opening ``<think>`` with no closing tag after it (the turn ran out of
  tokens mid-thought): everything from that ``<think>`` on is thinking and ``visible`` is the
  text before it, with its trailing whitespace removed (usually empty). This also applies to an
  opening tag that follows the last closing tag.
- No tag at all: ``("", text)``, the text unchanged.

Tags are matched case-insensitively and tolerate whitespace inside them (``< /Think >``).
Only ``think`` tags count (not ``thinking``). Linear time: one regular-expression scan whose
patterns cannot backtrack.

``ends_inside_thinking(text, prompt_opens=False)``: whether a reply ended inside an unclosed
thinking block, so that what the role was asked for (a hint, a program, a move) was never
written: the budget ran out mid-thought. ``prompt_opens``: the chat template already put the
opening ``<think>`` at the end of the prompt (the reply then starts inside the block, and only a
closing tag ends it). The loop counts such replies per role as ``thinking_cut/<role>``
(``count_thinking_cut``) and shows them in the round table.
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
