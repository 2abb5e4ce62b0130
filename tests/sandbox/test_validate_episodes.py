"""Staged-validator tests (``spadekit.sandbox.validate``, real sandboxes): the episode stages.

Determinism, solution, not_trivially_won and ends, then ``validate_many``, reports, pool
ownership and the bundled library (extract/syntax/load: ``test_validate_load.py``;
interface/tools: ``test_validate_interface.py``; shared programs and helpers:
``validate_cases.py``). Every stage gets at least one program that gets through it and one that
fails it with its stable ``reason`` code. Each test runs once per isolation tier that boots here
(the ``pool`` fixture).
"""

from __future__ import annotations

import json
import math

import pytest

pytest.register_assert_rewrite("validate_cases")  # expect()'s assert gets pytest's report

from conftest import ECHO, assert_pool_works  # noqa: E402
from spadekit.sandbox.validate import Validator, ValidatorSettings  # noqa: E402
from validate_cases import (  # noqa: E402,F401
    GUESS,
    GUESS_BASE,
    GUESS_SOLUTION_NOT_LIST,
    GUESS_SOLUTION_RAISES,
    GUESS_SWEEP_SOLUTION,
    GUESS_WRONG_SOLUTION,
    STEP_RAISES_ON_GARBAGE,
    STEP_REWARD_TOO_BIG,
    STOCK,
    STOCK_BASE,
    STOCK_CRITERIA,
    SYNTAX_ERROR,
    expect,
    validator,
)

try:
    from spadekit.envs.library import list_library, source
except ImportError:  # the library is written elsewhere; its test skips until it exists
    LIBRARY = []
else:
    LIBRARY = list_library()


# ---------------------------------------------------------------------------------------------
# determinism

SCRAMBLE_GLOBAL_RANDOM = r'''
import random

WORDS = ["planet", "garden", "rocket", "silver", "canvas", "bottle", "magnet", "throne"]


class ScrambleEnv:
    """Unscramble a six-letter word."""

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        rng = random.Random()  # seeded from the OS: ignores the seed
        self.word = rng.choice(WORDS)
        letters = rng.sample(self.word, len(self.word))
        self.puzzle = rng.randint(1000, 9999)
        self.turn = 0
        return f"Puzzle #{self.puzzle}: unscramble {''.join(letters)!r} in \\boxed{{}}.", {}

    def step(self, action):
        self.turn += 1
        won = action.split("\\boxed{")[-1].rstrip("}") == self.word
        return ("Solved!" if won else "No."), float(won), won, self.turn >= self.max_turns, {}
'''

REACTION_TIME = r'''
import random
import time


class ReactionEnv:
    """Type the shown word back as fast as you can."""

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.word = random.Random(seed).choice(["alpha", "bravo", "delta", "omega"])
        self.turn = 0
        return f"Type {self.word!r} in \\boxed{{}}.", {}

    def step(self, action):
        self.turn += 1
        stamp = time.time()
        won = action.strip() == "\\boxed{" + self.word + "}"
        return (f"[{stamp:.6f}] {'match' if won else 'no match'}", float(won), won,
                self.turn >= self.max_turns, {})
'''


@pytest.mark.parametrize("code, first_difference, what", [
    (SCRAMBLE_GLOBAL_RANDOM, 0, "reset observation"),
    (REACTION_TIME, 1, "step 1 result"),
], ids=["unseeded_random", "wall_clock"])
def test_nondeterministic_env_fails_at_determinism(validator, code, first_difference, what):
    report = validator.validate(code)
    expect(report, False, "determinism", "nondeterministic")
    assert report.details["first_difference"] == first_difference
    assert f"different {what}" in report.message
    assert "random.Random(seed)" in report.message


# ---------------------------------------------------------------------------------------------
# solution


def test_correct_solution_is_replayed_for_every_seed(pool):
    seeds = (5, 6, 7, 8)
    report = Validator(pool=pool, settings=ValidatorSettings(seeds=seeds)).validate(GUESS)
    expect(report, True, "done", "ok")
    assert report.details["solution"] == "replayed"
    turns = report.details["solution_turns"]
    assert len(turns) == len(seeds) + 3  # and three drawn seeds
    assert report.details["seeds"]["solution"][:4] == list(seeds)
    assert all(1 <= t <= 10 for t in turns)  # binary search over 900 numbers


@pytest.mark.parametrize("code, needle", [
    (GUESS_WRONG_SOLUTION, "replaying solution() for seed 0 does not reach reward 1.0 "
                           "(reward 0, terminated=False after 1 of 1 actions)"),
    (GUESS_SWEEP_SOLUTION, "solution() for seed 0 has 900 actions, more than max_turns=12"),
    (GUESS_SOLUTION_RAISES, "solution() failed: AttributeError"),
    (GUESS_SOLUTION_NOT_LIST, "solution() must return a list of action strings"),
], ids=["wrong", "too_long", "raises", "not_a_list"])
def test_bad_solution_fails_at_solution(validator, code, needle):
    report = validator.validate(code)
    expect(report, False, "solution", "solution_fails")
    assert needle in report.message
    if "replaying" in needle:
        assert report.details["seed"] == 0


# a designed program must come with a solution (reason no_solution); without
# require_solution (reference imports) a missing one is recorded as absent and the program valid
NO_REQUIREMENT = ValidatorSettings(require_solution=False)


def test_tool_env_without_solution_is_refused_or_absent(validator, pool):
    expect(validator.validate(STOCK_BASE + STOCK_CRITERIA), False, "solution", "no_solution")
    report = Validator(pool, NO_REQUIREMENT).validate(STOCK_BASE + STOCK_CRITERIA)
    expect(report, True, "done", "ok")
    assert report.details["solution"] == "absent"


def test_missing_solution_is_refused_or_absent(validator, pool):
    expect(validator.validate(GUESS_BASE), False, "solution", "no_solution")
    report = Validator(pool, NO_REQUIREMENT).validate(GUESS_BASE)
    expect(report, True, "done", "ok")
    assert report.details["has_solution"] is False
    assert report.details["solution"] == "absent"
    assert "solution_turns" not in report.details


# ---------------------------------------------------------------------------------------------
# not_trivially_won

ANY_BOX_WINS = r'''
class RiddleEnv:
    """What has keys but cannot open locks?"""

    def reset(self, seed=None, options=None):
        return "What has keys but cannot open locks? Answer in \\boxed{}.", {}

    def step(self, action):
        if "\\boxed{" in action:  # meant to compare with "piano"
            return "Correct!", 1.0, True, False, {}
        return "Put your answer in \\boxed{}.", 0.0, False, False, {}
'''


def test_game_won_by_any_boxed_answer_fails(validator, pool):
    expect(validator.validate(ANY_BOX_WINS), False, "solution", "no_solution")
    report = Validator(pool, NO_REQUIREMENT).validate(ANY_BOX_WINS)
    expect(report, False, "action_dependent", "trivially_won")
    seed = report.details["garbage_seed"]
    assert seed == report.details["reference_episode"]["seed"]  # the first garbage episode
    won_by = report.details["garbage_actions"]
    assert "\\boxed{" in won_by[-1] and all("\\boxed{" not in a for a in won_by[:-1])
    assert report.message.startswith(f"garbage actions reached reward 1.0 (seed {seed}, "
                                     f"garbage action {len(won_by)}: ")
    assert report.details["solution"] == "absent"


def test_game_with_partial_credit_for_garbage_still_passes(pool):
    # rewards 0.5 for anything, never 1.0 (no solution: the absolute criterion)
    report = Validator(pool, NO_REQUIREMENT).validate(ECHO)
    expect(report, True, "done", "ok")
    assert report.details["garbage_best_reward"] == 0.5


# ---------------------------------------------------------------------------------------------
# ends

NEVER_ENDS = r'''
class ChatEnv:
    """Small talk that goes on forever."""

    def reset(self, seed=None, options=None):
        self.heard = []
        return "Hi! Tell me something.", {}

    def step(self, action):
        self.heard.append(action)
        return f"I have heard {len(self.heard)} things.", 0.0, False, False, {}
'''

HANGMAN = r'''
import random

WORDS = ["cipher", "lantern", "meadow", "quartz", "voyage"]


class HangmanEnv:
    """Guess the letters of a hidden word; every turn that reveals nothing costs one of 3 lives."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.word = random.Random(seed).choice(WORDS)
        self.found, self.lives, self.turn = set(), 3, 0
        return f"Word: {self.mask()} ({self.lives} lives). Guess a letter in \\boxed{{x}}.", {}

    def mask(self):
        return " ".join(c if c in self.found else "_" for c in self.word)

    def step(self, action):
        self.turn += 1
        letter = action.split("\\boxed{")[-1].split("}")[0].strip().lower()
        if len(letter) == 1 and letter in self.word and letter not in self.found:
            self.found.add(letter)
        else:
            self.lives -= 1
        if set(self.word) <= self.found:
            return f"Solved: {self.word}", 1.0, True, False, {}
        if self.lives == 0:
            return f"Out of lives; it was {self.word}.", 0.0, True, False, {}
        return (f"Word: {self.mask()} ({self.lives} lives)", 0.0, False,
                self.turn >= self.max_turns, {})

    def solution(self):
        return [f"\\boxed{{{c}}}" for c in dict.fromkeys(self.word)]
'''


def test_env_that_never_ends_is_valid_with_the_runner_cap(pool):
    report = Validator(pool, NO_REQUIREMENT).validate(NEVER_ENDS)
    expect(report, True, "done", "ok")
    assert report.details["ends"].startswith("runner_cap")
    assert "within 12 steps" in report.details["ends"]
    # no constructor: the worker builds it without arguments and sets max_turns itself
    assert report.details["max_turns"] == 12


def test_env_that_truncates_reports_it(pool):
    report = Validator(pool=pool, settings=ValidatorSettings(
        max_turns=5, require_solution=False)).validate(ECHO)
    expect(report, True, "done", "ok")
    assert report.details["max_turns"] == 5
    assert report.details["ends"] == "truncated after 5 steps"


def test_env_that_terminates_on_its_own_reports_it(validator):
    report = validator.validate(HANGMAN)
    expect(report, True, "done", "ok")
    assert report.details["ends"] == "terminated after 3 steps"
    assert report.details["solution"] == "replayed"
    assert all(4 <= t <= 7 for t in report.details["solution_turns"])


# ---------------------------------------------------------------------------------------------
# validate_many, reports, pool ownership


def test_validate_many_returns_reports_in_order(validator):
    sources = [GUESS, "Just prose, no program here at all.", SYNTAX_ERROR, STEP_REWARD_TOO_BIG,
               STOCK, ANY_BOX_WINS]
    reports = validator.validate_many(sources, workers=3)
    assert [(r.ok, r.stage, r.reason) for r in reports] == [
        (True, "done", "ok"),
        (False, "extract", "no_code"),
        (False, "syntax", "syntax"),
        (False, "interface", "reward_out_of_range"),
        (True, "done", "ok"),
        (False, "solution", "no_solution"),
    ]
    assert reports[0].details["class_name"] == "GuessEnv"
    assert reports[4].details["class_name"] == "StockEnv"


def test_report_to_dict_is_json(validator):
    good = validator.validate(GUESS)
    bad = validator.validate(STEP_RAISES_ON_GARBAGE)
    for report in (good, bad):
        data = json.loads(json.dumps(report.to_dict()))
        assert data["ok"] is report.ok and data["reason"] == report.reason
        assert data["program"]["sha256"] == report.program.sha256
        assert data["program"]["class_name"] in ("GuessEnv", "DoubleEnv")
    assert math.isfinite(good.to_dict()["details"]["timings_ms"]["total"])
    assert validator.validate("").to_dict()["program"] is None


def test_validator_does_not_close_a_pool_it_was_given(pool):
    with Validator(pool=pool) as v:
        expect(v.validate(GUESS), True, "done", "ok")
    assert_pool_works(pool)
    expect(Validator(pool=pool).validate(GUESS), True, "done", "ok")


# ---------------------------------------------------------------------------------------------
# the library


@pytest.mark.skipif(not LIBRARY, reason="spadekit.envs.library is not available yet")
@pytest.mark.parametrize("name", [env.name for env in LIBRARY] or ["none"])
def test_library_program_validates(validator, name):
    env = next(e for e in LIBRARY if e.name == name)
    report = validator.validate(source(name))
    expect(report, True, "done", "ok")
    assert (report.details["domain"] == "tooluse") == (env.setting == "tooluse")
    assert report.details["solution"] == "replayed"
