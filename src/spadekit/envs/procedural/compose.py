"""One procedural game program from four parts and a surface (the procedural pool).

``compose(combo, surface, seed)`` writes the source of one environment class: the chosen hidden
state, information action, scoring rule and turn structure (``spadekit.envs.procedural.
mechanics``), with the words of ``surface`` (drawn from a grounding document) as its theme,
items and class name, and numbers drawn from ``seed``. The result is an ``EnvProgram`` with a
hint (the information action's strategy, never an answer), a skill and ``meta["procedural"]``
naming its parts, so a pool's combinations can be counted and held out.

The program is ordinary Python of the kind the designer prompt asks for, opened by a one-line
comment naming its design (its four parts: a designer that writes the plan first conditions the
code on it, so parts it learnt separately can be put together); the hidden state is a helper
class named after its part (``HiddenCell``), and each of the environment's other parts sits
under a comment naming it (``# probe look``), so every block starts by repeating the design
line's word for it; one ``...Env`` class,
``reset``/``step``/``solution``, all randomness from ``self.rng = random.Random(seed)``, commands
in ``\\boxed{}``, rewards in [0, 1] with 1.0 only for an exact answer, ``terminated`` on the
answer and ``truncated`` at ``max_turns``. Its solution is two turns: one look, then the answer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from spadekit.envs.procedural.mechanics import HIDDEN, INFO, SCORING, TURNS

__all__ = ["Combo", "all_combos", "compose", "theme_words", "ANSWER_VERBS", "LOOK_VERBS",
           "THEME_WORDS"]

LOOK_VERBS = {"probe": ("probe",), "reveal": ("reveal",), "clue": ("clue",)}
"""Command words of each information action: its own name, so the design line names the
command and a small designer has no word to carry from the rules into ``step`` (drawn words
were measured to drift between the two)."""
ANSWER_VERBS = ("answer",)
"""Command words of the final answer."""

_HELPER = '''\
def last_box(text):
    found = re.findall(r"\\\\boxed\\{([^{}]*)\\}", text)
    return found[-1].strip().lower() if found else ""
'''

_SOLUTION = '''\
    def solution(self):
        return [{solution_step}, "\\\\boxed{{answer_verb} " + self.hidden.answer() + "}"]
'''


@dataclass(frozen=True)
class Combo:
    """Which part of each kind a program uses."""

    hidden: str
    info: str
    scoring: str
    turns: str

    def __post_init__(self) -> None:
        for kind, name, registry in (("hidden", self.hidden, HIDDEN), ("info", self.info, INFO),
                                     ("scoring", self.scoring, SCORING),
                                     ("turns", self.turns, TURNS)):
            if name not in registry:
                raise ValueError(f"unknown {kind} part {name!r}; known: {sorted(registry)}")

    @property
    def key(self) -> str:
        return f"{self.hidden}+{self.info}+{self.scoring}+{self.turns}"

    @classmethod
    def parse(cls, key: str) -> "Combo":
        parts = key.split("+")
        if len(parts) != 4:
            raise ValueError(f"a combination is hidden+info+scoring+turns, got {key!r}")
        return cls(*parts)

    @property
    def skill(self) -> str:
        """The skill the game trains: the scoring rule's when it has one, else the hidden
        state's."""
        return SCORING[self.scoring].skill or HIDDEN[self.hidden].skill


def all_combos() -> list[Combo]:
    """Every combination of the registered parts, in a fixed order."""
    return [Combo(h, i, s, t) for h in HIDDEN for i in INFO for s in SCORING for t in TURNS]


_WORD = re.compile(r"[a-z]{3,9}")
_STOP = frozenset("""the and for are but not you all any can had her was one our out has him his
how its may new now old see two way who did get let put say she too use from have that this with
they will your what when them than then into more some time very just also been were which their
there these those would could should about other after first where while each such only over
most even much many must both same because between under again never always""".split())


THEME_WORDS = 16
"""How many of a document's words are its theme words."""


def theme_words(text: str, n: int = THEME_WORDS) -> list[str]:
    """The first ``n`` distinct lowercase words of 3-9 letters of ``text`` (stop words left
    out), in the document's order: what the compact designer prompt shows of a document, and
    what a procedural program's surface is drawn from."""
    words = re.findall(r"[^\W\d_]+", text)  # whole words of any script; ASCII ones kept
    seen = dict.fromkeys(w.lower() for w in words
                         if _WORD.fullmatch(w.lower()) and w.lower() not in _STOP)
    return list(seen)[:n]


def surface_words(text: str, rng: random.Random, n: int = 8) -> list[str]:
    """``n`` distinct words of ``text``'s :func:`theme_words`, drawn with ``rng``; padded from a
    fixed list when the text has too few."""
    seen = theme_words(text)
    rng.shuffle(seen)
    spare = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
             "indigo", "juniper", "kelp", "lantern", "meadow", "nickel", "orchid", "pebble"]
    out = seen[:n]
    for word in spare:
        if len(out) >= n:
            break
        if word not in out:
            out.append(word)
    return out


def _fill(template: str, values: dict[str, str]) -> str:
    """Replace each ``{name}`` whose name is in ``values``; every other brace stays."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def compose(combo: Combo, words: Sequence[str], seed: int, max_turns: int | None = None):
    """The program of ``combo`` themed on ``words`` (at least 6 distinct lowercase words; see
    :func:`surface_words`), its numbers drawn from ``seed``. Returns an ``EnvProgram``."""
    from spadekit.envs.program import EnvProgram

    words = [w for w in dict.fromkeys(words) if re.fullmatch(r"[a-z]{3,9}", w)]
    if len(words) < 6:
        raise ValueError(f"compose needs at least 6 distinct words of 3-9 letters, got {words}")
    rng = random.Random(seed)
    hidden, info = HIDDEN[combo.hidden], INFO[combo.info]
    scoring, turns = SCORING[combo.scoring], TURNS[combo.turns]
    theme, items = words[0], list(words[1:])
    count = rng.randint(3, min(5, len(items)))
    items = items[:count]
    verb = LOOK_VERBS[combo.info][0]
    answer_verb = ANSWER_VERBS[0]
    for item in list(items):  # an item named like a command would make commands ambiguous
        if item in (verb, answer_verb):
            items.remove(item)
    if len(items) < 3:
        items += [w for w in ("amber", "cedar", "ember") if w not in items][:3 - len(items)]
        count = len(items)
    count = len(items)
    top, rows, cols = rng.randint(20, 99), rng.randint(3, 6), rng.randint(3, 6)
    length = rng.randint(3, 4)
    budget = rng.randint(2, 4)
    turn_cap = max_turns or rng.randint(6, 10)
    values = {
        "top": str(top), "half": str(top // 2), "rows": str(rows), "cols": str(cols),
        "last_row": str(rows - 1), "last_col": str(cols - 1), "mid_row": str(rows // 2),
        "mid_col": str(cols // 2), "length": str(length), "count": str(count),
        "items": repr(items), "item_list": ", ".join(items), "first_item": items[0],
        "item_words": " ".join(items), "code_example": " ".join(items[:1] * length),
        "budget": str(budget), "verb": verb, "answer_verb": answer_verb,
        "parts": str(length if combo.hidden == "code" else
                     {"number": 3, "cell": 2}.get(combo.hidden, count)),
    }
    example = _fill(hidden.example, values)
    values["example"] = example
    usage = _fill(info.usage, values)
    answer_usage = f"\\boxed{{{answer_verb} {example}}} commits your final answer"
    intro = " ".join(x for x in (
        f"You work the {theme} puzzle.", _fill(hidden.goal, values),
        f"Commands: {usage}; {answer_usage}.", _fill(scoring.rule, values),
        _fill(turns.rule, values), f"You have {turn_cap} turns.") if x)
    reminder = f"Unknown command. Use \\boxed{{{verb} ...}} or \\boxed{{{answer_verb} ...}}."
    values["usage_reminder"] = repr(reminder)
    values["solution_step"] = _fill(info.solution_step, values)
    name = theme.capitalize() + combo.hidden.capitalize() + "Env"
    helper = "Hidden" + combo.hidden.capitalize()
    plan = (f"# Design: {hidden.plan}; {info.name} look; {scoring.name} scoring; "
            f"{turns.name} turns.")
    code = "\n".join([
        plan, "import random", "import re", "", "", _fill(_HELPER, values).rstrip(), "", "",
        f"class {helper}:", "    def __init__(self, rng):",
        _fill(hidden.setup, values).rstrip(), "",
        # the same five members whatever the look (a probe never calls fact): a small designer
        # was measured to drop fact where a later clue calls it when they depended on the look
        _fill(hidden.methods, values).rstrip(), "", "",
        f"class {name}:",
        f"    def __init__(self, max_turns={turn_cap}, **kwargs):",
        "        self.max_turns = int(max_turns)", "",
        "    def reset(self, seed=None, options=None):",
        "        self.rng = random.Random(seed)",
        f"        self.hidden = {helper}(self.rng)",
        "        self.turns = self.looks = 0", _fill(turns.init, values).rstrip(),
        f"        return {intro!r}, {{}}", "",
        f"    # {info.name} look", _fill(info.method, values).rstrip(), "",
        f"    # {scoring.name} scoring", _fill(scoring.method, values).rstrip(), "",
        f"    # {turns.name} turns", _fill(turns.step, values).rstrip(), "",
        _fill(_SOLUTION, values).rstrip(), ""])
    return EnvProgram(code=code, hint=info.hint, skill=combo.skill, domain="games",
                      source=f"procedural:{combo.key}:{seed}", class_name=name,
                      meta={"procedural": {"combo": combo.key, "seed": seed,
                                           "hidden": combo.hidden, "info": combo.info,
                                           "scoring": combo.scoring, "turns": combo.turns}})
