"""Prompts of the designer role: environment programs (SPEC points 1, 9-11) and privileged hints.

``build_designer_messages`` asks for one complete environment program for a skill, grounded on a
corpus document, with references to differ from and one example to avoid; ``style`` is ``full``
(the paper's), ``compact`` (small models on a CPU, about 350 tokens) or ``kit`` (games only: a
game-kit program, the skill named with the kit part that makes it). ``build_hint_messages`` is
the second call (SPEC point 2): the same policy reads the code and writes a 1-3 sentence hint;
``parse_hint`` cleans a reply. The leak check lives in :mod:`spadekit.selfplay.leaks` and is
re-exported here.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from spadekit.envs.procedural.compose import theme_words
from spadekit.selfplay.corpus import truncate_words
from spadekit.envs.skills import (SETTINGS, SKILLS, _check_setting,  # noqa: F401 (re-exported)
                                  normalize_skill, skills_for)
from spadekit.selfplay.leaks import hint_leaks, leaked_fragments  # noqa: F401 (re-exported)

__all__ = ["DOC_WORDS", "PROMPT_STYLES", "SETTINGS", "SKILLS", "build_designer_messages",
           "build_hint_messages", "hint_leaks", "kit_reference",
           "leaked_fragments", "normalize_skill", "parse_hint", "skills_for"]

#: Grounding documents are cut to this many words (SPEC point 10).
DOC_WORDS = {"games": 6000, "tooluse": 4000}
#: Reference programs longer than this are cut in the prompt.
MAX_REFERENCE_CHARS = 12000
#: ``designer.prompt_style`` values.
PROMPT_STYLES = ("full", "compact", "kit")
#: Words of a reference's rules shown in the compact style, and characters at most.
SUMMARY_WORDS = 30
SUMMARY_CHARS = 300

# ---------------------------------------------------------------------------------------------
# designer prompt
# ---------------------------------------------------------------------------------------------

_INTRO = {
    "games": ("You are the Environment Designer. You invent a text-based game that trains an AI "
              "agent in one reasoning skill and write it as one complete, self-contained Python "
              "program. The agent plays over several turns: it reads an observation, replies "
              "with one command, then receives the next observation and a reward."),
    "tooluse": ("You are the Environment Designer. You invent a tool-use task that trains an AI "
                "agent in one skill of working with tools and write it as one complete, "
                "self-contained Python program. The agent works over several turns: each turn "
                "it calls tools and reads their results, and it finishes by declaring it is "
                "done."),
}

_GAMES_CONTRACT = """\
1. Define exactly one top-level class whose name ends in `Env` (e.g. `class ToyFactoryEnv:`). \
Module-level constants and helper functions are fine; no other name may end in `Env`.
2. `def __init__(self, max_turns={max_turns}, **kwargs)`: store `self.max_turns = int(max_turns)`.
3. `def reset(self, seed=None, options=None)` returns `(observation: str, info: dict)`. Create \
`self.rng = random.Random(seed)` there and draw every random choice from `self.rng` (never the \
module-level `random` functions, time or hash()), so the same seed and actions always give the \
same observations and rewards. The first observation states the goal, every command with its \
exact syntax, how scoring works and the turn limit.
4. `def step(self, action: str)` returns `(observation: str, reward: float, terminated: bool, \
truncated: bool, info: dict)`. `action` is the agent's whole reply; the agent writes its command \
as `\\boxed{{<command>}}`. Take the content of the LAST `\\boxed{{...}}` (write a small helper \
that matches balanced braces), strip it and parse it case-insensitively. A missing box or an \
invalid command uses up a turn and returns reward 0.0 with an observation that explains the \
correct syntax; step() must never raise.
5. Rewards are floats in [0.0, 1.0]; 1.0 only when the task is fully solved. When the agent \
commits its final answer, give partial credit for a partly correct one (e.g. the fraction of \
correct parts); other steps return 0.0. Empty, malformed or random actions must never reach 1.0.
6. Set `terminated=True` when the agent commits its final answer (right or wrong) and \
`truncated=True` when the turn count reaches `self.max_turns` without one. After the episode has \
ended, step() returns reward 0.0 and terminated=True.
7. `def solution(self)` returns the list of actions, each written as `"\\\\boxed{{...}}"`, that \
reaches reward 1.0 from the state made by the last reset(), in at most `self.max_turns` actions. \
Compute it from the hidden state; it must work for every seed.
8. Standard library only (random, math, re, itertools, collections, functools, heapq, \
fractions, string). No file, network or console I/O, no input(), no sleeping; every call must \
finish well within a second."""

_TOOLS_CONTRACT = """\
1. Begin with `import random` and `from spadekit.envs.tooluse import ToolEnv, ToolError` (and \
`from spadekit.envs.actions import format_tool_call` for solution()). Define exactly one \
top-level class whose name ends in `Env`, subclassing ToolEnv (e.g. \
`class ClinicBookingEnv(ToolEnv):`); no other name may end in `Env`.
2. ToolEnv already implements `__init__(self, max_turns={max_turns}, **kwargs)`, \
`reset(seed=None, options=None) -> (str, dict)` and the 5-tuple `step(action)`: it sets \
`self.rng = random.Random(seed)`, calls your setup(), lists the tools, parses and runs the tool \
calls, reports each result or error, ends the episode at `<answer>` with reward = fraction of \
criteria() that hold, and truncates at `self.max_turns`. Do not override reset, step or tools; \
if you override __init__, call `super().__init__(max_turns, **kwargs)` first.
3. `def setup(self, rng: random.Random) -> str`: build all hidden state from `rng` alone (never \
the module-level `random` functions, time or hash()), store it on self, and return the task \
text: the goal and the facts the agent is given, not what it must find out with tools.
4. Tools are methods named `tool_<name>` with type-hinted parameters (str, int, float, bool, \
list[str], or `x: str | None = None` when optional) and a docstring: a one-line summary, then an \
`Args:` section with one line per parameter. Return JSON-serialisable values; for a bad request \
`raise ToolError("clear message")`. Write tools must really change the state on self.
5. `def criteria(self) -> dict[str, bool]`: 2-5 named checks over the final state (e.g. right \
record submitted, nothing else modified). The reward is the fraction that hold, in [0.0, 1.0]: \
partial credit for partial progress, 1.0 only when the task is fully done. They must not all \
hold before the agent has acted, nor after blind or random calls.
6. `def solution(self) -> list[str]`: one string per turn that reaches reward 1.0 from the state \
set up by the last reset(), in at most `self.max_turns` turns. Write calls with \
`format_tool_call("name", {{"arg": value}})` (several may be joined in one turn); the last turn \
ends with `"<answer>done</answer>"`. Compute it from the hidden state; it must work for every \
seed.
7. Standard library only, plus the spadekit imports above. No file, network or console I/O, no \
sleeping; every call must finish well within a second."""

_GOALS = {
    "games": (
        "- The game must need the target skill and several turns: keep key facts hidden and let "
        "the agent uncover them with informative commands (queries, probes, moves, experiments) "
        "before one final commit command.\n"
        "- A careful reasoner should win within the turn limit; guessing should not.\n"
        "- Observations are plain, concise text that report exactly what each command "
        "revealed."),
    "tooluse": (
        "- The task must need the target skill and several dependent tool calls: the needed "
        "information is only reachable through tools, and one call's results feed the next.\n"
        "- Offer 3-6 tools with realistic names and descriptions.\n"
        "- Tool results are concise and report exactly what was asked."),
}

_OUTPUT = ("Output format: exactly one ```python code block holding the whole program, followed "
           "by one line\nHINT: <1-3 sentences of key insight or strategy for the player; no "
           "concrete answers, ids or values>")


def designer_system_prompt(setting: str, max_turns: int = 12) -> str:
    """The designer's system prompt: role, program contract, design goals, output format."""
    contract = (_GAMES_CONTRACT if _check_setting(setting) == "games" else _TOOLS_CONTRACT)
    acting = "" if setting == "games" else (
        '\n\nHow the agent acts: each turn it writes one or more calls '
        '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>; the reply '
        '<answer>done</answer> ends the episode.')
    return (f"{_INTRO[setting]} Your program is checked automatically; breaking any rule of the "
            f"contract discards it.{acting}\n\nProgram contract\n"
            f"{contract.format(max_turns=max_turns)}"
            "\n\nDesign goals\n"
            f"{_GOALS[setting]}\n- Take the theme, entities, rules or numbers from the grounding "
            "document when it offers usable material.\n\n" + _OUTPUT)


def _reference(item: Any) -> tuple[str, float | None, float | None]:
    """(code, win_rate, regret) from a tuple, a mapping, an EnvProgram-like object or a str."""
    if isinstance(item, str):
        return item, None, None
    if isinstance(item, (tuple, list)):
        padded = list(item) + [None, None]
        return str(padded[0]), padded[1], padded[2]
    get = item.get if isinstance(item, dict) else (lambda k, d=None: getattr(item, k, d))
    code = get("code")
    if not isinstance(code, str):
        raise TypeError(f"a reference environment needs code, got {type(item).__name__}")
    meta = get("meta") or {}
    win_rate = get("win_rate", meta.get("win_rate") if hasattr(meta, "get") else None)
    regret = get("regret", meta.get("regret") if hasattr(meta, "get") else None)
    return code, win_rate, regret


def _code_block(code: str) -> str:
    code = code.strip("\n")
    if len(code) > MAX_REFERENCE_CHARS:
        code = code[:MAX_REFERENCE_CHARS] + "\n# ... (cut)"
    return f"```python\n{code}\n```"


def _negative_reason(reason: Any) -> str:
    if isinstance(reason, (int, float)) and not isinstance(reason, bool):
        rate = float(reason)
        kind = "too easy" if rate >= 0.5 else "too hard"
        return f"{kind} (win rate {rate:.2f})"
    return str(reason).strip() or "unsuitable difficulty"


_COMPACT_SYSTEM = {
    "games": (
        "You are the Environment Designer. Write one text game that trains a reasoning skill, "
        "as one Python program (standard library only): one class named ...Env with "
        "`__init__(self, max_turns={max_turns}, **kwargs)`; `reset(self, seed=None, "
        "options=None)` that draws every hidden value from `self.rng = random.Random(seed)` "
        "and returns (observation, {{}}) stating the goal, the commands and the scoring; "
        "`step(self, action)` that reads the command in the last \\boxed{{...}} of the reply "
        "and returns (observation, reward, terminated, truncated, {{}}), never raising; and "
        "`solution(self)`, the list of \\boxed{{...}} actions that wins. Let the player "
        "look before it answers. Rewards lie in [0, 1], 1.0 only for an exact answer; "
        "terminated on the answer, truncated at max_turns."),
    "tooluse": (
        "You are the Environment Designer. Write one tool-use task as one Python program: "
        "`from spadekit.envs.tooluse import ToolEnv, ToolError`, one class named ...Env "
        "subclassing ToolEnv with `setup(self, rng)` (hidden state from rng, returns the task "
        "text), tools `tool_<name>` with type hints and docstrings, `criteria(self)` (2-5 "
        "named checks; reward is the share that hold) and `solution(self)` (one string of "
        "tool calls per turn, ending with <answer>done</answer>). max_turns={max_turns}."),
}
_COMPACT_OUTPUT = ("Reply with one ```python block, then one line HINT: <the strategy in 1-3 "
                   "sentences, no answers or values>.")


def designer_system_prompt_compact(setting: str, max_turns: int = 12) -> str:
    """The compact style's system prompt: the contract in a few lines and the output format."""
    return (_COMPACT_SYSTEM[_check_setting(setting)].format(max_turns=max_turns) + " "
            + _COMPACT_OUTPUT)


def reference_summary(code: str, words: int = SUMMARY_WORDS) -> str:
    """A reference program in one line: its class name and the first ``words`` words of its
    longest string constant (usually its rules); the code's opening when it does not parse.
    At most :data:`SUMMARY_CHARS` characters, read from the first :data:`MAX_REFERENCE_CHARS`
    of the code (what the full style shows), however the program was written."""
    import ast

    code = code[:MAX_REFERENCE_CHARS]  # what the full style shows of it, at most
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return " ".join(code.split()[:words])[:SUMMARY_CHARS]
    names = [n.name[:60] for n in tree.body if isinstance(n, ast.ClassDef)]
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and isinstance(n.value, str)]
    rules = " ".join(max(texts, key=len).split()[:words]) if texts else ""
    return f"{names[0] if names else 'a program'}: {rules}".strip()[:SUMMARY_CHARS]


_KIT_SYSTEM = (
    "You are the Environment Designer. Write a text game for one reasoning skill as a "
    "game-kit program: import the parts from {package}; one class ...Env(KitEnv) with a "
    "one-line theme from the theme words, then hidden, info, scoring and turns; then "
    "HINT = \"<the strategy, no values>\".\n"
    "hidden: HiddenNumber(low, high), HiddenCode(length, symbols), HiddenCell(rows, cols), "
    "HiddenCause(items: 6 to 12 different words), HiddenOrder(items: 4 to 8 different "
    "words)\n"
    "info: Probe(), Reveal(), Clue()\n"
    "scoring: ScoreExact(), ScoreSteep(power), ScoreBanded(near, partial), "
    "ScoreThrifty(cost, floor)\n"
    "turns: OpenTurns(limit), BudgetTurns(limit, looks), GatedTurns(limit, looks)\n"
    "You may override intro, look, verdict or reminder, or write a part of your own. "
    "max_turns={max_turns}.")


def kit_reference(code: str) -> str:
    """A memory reference in the kit prompt: a kit program's class on one line, its parts
    with their parameters and the names of its own methods (``class HarborCellEnv(KitEnv):
    hidden = HiddenCell(rows=5, cols=4); info = Probe(); ...``; the theme left out, so the
    new game takes its own from its document), or :func:`reference_summary` of any other
    program. At most :data:`SUMMARY_CHARS` characters."""
    import ast

    from spadekit.envs.gamekit import kit_version

    code = code[:MAX_REFERENCE_CHARS]
    if kit_version(code):
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        for node in getattr(tree, "body", []):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Env"):
                body = []
                for item in node.body:
                    if isinstance(item, ast.Assign) and len(item.targets) == 1 and \
                            isinstance(item.targets[0], ast.Name) and \
                            item.targets[0].id in ("hidden", "info", "scoring", "turns"):
                        body.append(ast.unparse(item).replace("'", '"'))
                    elif isinstance(item, ast.FunctionDef):
                        body.append(f"def {item.name}(...)")
                line = f"class {node.name}(KitEnv): " + "; ".join(body)
                return line[:SUMMARY_CHARS]
    return reference_summary(code)


def _kit_messages(skill: str, text: str, refs: list, negative: Any,
                  max_turns: int) -> list[dict[str, str]]:
    from spadekit.envs.gamekit import LATEST, PACKAGE
    from spadekit.envs.procedural.kit import skill_part

    part = skill_part(skill)
    parts = [f"Skill: {skill} (its part: {part})."]
    words = theme_words(text)
    if words:
        parts.append(f"Theme words: {', '.join(words)}.")
    if refs:
        parts.append("Already in memory (use other parts or settings):\n" + "\n".join(
            kit_reference(code) for code, _w, _r in refs))
    if negative is not None:
        parts.append(f"Avoid ({_negative_reason(negative[1])}):\n{kit_reference(negative[0])}")
    parts.append(f"Write a new kit game for {skill} with {part}.")
    system = _KIT_SYSTEM.format(package=f"{PACKAGE}.{LATEST}", max_turns=max_turns)
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n\n".join(parts)}]


def _compact_messages(setting: str, skill: str, text: str, refs: list, negative: Any,
                      max_turns: int) -> list[dict[str, str]]:
    parts = [f"Skill: {skill}. {SKILLS[setting][skill]}"]
    words = theme_words(text)
    if words:
        parts.append(f"Theme words from a document: {', '.join(words)}.")
    if refs:
        parts.append("Already in memory (write a different one):\n" + "\n".join(
            f"- {reference_summary(code)}" for code, _w, _r in refs))
    if negative is not None:
        parts.append(f"Avoid ({_negative_reason(negative[1])}): "
                     f"{reference_summary(negative[0])}")
    parts.append(f"Write a new game for {skill} (max_turns={max_turns})."
                 if setting == "games" else
                 f"Write a new tool-use task for {skill} (max_turns={max_turns}).")
    return [{"role": "system", "content": designer_system_prompt_compact(setting, max_turns)},
            {"role": "user", "content": "\n\n".join(parts)}]


def kit_theme_words(setting: str, document: str | None, doc_words: int | None = None
                    ) -> list[str]:
    """The theme words the kit prompt shows for ``document`` (cut to ``doc_words``, default
    the setting's budget), as :func:`build_designer_messages` computes them."""
    limit = DOC_WORDS[setting] if doc_words is None else doc_words
    return theme_words(truncate_words(document or "", limit).strip())


def build_designer_messages(setting: str, skill: str, document: str | None,
                            positive: Sequence[Any] = (), negative: tuple[str, Any] | None = None,
                            max_turns: int = 12, doc_words: int | None = None,
                            style: str = "full") -> list[dict[str, str]]:
    """System + user messages asking for one environment program (SPEC points 1, 9, 10).

    ``positive``: reference environments (EnvPrograms, ``(code, win_rate, regret)`` tuples,
    mappings with ``code`` or plain code), shown with the instruction to write a different one.
    ``negative``: ``(code, reason)``; ``reason`` is text such as ``"too easy (win rate 0.95)"`` or
    a win rate. ``doc_words`` overrides the setting's document budget (:data:`DOC_WORDS`).
    ``style``: one of :data:`PROMPT_STYLES` (see the module's docstring).
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"designer prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    skill = normalize_skill(setting, skill)
    limit = DOC_WORDS[setting] if doc_words is None else doc_words
    if style == "kit":
        if setting != "games":
            raise ValueError("the kit prompt style is for games (tool use has ToolEnv)")
        return _kit_messages(skill, truncate_words(document or "", limit).strip(),
                             [_reference(item) for item in positive], negative, max_turns)
    if style == "compact":
        return _compact_messages(setting, skill, truncate_words(document or "", limit).strip(),
                                 [_reference(item) for item in positive], negative, max_turns)
    parts = [f"Target skill: {skill}\n{SKILLS[setting][skill]}"]
    text = truncate_words(document or "", limit).strip()
    if text:
        parts.append("Grounding document (raw material for the theme, entities, rules or numbers; "
                     f"cut to at most {limit} words):\n<document>\n{text}\n</document>")
    else:
        parts.append("No grounding document this time: choose a fresh, concrete theme yourself.")
    refs = [_reference(item) for item in positive]
    if refs:
        parts.append("Reference environments for this skill follow. They show the expected "
                     "format and quality; do NOT copy or re-theme them. Write a DIFFERENT "
                     "environment with its own mechanics.")
        for i, (code, win_rate, regret) in enumerate(refs, 1):
            stats = [f"{name} {float(v):.2f}" for name, v in
                     (("win rate", win_rate), ("hint regret", regret)) if v is not None]
            label = f" ({', '.join(stats)})" if stats else ""
            parts.append(f"Reference {i}{label}:\n{_code_block(code)}")
    if negative is not None:
        code, reason = negative
        parts.append(f"Avoid: {_negative_reason(reason)}. Do not repeat the difficulty problem of "
                     f"this environment:\n{_code_block(code)}")
    kind = "game" if setting == "games" else "tool-use environment"
    parts.append(f"Now write a new {kind} for {skill} (max_turns={max_turns}). "
                 "Reply with one ```python block, then the HINT: line.")
    return [{"role": "system", "content": designer_system_prompt(setting, max_turns)},
            {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------------------------------
# hint prompt and parsing
# ---------------------------------------------------------------------------------------------

_HINT_SYSTEM = (
    "You write privileged hints for text environments that train an AI agent. You read an "
    "environment's source code and state, in 1-3 sentences, the key insight or strategy that "
    "lets a player solve it reliably within the turn limit. The hint is shown to the player at "
    "the start of an episode and is judged by how much it raises the player's success rate. "
    "Never give the answer: no concrete values, ids, names, numbers, codes, coordinates or "
    "action sequences from the code, since they change with every seed. Reply with one line: "
    "HINT: <your hint>")

_ACTION_FORMAT = {
    "games": "the player replies each turn with a command written as \\boxed{command}",
    "tooluse": ("the player calls tools as <tool_call>{\"name\": ..., \"arguments\": {...}}"
                "</tool_call> and finishes with <answer>done</answer>"),
}


def build_hint_messages(code: str, setting: str, previous: str | None = None,
                        problem: str | None = None) -> list[dict[str, str]]:
    """System + user messages for the hint call; ``previous``/``problem`` describe a rejected
    earlier attempt (for the one retry)."""
    user = (f"Setting: {_check_setting(setting)} ({_ACTION_FORMAT[setting]}).\n\n"
            f"Environment code:\n```python\n{code.strip()}\n```\n\n"
            "Write the hint: the key insight or strategy, in 1-3 sentences, without concrete "
            "answers or values.")
    if previous:
        user += (f"\n\nYour previous hint was rejected ({problem or 'unusable'}): {previous!r}. "
                 "Write a different one that states the strategy in general terms.")
    return [{"role": "system", "content": _HINT_SYSTEM}, {"role": "user", "content": user}]


_THINK = re.compile(r"<(think|thinking)>.*?(</\1>|\Z)", re.IGNORECASE | re.DOTALL)
_HINT_MARK = re.compile(r"(?:^|\n)[ \t>*_#-]*(?:privileged\s+)?hint[ \t*_]*[:\uff1a][ \t*_]*",
                        re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_REFUSAL = re.compile(r"^(i'?m sorry|sorry\b|i (cannot|can'?t|won'?t|am unable|'m unable)|"
                      r"as an ai|i do not|i don'?t|no hint|n/?a\b|none\b)", re.IGNORECASE)
MAX_HINT_WORDS = 90


def parse_hint(text: str | None) -> str | None:
    """The hint in a reply: after a ``HINT:`` marker when there is one, markdown and quotes
    stripped, whitespace collapsed, cut to its first three sentences. ``None`` for empty
    replies, refusals, code, or text that is not prose (fewer than 3 words, mostly symbols,
    longer than :data:`MAX_HINT_WORDS` words)."""
    if not isinstance(text, str):
        return None
    text = _THINK.sub(" ", text)
    if "</think>" in text.lower():
        text = text[text.lower().rfind("</think>") + len("</think>"):]
    mark = _HINT_MARK.search(text)
    if mark:
        text = text[mark.end():]
    text = text.split("```", 1)[0]
    text = text.split("\n\n", 1)[0] if text.strip().count("\n\n") else text
    text = re.sub(r"[*_`#]+", "", text).replace("\\n", " ")
    text = " ".join(text.split()).strip(" \"'\u201c\u201d-")
    if not text or _REFUSAL.match(text):
        return None
    sentences = _SENTENCE_END.split(text)
    hint = " ".join(sentences[:3]).strip()
    words = hint.split()
    visible = [c for c in hint if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    if len(words) < 3 or len(words) > MAX_HINT_WORDS or letters < 0.6 * len(visible):
        return None
    if re.search(r"^\s*(def|class|import|return)\b|\bself\.", hint):
        return None
    return hint
