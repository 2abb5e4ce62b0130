"""One procedural kit program: a combination of the game kit's parts, themed on a document's
words, with parameters drawn from a seed.

``compose_kit(combo, words, seed, max_turns)`` writes what a designer with the kit writes: one
import line, one ``...Env(KitEnv)`` class naming a one-line theme and the four parts with
their parameters, sometimes an ``intro`` override that adds a sentence of flavour, then
``HINT = "..."``, the strategy of its information action and turn structure (never a value).
What a small designer must copy is made easy to copy: the theme and class name use the first
words, items are a run of consecutive words (the words come in the order the designer prompt
shows a document's theme words, so a run of them is distinct words), code symbols are one of
a few plain alphabets, and each parameter takes one of a few values well inside its range.
The import line names ``KitEnv`` and then the part that makes the skill (:func:`skill_part`:
the scoring rule for Optimization, the hidden state for the other skills), so a designer whose
reply the loop opens with that part (``designer.prompt_style: kit``) writes the rest. Numbers and
which run of words come from ``seed``; every setting lies inside the
kit's ranges and lets the derived solution win within ``max_turns``. About 120 SmolLM2 tokens.
``meta`` records the composition (``procedural``) and the kit version (``gamekit``).
"""

from __future__ import annotations

import json
import random
import re
from typing import Sequence

from spadekit.envs.gamekit import LATEST, PACKAGE
from spadekit.envs.procedural.compose import Combo

__all__ = ["KIT_PARTS", "compose_kit", "kit_import", "skill_part"]

KIT_PARTS = {
    "hidden": {"number": "HiddenNumber", "code": "HiddenCode", "cell": "HiddenCell",
               "cause": "HiddenCause", "order": "HiddenOrder"},
    "info": {"probe": "Probe", "reveal": "Reveal", "clue": "Clue"},
    "scoring": {"exact": "ScoreExact", "steep": "ScoreSteep", "banded": "ScoreBanded",
                "thrifty": "ScoreThrifty"},
    "turns": {"open": "OpenTurns", "budget": "BudgetTurns", "gated": "GatedTurns"},
}
"""A combination's part names -> the kit classes."""
SKILL_PARTS = {"Mathematical_Reasoning": "HiddenNumber", "Pattern_Recognition": "HiddenCode",
               "Spatial_Reasoning": "HiddenCell", "Causal_Inference": "HiddenCause",
               "Logical_Deduction": "HiddenOrder", "Optimization": "ScoreThrifty"}
"""The part whose presence makes a kit game train each skill (``Combo.skill`` read backwards)."""
COMMANDS = ("probe", "reveal", "clue", "answer")

_THEMES = ("the {a} keeper hides a secret among the {b}",
           "a puzzle of {a}, {b} and {c}",
           "someone in the {a} guards the {b}",
           "the {a} ledger lost track of the {b}",
           "a riddle from the {a} about the {b}",
           "the {a} archive keeps one {b} out of sight")
_FLAVOUR = ("The {a} is quiet.", "Mind the {b}.", "The {a} remembers.", "Someone moved the {b}.")
_HINTS = {
    "probe": "Probe a candidate, then move toward the candidates whose closeness rises; "
             "answer once a probe reads 1.",
    "reveal": "Reveal the numbered facts one at a time; together they pin the secret down.",
    "clue": "Ask for clues in turn; each is a true fact about the secret, so combine them "
            "before you answer.",
}
_TURN_HINTS = {"open": "", "budget": " Your looks are limited, so make each one count.",
               "gated": " An answer counts only after the required looks."}


def skill_part(skill: str) -> str:
    """The kit class that makes a game train ``skill`` (KeyError for another skill)."""
    return SKILL_PARTS[skill]


def kit_import(names: Sequence[str], version: str = LATEST) -> str:
    """The import line of a kit program that uses ``names``."""
    return f"from {PACKAGE}.{version} import {', '.join(['KitEnv', *names])}"


def _theme(rng: random.Random, words: Sequence[str]) -> str:
    a, b, c = words[0], words[1], words[2]
    return rng.choice(_THEMES).format(a=a, b=b, c=c)


SYMBOLS = ("abc", "abcd", "abcdef", "xyz", "0123", "012345")
"""The alphabets of procedural ``HiddenCode`` parts."""


def _run(words: Sequence[str], n: int, rng: random.Random) -> str:
    """``n`` consecutive words of ``words`` (after the theme's first one), space-joined."""
    start = rng.randrange(1, len(words) - n + 1)
    return " ".join(words[start:start + n])


def _hidden(name: str, rng: random.Random, words: Sequence[str]) -> str:
    if name == "number":
        low = rng.choice((0, 1, 1, 10))
        return f"HiddenNumber(low={low}, high={low + rng.choice((19, 29, 49, 59, 99))})"
    if name == "code":
        return f"HiddenCode(length={rng.randint(3, 4)}, symbols={json.dumps(rng.choice(SYMBOLS))})"
    if name == "cell":
        return f"HiddenCell(rows={rng.randint(3, 6)}, cols={rng.randint(3, 6)})"
    if name == "cause":
        return f"HiddenCause(items={json.dumps(_run(words, 6, rng))})"
    return f"HiddenOrder(items={json.dumps(_run(words, 4, rng))})"


def _scoring(name: str, rng: random.Random) -> str:
    if name == "steep":
        return f"ScoreSteep(power={rng.choice((5, 6, 8))})"
    if name == "banded":
        return f"ScoreBanded(near={rng.choice((0.8, 0.9))}, partial={rng.choice((0.2, 0.3))})"
    if name == "thrifty":
        return f"ScoreThrifty(cost={rng.choice((0.1, 0.2))}, floor={rng.choice((0.2, 0.3))})"
    return "ScoreExact()"


def _turns(name: str, rng: random.Random, cap: int) -> str:
    limit = rng.randint(max(4, cap), max(4, cap) + 4)
    if name == "budget":
        return f"BudgetTurns(limit={limit}, looks={rng.randint(1, 2)})"
    if name == "gated":
        return f"GatedTurns(limit={limit}, looks={rng.randint(1, max(1, min(2, cap - 1)))})"
    return f"OpenTurns(limit={limit})"


def compose_kit(combo: Combo, words: Sequence[str], seed: int, max_turns: int | None = None):
    """The kit program of ``combo`` themed on ``words`` (at least 8 distinct words of 3-9
    lowercase letters, in the order the designer prompt shows them: ``theme_words``), its
    settings drawn from ``seed``; solutions fit in ``max_turns`` (default 8). Returns an
    ``EnvProgram``."""
    from spadekit.envs.program import EnvProgram

    words = [w for w in dict.fromkeys(words) if re.fullmatch(r"[a-z]{3,9}", w)
             and w not in COMMANDS]
    if len(words) < 8:
        raise ValueError(f"compose_kit needs at least 8 distinct words of 3-9 letters other "
                         f"than the commands, got {words}")
    rng = random.Random(seed)
    cap = max_turns or 8
    if cap < 2:
        raise ValueError(f"a kit game needs at least 2 turns, got max_turns={cap}")
    classes = {slot: KIT_PARTS[slot][getattr(combo, slot)] for slot in KIT_PARTS}
    first = skill_part(combo.skill)
    names = [first] + [c for c in classes.values() if c != first]
    theme = _theme(rng, words)
    name = words[0].capitalize() + combo.hidden.capitalize() + "Env"
    lines = [kit_import(names), "", "",
             f"class {name}(KitEnv):",
             f"    theme = {json.dumps(theme)}",
             f"    hidden = {_hidden(combo.hidden, rng, words)}",
             f"    info = {classes['info']}()",
             f"    scoring = {_scoring(combo.scoring, rng)}",
             f"    turns = {_turns(combo.turns, rng, cap)}"]
    if rng.random() < 0.25:
        flavour = rng.choice(_FLAVOUR).format(a=words[0], b=words[rng.randrange(1, 8)])
        lines += ["", "    def intro(self):",
                  f"        return super().intro() + {json.dumps(' ' + flavour)}"]
    hint = _HINTS[combo.info] + _TURN_HINTS[combo.turns]
    if combo.scoring == "thrifty":
        hint += " Every look beyond the required ones costs score."
    lines += ["", "", f"HINT = {json.dumps(hint)}", ""]
    return EnvProgram(code="\n".join(lines), hint=hint, skill=combo.skill, domain="games",
                      source=f"procedural-kit:{combo.key}:{seed}", class_name=name,
                      meta={"procedural": {"combo": combo.key, "seed": seed, "style": "kit",
                                           "hidden": combo.hidden, "info": combo.info,
                                           "scoring": combo.scoring, "turns": combo.turns}})
