"""Format aids: help a small model write the reply format, without training on the help.

* a **response prefix** (``RolloutConfig.response_prefix``): text at the start of every
  assistant turn (``\\boxed{`` for games); prompt tokens, never trained; the environment and the
  trajectory's message get prefix + reply, so a re-render matches the ids;
* **format demonstrations** (``RolloutConfig.demonstrations``): two example turns of a toy task
  before the first observation, prompt tokens too;
* an **action grammar** (``RolloutConfig.action_grammar``, games): each reply is decoded within
  one ``\\boxed{...}`` action of at most :data:`ACTION_WORDS` short words.

The designer's prefix is ``DesignerConfig.response_prefix`` (``designer_requests``,
``with_prefix``). Every aid is off in the paper presets. Why: docs/design/rollout.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spadekit.common.errors import ConfigError

SETTINGS = ("games", "tooluse")

DEMONSTRATIONS: dict[str, tuple[dict[str, str], ...]] = {
    "games": (
        {"role": "user", "content": "A number between 1 and 10 is hidden. Reply in \\boxed{} "
                                    "with 'guess N'. 3 turns."},
        {"role": "assistant", "content": "\\boxed{guess 5}"},
        {"role": "user", "content": "Too low. 2 turns left."},
        {"role": "assistant", "content": "\\boxed{guess 8}"},
    ),
    "tooluse": (
        {"role": "user", "content": "Task: find the opening hours of the library. Tools: "
                                    "lookup(place)."},
        {"role": "assistant", "content": '<tool_call>{"name": "lookup", "arguments": '
                                         '{"place": "library"}}</tool_call>'},
        {"role": "user", "content": 'Tool result: {"place": "library", "hours": "9-17"}'},
        {"role": "assistant", "content": "<answer>done</answer>"},
    ),
}
"""The built-in example turns of each setting: a toy task unrelated to the library games, so
they teach the format and not an answer."""


def check_rollout_aids(response_prefix: Any, demonstrations: Any,
                       action_grammar: Any = ()) -> None:
    """Raise ConfigError unless the agent's aids name known settings with string values."""
    if isinstance(action_grammar, str) or not all(d in GRAMMAR_SETTINGS
                                                  for d in action_grammar):
        raise ConfigError(f"rollout.action_grammar must list settings of "
                          f"{GRAMMAR_SETTINGS}, got {action_grammar!r}")
    if not isinstance(response_prefix, dict) or not all(
            k in SETTINGS and isinstance(v, str) for k, v in response_prefix.items()):
        raise ConfigError(f"rollout.response_prefix must map settings ({', '.join(SETTINGS)}) "
                          f"to strings, got {response_prefix!r}")
    if isinstance(demonstrations, str) or not all(d in SETTINGS for d in demonstrations):
        raise ConfigError(f"rollout.demonstrations must list settings ({', '.join(SETTINGS)}), "
                          f"got {demonstrations!r}")


ACTION_WORDS = 9
"""The most words (a command and its arguments, one space apart) an action may hold..."""
ACTION_WORD_CHARS = 16
"""...and the most characters of each: room for a kit command over eight 9-letter items or
any library game's solution, while a reply that runs on (``probe 13 2 8 1 5 8 ...``) is
closed after nine words. A reply of words fits ``cpu-kit``'s 48 tokens; one of odd
characters can still be cut by the budget."""
GRAMMAR_SETTINGS = ("games",)
"""The settings an action grammar exists for (tool use replies are tool calls)."""


def action_grammar_for(config: Any, setting: str) -> str | None:
    """The Lark grammar of one agent reply in ``setting`` (None when the aid is off there):
    the rest of a ``\\boxed{`` prefix, or a whole box without one, holding one action: 1 to
    :data:`ACTION_WORDS` words of 1 to :data:`ACTION_WORD_CHARS` characters one space apart,
    with no braces, backslashes, quotes or line breaks."""
    if setting not in getattr(config, "action_grammar", ()):
        return None
    head = "" if prefix_for(config, setting).endswith("\\boxed{") else '"\\\\boxed{" '
    word = f"[A-Za-z0-9,.:;()+*\\/=_-]{{1,{ACTION_WORD_CHARS}}}"
    return (f'start: {head}ACTION "}}"\n'
            f"ACTION: /{word}( {word}){{0,{ACTION_WORDS - 1}}}/\n")


def prefix_for(config: Any, setting: str) -> str:
    """The agent's response prefix in ``setting`` ('' when none)."""
    return getattr(config, "response_prefix", {}).get(setting, "")


def demonstration_messages(config: Any, setting: str) -> list[dict[str, str]]:
    """The example turns shown before the first observation in ``setting`` ([] when off)."""
    if setting not in getattr(config, "demonstrations", ()):
        return []
    return [dict(m) for m in DEMONSTRATIONS[setting]]


def opening_text(renderer: Any, system: str, demos: list[dict[str, str]], observation: str,
                 tools: list[dict] | None, prefix: str) -> str:
    """The first prompt of an episode: system, the demonstrations, the observation, the
    generation prompt, then the response prefix. Without demonstrations this is the renderer's
    fast ``prompt_text``; with them, the whole opening goes through the chat template."""
    if not demos:
        return renderer.prompt_text(system, observation, tools) + prefix
    messages = [{"role": "system", "content": system}, *demos,
                {"role": "user", "content": observation}]
    return renderer._render(messages, True, tools) + prefix


# -- the designer's prefix ---------------------------------------------------------------------


def designer_request(policy: Any, messages: list[dict], params: Any,
                     chat_template_kwargs: dict[str, Any] | None, prefix: str) -> Any:
    """The designer's generation request: chat messages, or with a prefix the rendered prompt
    plus the prefix as token ids (so the prefix is part of the prompt and never trained)."""
    from spadekit.policy.base import GenerationRequest, encode_text, render_text

    if not prefix:
        return GenerationRequest(messages=messages, params=params,
                                 chat_template_kwargs=chat_template_kwargs)
    if "token_ids" not in getattr(policy, "capabilities", frozenset()):
        raise ConfigError("designer.response_prefix needs a policy that takes token ids "
                          f"({getattr(policy, 'name', type(policy).__name__)} does not)")
    text = render_text(policy.tokenizer, messages, True, None, chat_template_kwargs) + prefix
    return GenerationRequest(prompt_ids=encode_text(policy.tokenizer, text), params=params)


def with_prefix(gens: list[Any], prefix: str) -> list[Any]:
    """Generations whose text starts with ``prefix`` (what the designer wrote, as the
    extractor and validator must read it); ids and logprobs are untouched."""
    if not prefix:
        return gens
    return [dataclasses.replace(g, text=prefix + g.text) for g in gens]
