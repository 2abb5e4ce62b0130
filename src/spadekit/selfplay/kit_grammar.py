"""The kit grammar: what the designer may write under ``designer.grammar: kit``.

:func:`kit_grammar` is a Lark grammar (llguidance's dialect, as vLLM's ``guidance`` backend
reads it) of the reply the kit warm start teaches: a python block importing ``KitEnv`` and the
four parts, one ``...Env(KitEnv)`` class with a theme, the parts with values from
:data:`VALUES`, an optional ``intro`` override, and the ``HINT`` line. All compositions are
allowed; every value it allows lies in the kit's ranges and meets its cross-parameter rules, so
what it accepts loads. The designer still chooses composition, parameters, items, theme,
flavour and hint (docs/designer.md).
"""

from __future__ import annotations

import itertools
import json
from typing import Sequence

from spadekit.envs.gamekit import LATEST
from spadekit.envs.procedural.kit import (COMMANDS, KIT_PARTS, SKILL_PARTS, SYMBOLS,
                                          kit_import)

__all__ = ["GRAMMARS", "VALUES", "designer_grammar", "kit_grammar", "part_options"]

GRAMMARS = ("kit",)
"""The values of ``designer.grammar`` besides None (free text)."""

VALUES = {
    "HiddenNumber": [(low, high) for low in (0, 1, 10)
                     for high in sorted({low + 19, low + 29, low + 49, low + 59, low + 99,
                                         50, 100, 200}) if high - low >= 19],
    "HiddenCode": [(length, symbols) for length in (3, 4, 5) for symbols in SYMBOLS],
    "HiddenCell": [(rows, cols) for rows in range(3, 8) for cols in range(3, 8)],
    "HiddenCause": (6, 7),
    "HiddenOrder": (4, 5),
    "ScoreSteep": (5, 6, 7, 8),
    "ScoreBanded": [(near, partial) for near in (0.8, 0.85, 0.9) for partial in (0.1, 0.2, 0.3)],
    "ScoreThrifty": [(cost, floor) for cost in (0.1, 0.15, 0.2) for floor in (0.1, 0.2, 0.3)],
    "looks": (1, 2),
}
"""The parameter values the grammar allows (the procedural kit programs' values and a few
between them); items counts for ``HiddenCause``/``HiddenOrder``, and the looks of
``BudgetTurns``/``GatedTurns`` (a gated game's below ``max_turns``). A turn limit is one of
``max(4, max_turns)`` and the next four, never above the kit's :data:`TURN_LIMIT`."""
TURN_LIMIT = 25
"""The kit's largest turn limit (``Turns.limit``)."""

_THEME = r'/"[A-Za-z][A-Za-z ,\x27-]{6,76}[A-Za-z]{2}"/'
_CLASS = r"/class [A-Z][a-z]{2,14}[A-Z][a-z]{2,9}Env\(KitEnv\):/"
_FLAVOUR = r'/" [A-Z][A-Za-z ,\x27-]{3,60}\."/'
_HINT = r'/"[A-Z][a-z]+ [A-Za-z0-9 ,.;:\x27()-]{6,230}[A-Za-z.]"/'
"""Free text is bounded (theme 80, flavour 60, hint 240 characters; the theme ends in two
letters and the hint starts with a word, so neither is blank), so a reply of words fits the
default run's 256 new tokens (about 160 measured); one of odd characters can exceed it and is
then cut, and fails extraction like any cut reply."""


def _runs(words: Sequence[str], sizes: Sequence[int]) -> list[str]:
    """Each run of consecutive ``words`` (after the first, which names the theme; commands and
    repeats dropped) of each size."""
    words = [w for w in dict.fromkeys(words) if w not in COMMANDS]
    return [" ".join(words[start:start + n]) for n in sizes
            for start in range(1, len(words) - n + 1)]


def part_options(cls: str, words: Sequence[str], max_turns: int) -> list[str]:
    """The source texts the grammar allows for kit class ``cls`` (e.g. ``ScoreSteep(power=5)``);
    ``words`` are the prompt's theme words, ``max_turns`` the loop's turn cap."""
    if cls == "HiddenNumber":
        return [f"HiddenNumber(low={a}, high={b})" for a, b in VALUES[cls]]
    if cls == "HiddenCode":
        return [f"HiddenCode(length={n}, symbols={json.dumps(s)})" for n, s in VALUES[cls]]
    if cls == "HiddenCell":
        return [f"HiddenCell(rows={r}, cols={c})" for r, c in VALUES[cls]]
    if cls in ("HiddenCause", "HiddenOrder"):
        runs = _runs(words, VALUES[cls])
        return [f"{cls}(items={json.dumps(r)})" for r in runs] or [f"{cls}()"]
    if cls == "ScoreSteep":
        return [f"ScoreSteep(power={p})" for p in VALUES[cls]]
    if cls == "ScoreBanded":
        return [f"ScoreBanded(near={a}, partial={b})" for a, b in VALUES[cls]]
    if cls == "ScoreThrifty":
        return [f"ScoreThrifty(cost={a}, floor={b})" for a, b in VALUES[cls]]
    if max_turns < 2:
        raise ValueError(f"a kit game needs at least 2 turns, got max_turns={max_turns}")
    low = min(max(4, max_turns), TURN_LIMIT)
    limits = range(low, min(low + 4, TURN_LIMIT) + 1)
    if cls == "OpenTurns":
        return [f"OpenTurns(limit={n})" for n in limits]
    if cls == "BudgetTurns":
        return [f"{cls}(limit={n}, looks={k})" for n in limits for k in VALUES["looks"]]
    if cls == "GatedTurns":  # the required looks and the answer fit in max_turns
        return [f"{cls}(limit={n}, looks={k})" for n in limits for k in VALUES["looks"]
                if k < max_turns]
    return [f"{cls}()"]  # the information actions: Probe(), Reveal(), Clue()


def _rule(name: str) -> str:
    return "p_" + name.lower()


def kit_grammar(skill: str, words: Sequence[str], max_turns: int, version: str = LATEST) -> str:
    """The Lark grammar of a kit reply for ``skill`` (see the module), its items runs of
    ``words`` (the theme words the prompt shows), its turn limits from ``max_turns``."""
    first = SKILL_PARTS[skill]
    slots = list(KIT_PARTS)
    combos = list(itertools.product(*(KIT_PARTS[s].values() for s in slots)))
    lines = ['start: "```python\\n" program "\\n```"',
             "program: " + " | ".join("c%d" % i for i in range(len(combos)))]
    for i, combo in enumerate(combos):
        names = ([first] if first in combo else []) + [c for c in combo if c != first]
        head = json.dumps(kit_import(names, version) + "\n\n\n")
        body = " ".join(f'"\\n    {slot} = " {_rule(cls)}' for slot, cls in zip(slots, combo))
        lines.append(f'c{i}: {head} CLASS "\\n    theme = " THEME {body} tail')
    for cls in sorted({c for slot in slots for c in KIT_PARTS[slot].values()}):
        options = part_options(cls, words, max_turns)
        lines.append(f"{_rule(cls)}: " + " | ".join(json.dumps(o) for o in options))
    lines += ['tail: intro? "\\n\\n\\nHINT = " HINT',
              'intro: "\\n\\n    def intro(self):\\n        return super().intro() + " FLAVOUR',
              f"CLASS: {_CLASS}", f"THEME: {_THEME}", f"FLAVOUR: {_FLAVOUR}", f"HINT: {_HINT}"]
    return "\n".join(lines) + "\n"


def designer_grammar(grammar: str | None, setting: str, skill: str, document: str | None,
                     max_turns: int, doc_words: int | None = None) -> str | None:
    """The grammar of one designer request under ``designer.grammar`` (None: free text), for
    the prompt ``build_designer_messages`` writes from the same arguments."""
    from spadekit.selfplay.prompts import kit_theme_words, normalize_skill

    if grammar is None:
        return None
    if grammar not in GRAMMARS:
        raise ValueError(f"designer.grammar must be one of {GRAMMARS} or null, got {grammar!r}")
    return kit_grammar(normalize_skill(setting, skill),
                       kit_theme_words(setting, document, doc_words), max_turns)
