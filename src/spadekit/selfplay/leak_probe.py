"""The empirical half of the hint leak check: a hint that lets garbage plus the hint win leaks.

:func:`hint_candidates` turns a hint into the actions an agent could copy out of it without any
reasoning: each quoted phrase, each number (digits or words), each letter-by-letter spelling
(``x-y-z-z-y`` -> ``xyzzy``), each id-like chunk of letters and digits (``FIN-7``) and each word
of at least three letters that is not a stop word (``spadekit.selfplay.leaks.STOP_WORDS``), as
written and lower-cased. With the verbs of the solution's commands (the first token of a
multi-token ``\\boxed{}`` command) each value is also tried after each verb (``open 3``).
Games wrap them as ``\\boxed{...}``, tool use as ``<answer>...</answer>``.

:func:`empirical_leak` plays them in the real sandbox on the validator's seeds: each candidate
alone as the first action, then a few short sequences (the values in the order the hint gives
them, bare and after each verb), one fresh instance per seed and sequence. A candidate sequence
that reaches full score (last reward >= 1.0 and terminated) on EVERY seed is a leak: a hint is
one text for all seeds, so a win on one seed only is a lucky guess (say "3 doors" and door 3),
not the hint's doing. Garbage that wins without the hint is the validator's ``not_trivially_won``
stage, not a hint leak.

Bounded: at most ``MAX_CANDIDATES`` single candidates and ``MAX_SEQUENCES`` sequences of at most
``max_turns`` actions, under a wall-clock ``budget_s``; a sandbox failure (a hang, a crash, a
contract breach) ends the probe with "no leak found" and never raises.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Iterable

from spadekit.common.errors import EnvRaised, InvalidResult, SandboxError
from spadekit.selfplay.leaks import (MAX_HINT_CHARS, STOP_WORDS, boxed_contents, number_words,
                                     numbers_in, tokens)

__all__ = ["EMPIRICAL_BUDGET_S", "MAX_CANDIDATES", "MAX_SEQUENCES", "empirical_leak",
           "hint_candidates", "solution_verbs"]

log = logging.getLogger(__name__)

EMPIRICAL_BUDGET_S = 10.0
MAX_CANDIDATES = 32
MAX_SEQUENCES = 4
MAX_VERBS = 3
MAX_VALUE_CHARS = 80

_QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|\u201c([^\u201d\n]{1,80})\u201d|`([^`\n]{1,80})`"
                     r"|(?<!\w)'([^'\n]{1,80})'(?!\w)")
_WORD = re.compile(r"[^\W\d_]{3,40}")
_SPELLED = re.compile(r"(?<![^\W_])[^\W_](?:[\s.\-_/,]{1,2}[^\W_]){2,40}(?![^\W_])")


def solution_verbs(actions: Iterable[str] | None) -> list[str]:
    """The first tokens of the multi-token ``\\boxed{}`` commands of ``actions``, in order."""
    verbs: list[str] = []
    for action in list(actions or [])[:64]:
        for command in boxed_contents(action) if isinstance(action, str) else []:
            parts = command.split()
            if len(parts) > 1 and parts[0] not in verbs and len(parts[0]) <= 40:
                verbs.append(parts[0])
    return verbs[:MAX_VERBS]


def _values(hint: str) -> list[str]:
    """What could be copied out of ``hint``, in the order the hint gives it."""
    text = hint[:MAX_HINT_CHARS]
    found: list[tuple[int, str]] = []
    for m in _QUOTED.finditer(text):
        found.append((m.start(), next(g for g in m.groups() if g is not None).strip()))
    for m in re.finditer(r"\S{2,80}", text):  # ids: a letter and a digit (E123, FIN-7, b7)
        chunk = m.group(0).strip(".,;:!?()[]{}<>\"'")
        if any(c.isdigit() for c in chunk) and any(c.isalpha() for c in chunk):
            found.append((m.start(), chunk))
    for m in _SPELLED.finditer(text):
        found.append((m.start(), "".join(tokens(m.group(0)))))
    for m in re.finditer(r"(?<![\w.,])-?\d[\d,]{0,40}(?:\.\d{1,40})?", text):
        found += [(m.start(), n) for n in sorted(numbers_in(m.group(0)))]
    words = tokens(text)
    found += [(len(text), n) for n in sorted(number_words(words))]
    for m in _WORD.finditer(text):
        word = m.group(0)
        if word.lower() not in STOP_WORDS:
            found.append((m.start(), word))
            found.append((m.start(), word.lower()))
    out: list[str] = []
    for _pos, value in sorted(found, key=lambda p: p[0]):
        if value and len(value) <= MAX_VALUE_CHARS and value not in out:
            out.append(value)
    return out


def _wrap(value: str, setting: str) -> str:
    return f"<answer>{value}</answer>" if setting == "tooluse" else f"\\boxed{{{value}}}"


def hint_candidates(hint: str | None, setting: str = "games", verbs: Iterable[str] = (),
                    max_candidates: int = MAX_CANDIDATES, max_turns: int = 12
                    ) -> tuple[list[str], list[list[str]]]:
    """``(singles, sequences)``: the wrapped single actions to try first, capped at
    ``max_candidates``, and up to ``MAX_SEQUENCES`` action sequences of at most ``max_turns``."""
    if not isinstance(hint, str) or not hint.strip():
        return [], []
    values = _values(hint)
    verbs = [v for v in verbs if isinstance(v, str)][:MAX_VERBS]
    singles = [_wrap(v, setting) for v in values]
    for verb in verbs:
        singles += [_wrap(f"{verb} {v}", setting) for v in values if v.lower() != verb.lower()]
    singles = list(dict.fromkeys(singles))[:max(0, max_candidates)]
    plain = [v for v in values if v == v.lower() or v.lower() not in values]
    sequences = [[_wrap(v, setting) for v in plain]]
    sequences += [[_wrap(f"{verb} {v}", setting) for v in plain if v.lower() != verb.lower()]
                  for verb in verbs]
    sequences = [s[:max(1, max_turns)] for s in sequences if len(s) > 1][:MAX_SEQUENCES]
    return singles, sequences


def _wins(sb: Any, seed: int, actions: list[str], max_turns: int) -> bool:
    env = sb.new_env(max_turns=max_turns)
    try:
        env.reset(seed=seed)
        for action in actions[:max(1, max_turns)]:
            _obs, reward, terminated, truncated, _info = env.step(action)
            if terminated:
                return reward >= 1.0
            if truncated:
                return False
        return False
    finally:
        env.close()


def empirical_leak(pool: Any, code: str, hint: str | None, *, setting: str = "games",
                   seeds: Iterable[int] = (0, 1, 2), max_turns: int = 12,
                   solution: Iterable[str] | None = None, budget_s: float = EMPIRICAL_BUDGET_S,
                   max_candidates: int = MAX_CANDIDATES) -> list[str] | None:
    """The first hint-derived action sequence that wins ``code`` on every one of ``seeds`` (see
    the module docstring), or ``None``. Never raises on a hostile program or hint; a sandbox
    failure or the budget running out gives ``None``."""
    singles, sequences = hint_candidates(hint, setting, solution_verbs(solution),
                                         max_candidates, max_turns)
    seeds = list(seeds)[:8]
    if not singles or not seeds:
        return None
    deadline = time.monotonic() + max(0.0, float(budget_s))
    try:
        sb = pool.acquire(code)
    except SandboxError as exc:
        log.info("hint leak probe: the program did not load (%s)", exc.reason)
        return None
    try:
        for actions in [[s] for s in singles] + sequences:
            if all(_try(sb, seed, actions, max_turns, deadline) for seed in seeds):
                return actions
            if time.monotonic() > deadline or not sb.alive:
                return None
        return None
    except SandboxError as exc:
        log.info("hint leak probe stopped: %s (%s)", exc.reason, exc.message[:200])
        return None
    finally:
        pool.release(sb)


def _try(sb: Any, seed: int, actions: list[str], max_turns: int, deadline: float) -> bool:
    if time.monotonic() > deadline:
        return False
    try:
        return _wins(sb, seed, actions, max_turns)
    except (EnvRaised, InvalidResult):  # raised on this input or broke the contract: no win
        return False
