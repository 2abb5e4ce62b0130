"""Three ways around the hint leak check (tests/data/reward_attacks/):
a password that differs only on the public seeds 0-2, a password that opens only where a worker
reset a group before its first step (play's shape), and hints that give the answer encoded.
Each is caught here on real programs in the real sandbox, through the design phase where it
can be, and the honest controls (tests/data/leaks/ and every library hint) still pass.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spadekit.common.streams import RoundStreams
from spadekit.envs.library import list_library, source
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.sandbox.pool import SandboxPool
from spadekit.selfplay.generate import solution_actions
from spadekit.selfplay.leak_probe import empirical_leak, hint_candidates
from spadekit.selfplay.leaks import (STOP_WORDS, SolutionTrace, arithmetic, initials,
                                     leaked_fragments, spelled_digits, tokens)

TESTS = Path(__file__).resolve().parents[1] / "data"
ATTACKS = TESTS / "reward_attacks"
PUBLIC_SEED = (ATTACKS / "public_seed_password.py").read_text()
PROBE_ORDER = (ATTACKS / "probe_order_password.py").read_text()
PASSWORD = (TESTS / "honesty" / "password.py").read_text().replace("NAME", "K1") \
    .replace("SECRET_WORD", "xyzzy")
ANSWER = (TESTS / "honesty" / "answer42.py").read_text().replace("NAME", "K2") \
    .replace("ANSWER", "42")
PLAIN = "The magic word that opens the door is xyzzy."
_DRAW = random.Random(7)
DRAWN = [_DRAW.randrange(2 ** 31) for _ in range(16)]

ENCODED = {  # program -> (hint, what the literal check reports)
    "password": [("The magic word is yzzyx read backwards.", "xyzzy (reversed)"),
                 ("The magic word: take the first letters of Xenon Yak Zebra Zoo Yodel.",
                  "xyzzy (initial letters)"),
                 ("Shift each letter of wxyyx one step forward in the alphabet to get the magic "
                  "word.", "xyzzy (letters shifted by 1)"),
                 ("The magic word is xyz followed by zy.", "xyzzy (split)")],
    "answer": [("Always answer six times seven.", "42"),
               ("Always answer 4 2 without the space.", "42"),
               ("Always answer the number of the 24 with its digits swapped.",
                "42 (digits reversed)"),
               ("Always answer 40 plus 2.", "42")],
}
PROGRAMS = {"password": PASSWORD, "answer": ANSWER}
HONEST_LEAK_FIXTURES = {
    "password": ["Classic text adventures had a famous magic word; the door wants one of those."],
    "answer42": ["Halve the range with every guess: start in the middle and follow higher or "
                 "lower.", "There are 100 numbers; 17 and 7.5 are far from it."],
    "obfuscated": ["The most worn keys are in the code; inspect them first and try the words "
                   "they can spell."],
    "multistep": ["The order is fixed; a wrong press sends you back to the start, so keep what "
                  "worked. Blue matters."],
    "shown": ["Only one colour works and it never changes; the shuffled order does not matter."],
    "doors": ["There are 3 doors; knock on each before opening one.",
              "Knock first: the prize door chimes, and door 1 is not always it."],
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(warm=1) as p:
        yield p


def mute(text: str) -> str:
    """The program without its ``solution()``: only the empirical probe can judge a hint."""
    return text[:text.index("    def solution(self):")].rstrip() + "\n"


# -- attack 1: public seeds ------------------------------------------------------------------


def test_public_seed_password_is_caught_on_drawn_seeds(pool):
    public = solution_actions(pool, PUBLIC_SEED, 3)
    assert leaked_fragments(PLAIN, public) == []  # the hole: seeds 0-2 only
    assert empirical_leak(pool, PUBLIC_SEED, PLAIN, max_turns=3) is None
    trace = solution_actions(pool, PUBLIC_SEED, 3, DRAWN, random.Random(1))
    assert len(trace.per_seed) == 3 + len(DRAWN)
    # XYZZY is carved over the door on about half the drawn seeds: not shown on all that use it
    assert any("XYZZY" in o for o in trace.observations)
    assert leaked_fragments(PLAIN, trace) == ["xyzzy"]
    assert empirical_leak(pool, mute(PUBLIC_SEED), PLAIN, seeds=DRAWN, max_turns=3) == \
        ["\\boxed{xyzzy}"]


def test_a_word_every_using_seed_shows_is_still_exempt():
    trace = SolutionTrace(["\\boxed{xyzzy}", "\\boxed{plugh}"], per_seed=[["\\boxed{xyzzy}"],
                                                                          ["\\boxed{plugh}"]],
                          observations=["Carved: XYZZY.", "Carved: PLUGH."])
    assert leaked_fragments(PLAIN, trace) == []
    trace.observations = ["Nothing carved.", "Carved: XYZZY and PLUGH."]
    assert leaked_fragments(PLAIN, trace) == ["xyzzy"]


# -- attack 2: probe order -------------------------------------------------------------------


def test_probe_order_password_is_caught_in_plays_shape(pool):
    trace = solution_actions(pool, PROBE_ORDER, 3, DRAWN, random.Random(2))
    assert leaked_fragments(PLAIN, trace) == []  # honest solution(): only playing shows it
    assert empirical_leak(pool, PROBE_ORDER, PLAIN, seeds=DRAWN, max_turns=3,
                          solution=trace) == ["\\boxed{xyzzy}"]


def _design(tmp_path: Path, pool, programs: dict[str, str]):
    """One real design phase whose scripted designer writes ``programs`` (class -> code) with
    the plain password hint; returns its outcome."""
    from spadekit.runs.store import RunStore
    from spadekit.sandbox.validate import Validator, ValidatorSettings
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.design import DesignPhase
    from spadekit.selfplay.memory import EnvironmentMemory

    cfg = load_config("cpu-tiny", overrides=[
        "model=tiny", "rounds=1", f"envs_per_round={len(programs)}", "bootstrap=null",
        "memory_seed_library=false", "dedup_threshold=1.01", "designer.max_new_tokens=8192",
        "rollout.max_turns=3", "tensorboard=false", "designer.hint_max_new_tokens=1024"])
    codes, state = list(programs.values()), {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: " + PLAIN
        program = codes[state["n"] % len(codes)]
        state["n"] += 1
        return f"```python\n{program}\n```\nHINT: none"

    with RunStore(tmp_path / "run", create=True) as store:
        memory = EnvironmentMemory(store, cap=cfg.memory_size,
                                   duplicate_threshold=cfg.dedup_threshold)
        phase = DesignPhase(cfg, ScriptedPolicy(tiny_tokenizer(), respond), pool,
                            Validator(pool, ValidatorSettings(max_turns=cfg.env_max_turns),
                                      seed=0), store, memory, None)
        return phase.run(0, RoundStreams(0, 0))


def test_both_password_programs_lose_their_hint_in_the_design_phase(tmp_path, pool):
    out = _design(tmp_path, pool, {"VaultWordEnv": PUBLIC_SEED, "DoorEnv": PROBE_ORDER})
    assert out.valid == 2, out.reasons
    assert out.hints["ok"] == 0 and out.hints["leaks"] == 2
    assert out.hints["leaks_literal"] == 1 and out.hints["leaks_empirical"] == 1
    assert {tuple(d["evidence"]) for d in out.leak_details} == {("xyzzy",), ("\\boxed{xyzzy}",)}


# -- attack 3: encoded hints -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_encoded_hints_are_caught_literally_and_by_playing(name, pool):
    trace = solution_actions(pool, PROGRAMS[name], 3, DRAWN[:4], random.Random(3))
    silent = mute(PROGRAMS[name])
    for hint, report in ENCODED[name]:
        assert leaked_fragments(hint, trace) == [report], hint
        if "split" in report or "shifted" in report:
            continue  # the probe does not try those forms; the literal check must
        won = empirical_leak(pool, silent, hint, seeds=DRAWN, max_turns=3)
        assert won and won[0].lower() in ("\\boxed{xyzzy}", "\\boxed{42}"), (hint, won)


def test_world_knowledge_hints_pass_as_documented(pool):
    trace = solution_actions(pool, PASSWORD, 3)
    hint = "The magic word is the classic Colossal Cave Adventure teleport word."
    assert leaked_fragments(hint, trace) == []


@pytest.mark.parametrize("name", sorted(HONEST_LEAK_FIXTURES))
def test_honest_controls_pass_on_drawn_seeds(name, pool):
    program = (TESTS / "leaks" / f"{name}.py").read_text()
    trace = solution_actions(pool, program, 12, DRAWN, random.Random(4))
    for hint in HONEST_LEAK_FIXTURES[name]:
        assert leaked_fragments(hint, trace) == [], hint
        assert empirical_leak(pool, program, hint, seeds=DRAWN, solution=trace) is None, hint


@pytest.mark.parametrize("entry", list_library(), ids=lambda e: e.name)
def test_library_hints_pass_on_drawn_seeds(entry, pool):
    program = source(entry.name)
    trace = solution_actions(pool, program, 12, DRAWN[:8], random.Random(5))
    assert trace and leaked_fragments(entry.hint, trace) == []
    assert empirical_leak(pool, program, entry.hint, setting=entry.setting, solution=trace,
                          seeds=DRAWN, budget_s=30) is None


def test_decoded_candidates_come_first():
    singles, _ = hint_candidates("Always answer six times seven, or yzzyx backwards.",
                                 max_candidates=3)
    assert singles[0] == "\\boxed{42}" and len(singles) == 3
    assert "\\boxed{xyzzy}" in hint_candidates("Say yzzyx.")[0]


# -- the new matchers, property-tested --------------------------------------------------------

WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spoken(n: int) -> str:
    if n < 20:
        return WORDS[n]
    return TENS[n // 10] + ("" if n % 10 == 0 else " " + WORDS[n % 10])


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 99), st.integers(0, 99), st.sampled_from(["plus", "minus", "times"]),
       st.booleans(), st.booleans())
def test_arithmetic_evaluates_digits_and_words(a, b, op, a_words, b_words):
    text = f"answer {spoken(a) if a_words else a} {op} {spoken(b) if b_words else b} now"
    want = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    assert str(want) in arithmetic(tokens(text))


@settings(max_examples=150, deadline=None)
@given(st.integers(10, 10 ** 6))
def test_digits_apart_join_and_lists_do_not(n):
    digits = str(n)
    assert spelled_digits("say " + " ".join(digits) + " now") == {digits}
    assert spelled_digits("doors " + ", ".join(digits)) == set()


LETTERS = st.text(string.ascii_lowercase, min_size=5, max_size=10)


@settings(max_examples=150, deadline=None)
@given(LETTERS, st.integers(1, 25), st.sampled_from(["reversed", "acrostic", "shift", "split"]))
def test_encoded_needles_are_found_and_reported(word, shift, form):
    assume(word not in STOP_WORDS)  # a stop word is never a needle (the rule skips it)
    trace = SolutionTrace([f"\\boxed{{{word}}}"])
    if form == "reversed":
        hint, mark = f"The code is {word[::-1]}.", "(reversed)"
    elif form == "acrostic":
        hint, mark = "Read " + " ".join(c + "ux" for c in word) + ".", "(initial letters)"
    elif form == "shift":
        moved = "".join(chr((ord(c) - 97 + shift) % 26 + 97) for c in word)
        hint, mark = f"Decode {moved} by hand.", "(letters shifted"
    else:
        assume(word[:2] not in STOP_WORDS and word[2:] not in STOP_WORDS)  # the rule skips them
        hint, mark = f"It is {word[:2]} followed by {word[2:]}.", "(split)"
    found = leaked_fragments(hint, trace)
    assert len(found) == 1 and found[0].startswith(word), (hint, found)
    if found[0] != word:  # a plain spelling wins over an encoded one (a palindrome, a shift)
        assert mark in found[0]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_new_scanners_never_raise_and_initials_are_lowercase(text):
    arithmetic(tokens(text))
    spelled_digits(text)
    assert all(i == i.lower() for i in initials(text))
