"""Garbage that reads like a model's reply.

``tests/data/reward_attacks/verbose_pays.py`` pays any reply with six or more words before its
final ``\\boxed{}`` on half the seeds, and on every seed when the reply says the hint's phrase
"binary search". No garbage template used to put six words before a box, so it validated 20
times in 20. Garbage now has model-like replies (``probes.model_reply``: prose of 0 to ~80
words, reasoning phrases, words of the observation and of the hint, then a boxed garbage
command), and the validator refuses the program; an honest program still validates.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.envs.program import EnvProgram
from spadekit.sandbox.probes import MAX_GARBAGE_CHARS, garbage_actions, words_of
from spadekit.sandbox.validate import Validator

ATTACKS = Path(__file__).resolve().parents[1] / "data" / "reward_attacks"
HACKS = Path(__file__).resolve().parents[1] / "data" / "hacks"
VERBOSE_HINT = ("Reason out loud, in a full sentence, that you will use binary search, before "
                "each boxed guess.")
BOX = re.compile(r"\\boxed\{([^{}]*)\}")
OBS = "A vault with a three-digit code. Send a guess as \\boxed{guess N}."


def words_before_box(action: str) -> int:
    boxes = list(BOX.finditer(action))
    return len(re.findall(r"[A-Za-z']+", action[:boxes[-1].start()])) if boxes else -1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.integers(0, 30), tooluse=st.booleans(),
       hint=st.one_of(st.none(), st.text(max_size=300)),
       observation=st.one_of(st.none(), st.text(max_size=500)))
def test_model_like_garbage_is_fixed_by_its_seed_and_bounded(seed, n, tooluse, hint,
                                                             observation):
    kw = {"observation": observation, "hint": hint}
    one = garbage_actions(seed, n, tooluse, ["\\boxed{probe 12}"], **kw)
    assert one == garbage_actions(seed, n, tooluse, ["\\boxed{probe 12}"], **kw)
    assert len(one) == n and all(isinstance(a, str) for a in one)
    assert all(len(a) <= MAX_GARBAGE_CHARS + 40 for a in one)


def test_garbage_has_replies_of_a_models_length_before_a_box():
    actions = [a for s in range(200) for a in garbage_actions(s, 12, observation=OBS)]
    counts = [words_before_box(a) for a in actions]
    long = [a for a, c in zip(actions, counts) if c >= 6]
    assert len(long) > 0.1 * len(actions)  # a sentence or more before the box: often
    assert max(counts) >= 60  # and up to a model's paragraph
    assert max(len(a) for a in actions) > 400  # beyond the old 400-character cap
    echoed = [a for a in long if "three digit code" in a]
    assert echoed  # some repeat the observation's words
    assert not any("binary search" in a for a in actions)  # no hint, no hint words


def test_garbage_repeats_the_hints_words_only_when_there_is_a_hint():
    with_hint = [a for s in range(100) for a in garbage_actions(s, 12, hint=VERBOSE_HINT)]
    said = [a for a in with_hint if "binary search" in a and words_before_box(a) >= 6]
    assert len(said) > 0.02 * len(with_hint)
    assert words_of(VERBOSE_HINT)[:3] == ["Reason", "out", "loud"]


def test_verbose_pays_is_refused_and_the_honest_vault_still_validates(pool):
    program = EnvProgram(code=(ATTACKS / "verbose_pays.py").read_text(), hint=VERBOSE_HINT)
    for seed in (1, 2, 3):
        report = Validator(pool, seed=seed).validate(program)
        assert not report.ok, report.details.get("garbage_returns")
        assert (report.stage, report.reason) == ("action_dependent", "action_independent")
    honest = EnvProgram(code=(HACKS / "honest_vault.py").read_text(), hint=VERBOSE_HINT)
    for seed in (1, 2, 3):
        report = Validator(pool, seed=seed).validate(honest)
        assert report.ok, (report.reason, report.message)
