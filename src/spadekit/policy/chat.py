"""Token-exact incremental chat rendering for multi-turn rollouts.

A conversation's training sequence is built turn by turn: the rendered prompt, the sampled ids
exactly as sampled (never re-tokenised: no multi-turn token drift), then the template text that
closes the turn and wraps the next observation. ``ChatRenderer`` learns once per tokenizer how
the template wraps a user turn, so each observation costs one small tokenisation; a template
that does not render turns independently falls back to full renders and says so (``regular`` is
False). Content is escaped (``base.escape_content``), so an incremental turn encodes exactly as
the full render does.
"""

from __future__ import annotations

import os
from typing import Any

from spadekit.policy.base import encode_text, escape_content
from spadekit.policy.base import render_text as _render_text

_SENTINELS = ("\x00SPADEKIT-A\x00", "\x00SPADEKIT-B\x00")


class ChatRenderer:
    def __init__(self, tokenizer: Any, stop_token_texts: tuple[str, ...] = (),
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop_token_texts = tuple(t for t in stop_token_texts if t)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        """Template options (``enable_thinking`` ...) used for every render."""
        self.regular, self.closing, self.user_open, self.user_close = self._learn()
        self._prompt_cache: dict[tuple[str, str], tuple[str, str] | None] = {}

    def _render(self, messages: list[dict], add_generation_prompt: bool,
                tools: list[dict] | None = None) -> str:
        return _render_text(self.tokenizer, messages, add_generation_prompt, tools,
                            self.chat_template_kwargs)

    def _learn(self) -> tuple[bool, str, str, str]:
        """Find ``closing`` (after assistant content), and the text around a user message up to
        the next generation prompt, and check they do not depend on position or content."""
        a, b = _SENTINELS
        try:
            shapes = []
            for content, answer in ((a, b), (b, a)):
                base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
                prompt = self._render(base, True)
                done = self._render(base + [{"role": "assistant", "content": answer}], False)
                more = self._render(base + [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": content}], True)
                if not done.startswith(prompt + answer) or not more.startswith(done):
                    return False, "", "", ""
                closing = done[len(prompt) + len(answer):]
                rest = more[len(done):]
                i = rest.find(content)
                if i < 0:
                    return False, "", "", ""
                shapes.append((closing, rest[:i], rest[i + len(content):]))
            if shapes[0] != shapes[1]:
                return False, "", "", ""
            return (True,) + shapes[0]
        except Exception:
            return False, "", "", ""

    def prompt_ids(self, system: str, observation: str,
                   tools: list[dict] | None = None) -> list[int]:
        return encode_text(self.tokenizer, self.prompt_text(system, observation, tools))

    def prompt_text(self, system: str, observation: str,
                    tools: list[dict] | None = None) -> str:
        """Text of ``[system, user(observation)]`` with the generation prompt: the same as
        rendering the template, but the part around the observation is rendered once per
        (system prompt, tools) and reused for every episode."""
        import json

        key = (system, json.dumps(tools, sort_keys=True) if tools else "")
        shape = self._prompt_cache.get(key)
        if shape is None:
            sentinel = _SENTINELS[0]
            text = self._render([{"role": "system", "content": system},
                                 {"role": "user", "content": sentinel}], True, tools)
            i = text.find(sentinel)
            shape = (text[:i], text[i + len(sentinel):]) if i >= 0 and self.regular else None
            if len(self._prompt_cache) < 256:
                self._prompt_cache[key] = shape
        if shape is None:
            return self._render([{"role": "system", "content": system},
                                 {"role": "user", "content": observation}], True, tools)
        return shape[0] + escape_content(self.tokenizer, observation) + shape[1]

    def _closing(self, closing: str, sampled_end: bool) -> str:
        if sampled_end:
            for stop in self.stop_token_texts:
                if closing.startswith(stop):
                    return closing[len(stop):]
        return closing

    def observation_text(self, messages: list[dict], sampled_end: bool, observation: str,
                         tools: list[dict] | None = None) -> tuple[str, bool]:
        """The text to append after an assistant turn (``messages[-1]``) so that the next
        observation is in the prompt, ending with the generation prompt.

        ``sampled_end``: the model itself sampled an end-of-turn token, so the part of the
        closing text that token stands for is not added again. Returns the text and whether it
        is exact (a full re-render of the conversation gives the same tokens around the
        sampled ones); inexact happens only for templates that rewrite earlier turns."""
        if self.regular:
            return (self._closing(self.closing, sampled_end) + self.user_open
                    + escape_content(self.tokenizer, observation) + self.user_close), True
        prompt = self._render(messages[:-1], True, tools)
        content = escape_content(self.tokenizer, messages[-1]["content"])
        before = self._render(messages, False, tools)
        after = self._render(messages + [{"role": "user", "content": observation}], True,
                             tools)
        if before.startswith(prompt + content) and after.startswith(before):
            return self._closing(before[len(prompt) + len(content):], sampled_end) \
                + after[len(before):], True
        return after[len(os.path.commonprefix([before, after])):], False

    def closing_ids(self, sampled_end: bool) -> list[int]:
        """Ids that close the final assistant turn (so the sequence re-renders completely)."""
        closing = self._closing(self.closing, sampled_end) if self.regular else ""
        return encode_text(self.tokenizer, closing) if closing else []
