"""The empirical half of the hint leak check: a hint that lets garbage plus the hint win leaks.

:func:`hint_candidates` turns a hint into the actions an agent could copy out of it without
reasoning (quoted phrases, numbers, spellings, id-like chunks, content words; decoded forms
first: arithmetic, digits said apart, reversals, initials), each also after each solution verb.
:func:`empirical_leak` plays them in the real sandbox in play's lockstep shape, among decoys, on
seeds drawn per hint: a candidate winning on at least ``win_share`` (3/4) of the seeds leaks.
Bounded (``MAX_CANDIDATES``, ``MAX_SEQUENCES``, ``MAX_SEEDS``, ``budget_s``); a sandbox failure
ends the probe with "no leak found", never raises. Not covered: riddles and world knowledge,
other ciphers, partial answers. Details: docs/design/selfplay.md.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from typing import Any, Iterable

from spadekit.common.errors import EnvRaised, InvalidResult, SandboxError
from spadekit.sandbox.lockstep import LockstepError, play_lockstep
from spadekit.selfplay.leaks import (INITIAL_CUES, MAX_HINT_CHARS, STOP_WORDS, arithmetic, boxed_contents,
                                     initials, number_words, numbers_in, reversal_cued,
                                     spelled_digits, tokens)

__all__ = ["EMPIRICAL_BUDGET_S", "MAX_CANDIDATES", "MAX_SEEDS", "MAX_SEQUENCES", "MIN_GROUP",
           "WIN_SHARE", "empirical_leak", "hint_candidates", "solution_verbs"]

log = logging.getLogger(__name__)

EMPIRICAL_BUDGET_S = 10.0
MAX_CANDIDATES = 40
MAX_SEQUENCES = 4
MAX_SEEDS = 32
MAX_VERBS = 3
MAX_VALUE_CHARS = 80
WIN_SHARE = 0.75
MIN_GROUP = 8
MAX_DECOYS = 8
GROUP_CANDIDATES = 2

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


def _decoded(text: str) -> tuple[list[str], list[str]]:
    """The decoded forms of ``text`` (the module docstring's list): the few telling ones
    (arithmetic, digits said apart, initials, reversed numbers) and the hint's words reversed."""
    words = tokens(text)
    found = sorted(arithmetic(words)) + sorted(spelled_digits(text))
    found += initials(text, clauses=any(w in INITIAL_CUES for w in words))
    if reversal_cued(words):
        found += [n[::-1].lstrip("0") or "0" for n in sorted(numbers_in(text)) if n.isdigit()
                  and len(n) >= 2]
    backwards = [w[::-1] for w in words if len(w) >= 4 and w.isalpha() and w[::-1] != w
                 and w not in STOP_WORDS]
    return found, backwards


def _values(hint: str) -> tuple[list[str], list[str], list[str]]:
    """What could be copied out of ``hint``: ``(telling, values, backwards)``, the telling
    decoded forms (:func:`_decoded`), the rest in the hint's order and the reversed words."""
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
    telling, backwards = _decoded(text)
    telling, backwards = ([v for v in dict.fromkeys(part) if v and len(v) <= MAX_VALUE_CHARS
                           and v not in out] for part in (telling, backwards))
    return telling, out, backwards


def _wrap(value: str, setting: str) -> str:
    return f"<answer>{value}</answer>" if setting == "tooluse" else f"\\boxed{{{value}}}"


def hint_candidates(hint: str | None, setting: str = "games", verbs: Iterable[str] = (),
                    max_candidates: int = MAX_CANDIDATES, max_turns: int = 12
                    ) -> tuple[list[str], list[list[str]]]:
    """``(singles, sequences)``: the wrapped single actions to try first (the telling decoded
    forms, the hint's values, the reversed words, then values after each verb), capped at
    ``max_candidates``, and up to ``MAX_SEQUENCES`` action sequences of at most ``max_turns``."""
    if not isinstance(hint, str) or not hint.strip():
        return [], []
    telling, values, backwards = _values(hint)
    verbs = [v for v in verbs if isinstance(v, str)][:MAX_VERBS]
    singles = [_wrap(v, setting) for v in telling + values + backwards]
    for verb in verbs:
        singles += [_wrap(f"{verb} {v}", setting) for v in values if v.lower() != verb.lower()]
    singles = list(dict.fromkeys(singles))[:max(0, max_candidates)]
    plain = [v for v in values if v == v.lower() or v.lower() not in values]
    sequences = [[_wrap(v, setting) for v in plain]]
    sequences += [[_wrap(f"{verb} {v}", setting) for v in plain if v.lower() != verb.lower()]
                  for verb in verbs]
    sequences = [s[:max(1, max_turns)] for s in sequences if len(s) > 1][:MAX_SEQUENCES]
    return singles, sequences


class _OutOfTime(Exception):
    pass


def _group(chunk: list[int], candidates: list[list[str]], seeds: list[int],
           rng: random.Random) -> list[tuple[int | None, int, list[str]]]:
    """One lockstep group: every seed of each candidate in ``chunk`` plus a drawn number of
    decoys (``None``: a drawn seed, a drawn candidate), at least ``MIN_GROUP``, shuffled."""
    episodes: list[tuple[int | None, int, list[str]]] = [(k, seed, candidates[k])
                                                         for k in chunk for seed in seeds]
    decoys = max(MIN_GROUP - len(episodes), 0) + rng.randint(0, MAX_DECOYS)
    episodes += [(None, rng.randrange(2 ** 31), rng.choice(candidates)) for _ in range(decoys)]
    rng.shuffle(episodes)
    return episodes


def _play_group(sb: Any, episodes: list, max_turns: int, deadline: float) -> list[bool]:
    """Whether each episode of the group won, played in lockstep; an episode that makes the
    program raise (or break the contract) is no win and the group is replayed without it."""
    won = [False] * len(episodes)
    todo = list(range(len(episodes)))

    def in_time(_total: float, _steps: list[float]) -> None:
        if time.monotonic() > deadline:
            raise _OutOfTime()

    while todo:
        try:
            result = play_lockstep(sb, [(episodes[i][1], episodes[i][2][:max(1, max_turns)])
                                        for i in todo], cap=max(1, max_turns),
                                   max_turns=max_turns, after_turn=in_time)
        except LockstepError as exc:
            if not isinstance(exc.error, (EnvRaised, InvalidResult)) or not sb.alive:
                raise exc.error
            del todo[exc.index]
            continue
        for i, trace in zip(todo, result.traces):
            last = trace[-1]
            won[i] = len(last) == 4 and bool(last[2]) and last[1] >= 1.0
        return won
    return won


def empirical_leak(pool: Any, code: str, hint: str | None, *, setting: str = "games",
                   seeds: Iterable[int] = (0, 1, 2), max_turns: int = 12,
                   solution: Iterable[str] | None = None, budget_s: float = EMPIRICAL_BUDGET_S,
                   max_candidates: int = MAX_CANDIDATES, win_share: float = WIN_SHARE,
                   rng: random.Random | None = None) -> list[str] | None:
    """The first hint-derived action sequence that wins ``code`` on at least ``win_share`` of
    ``seeds`` (at least one seed), played in play's shape (see the module docstring), or
    ``None``. ``rng`` draws the decoys and the order (default: seeded by the seeds). Never
    raises on a hostile program or hint; a sandbox failure or the budget running out gives
    ``None``."""
    singles, sequences = hint_candidates(hint, setting, solution_verbs(solution),
                                         max_candidates, max_turns)
    seeds = list(seeds)[:MAX_SEEDS]
    if not singles or not seeds:
        return None
    need = max(1, math.ceil(win_share * len(seeds) - 1e-9))
    rng = rng if rng is not None else random.Random(sum(seeds) + len(seeds))
    candidates = [[s] for s in singles] + sequences
    deadline = time.monotonic() + max(0.0, float(budget_s))
    try:
        sb = pool.acquire(code)
    except SandboxError as exc:
        log.info("hint leak probe: the program did not load (%s)", exc.reason)
        return None
    try:
        for first in range(0, len(candidates), GROUP_CANDIDATES):
            chunk = list(range(first, min(first + GROUP_CANDIDATES, len(candidates))))
            episodes = _group(chunk, candidates, seeds, rng)
            won = _play_group(sb, episodes, max_turns, deadline)
            for k in chunk:
                if sum(w for (j, _seed, _a), w in zip(episodes, won) if j == k) >= need:
                    return candidates[k]
            if time.monotonic() > deadline or not sb.alive:
                return None
        return None
    except _OutOfTime:
        return None
    except SandboxError as exc:
        log.info("hint leak probe stopped: %s (%s)", exc.reason, exc.message[:200])
        return None
    finally:
        pool.release(sb)
