"""Staged-validator tests (``spadekit.sandbox.validate``, real sandboxes): extract, syntax, load.

Every stage gets at least one program that gets through it and one that fails it with its stable
``reason`` code (the other stages: ``test_validate_interface.py``, ``test_validate_episodes.py``;
shared programs and helpers: ``validate_cases.py``). The programs are small but written the way
a model would write them, bugs included. Each test runs once per isolation tier that boots here
(the ``pool`` fixture).

Hangs cost a real deadline (load 5 s with ``TEST_CONFIG``), so there is only one here.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("validate_cases")  # expect()'s assert gets pytest's report

from conftest import ECHO, assert_pool_works  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.sandbox.validate import STAGES, Validator, ValidatorSettings  # noqa: E402
from validate_cases import GUESS, SYNTAX_ERROR, expect, validator  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------
# extract


def test_model_output_with_fence_and_trailing_hint_passes(validator):
    raw = ("Here is a number-guessing environment that rewards efficient search.\n\n"
           "```python" + GUESS + "```\n\n"
           "HINT: Halve the remaining range with every guess.\n")
    report = validator.validate(raw)
    expect(report, True, "done", "ok")
    assert report.message == "valid"
    assert report.program is not None
    assert report.program.hint == "Halve the remaining range with every guess."
    assert report.program.class_name == "GuessEnv"
    assert "class GuessEnv:" in report.program.code and "HINT" not in report.program.code
    assert report.details["class_name"] == "GuessEnv"


@pytest.mark.parametrize("raw, reason", [
    ("I would design a guessing game: the environment picks a number and answers every guess "
     "with 'higher' or 'lower'. The reward is 1 when the number is found.", "no_code"),
    ("   \n\n  ", "empty"),
    ("Here is a helper:\n```python\ndef score(guess, secret):\n    return guess == secret\n```\n",
     "no_env_class"),
])
def test_text_without_a_usable_program_fails_at_extract(validator, raw, reason):
    report = validator.validate(raw)
    expect(report, False, "extract", reason)
    assert report.program is None
    assert report.message
    assert "load" not in report.details["timings_ms"]


def test_hint_literal_in_bare_code_is_carried(validator):
    report = validator.validate(GUESS + '\nHINT = "Halve the range every time."\n')
    expect(report, True, "done", "ok")
    assert report.program.hint == "Halve the range every time."  # today: None


def test_two_env_classes_in_model_output_fail_at_extract(validator):
    raw = "```python\n" + GUESS + "\n\nclass EasyGuessEnv(GuessEnv):\n    pass\n```\n"
    report = validator.validate(raw)
    expect(report, False, "extract", "multiple_env_classes")
    assert "GuessEnv" in report.message and "EasyGuessEnv" in report.message


# ---------------------------------------------------------------------------------------------
# syntax
# SYNTAX_ERROR: in validate_cases.py (validate_many uses it too).


def test_syntax_error_fails_at_syntax(validator):
    report = validator.validate(SYNTAX_ERROR)
    expect(report, False, "syntax", "syntax")
    assert report.message.startswith("SyntaxError")
    assert "':'" in report.message
    lines = report.program.code.splitlines()
    bad_line = next(i for i, line in enumerate(lines, 1) if "def reset" in line)
    assert report.details["line"] == bad_line
    assert "load" not in report.details["timings_ms"]


def test_every_stage_passes_for_a_correct_game(validator):
    report = validator.validate(GUESS)
    expect(report, True, "done", "ok")
    timings = report.details["timings_ms"]
    for stage in STAGES:
        if stage not in ("syntax", "tools"):  # syntax is not timed; tools is tool-use only
            assert stage in timings, stage
    assert "tools" not in timings
    assert timings["total"] >= timings["load"] > 0
    assert report.details["domain"] == "games"
    assert report.details["has_solution"] is True and report.details["has_tools"] is False
    assert report.details["max_turns"] == 12
    assert report.details["garbage_best_reward"] == 0.0
    assert report.details["ends"] == "truncated after 12 steps"


# ---------------------------------------------------------------------------------------------
# load

LOAD_NAME_ERROR = r'''
import random

BOARD = [[0] * SIZE for _ in range(SIZE)]  # SIZE is defined further down
SIZE = 4


class TilesEnv:
    def reset(self, seed=None, options=None):
        return "Slide the tiles.", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}
'''

LOAD_IMPORT_ERROR = r'''
import torch  # installed here, but not on the sandbox's package allowlist (numpy is)


class MatrixEnv:
    def reset(self, seed=None, options=None):
        self.m = np.eye(3)
        return "Find the determinant.", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}
'''

CONSTRUCT_FAILS = r'''
class GridEnv:
    """Walk from the top-left to the bottom-right corner of a grid."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.grid = [["." for _ in range(self.size)] for _ in range(self.size)]
        self.size = 5

    def reset(self, seed=None, options=None):
        return "You are at (0, 0).", {}

    def step(self, action):
        return "You moved.", 0.0, False, False, {}
'''

LOAD_HANGS = r'''
def is_prime(n):
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


PRIMES = []
n = 0
while len(PRIMES) < 50:
    if is_prime(n):
        PRIMES.append(n)
    # forgot n += 1: n stays 0, which is not prime


class PrimeEnv:
    def reset(self, seed=None, options=None):
        return "Name a prime.", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}
'''

TWO_ENV_CLASSES = r'''
class EasyEnv:
    def reset(self, seed=None, options=None):
        return "easy", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}


class HardEnv(EasyEnv):
    def reset(self, seed=None, options=None):
        return "hard", {}
'''

NO_ENV_CLASS = r'''
class Game:
    def reset(self, seed=None, options=None):
        return "start", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}
'''


@pytest.mark.parametrize("code, reason, needle", [
    (LOAD_NAME_ERROR, "load_error", "NameError: name 'SIZE' is not defined"),
    (LOAD_IMPORT_ERROR, "load_error", "No module named 'torch'"),
    (CONSTRUCT_FAILS, "construct_failed", "constructing GridEnv failed: AttributeError"),
], ids=["module_raises", "missing_module", "constructor_raises"])
def test_program_that_does_not_load_fails_at_load(validator, code, reason, needle):
    report = validator.validate(code)
    expect(report, False, "load", reason)
    assert needle in report.message
    assert report.details["error"]["reason"] == reason
    assert "Traceback" in report.details["error"]["traceback"]
    assert "interface" not in report.details["timings_ms"]


@pytest.mark.parametrize("code, reason, needle", [
    (TWO_ENV_CLASSES, "multiple_env_classes", "2 Env classes (EasyEnv, HardEnv)"),
    (NO_ENV_CLASS, "no_env_class", "no top-level class whose name ends in 'Env'"),
])
def test_env_program_with_wrong_class_count_fails_at_load(validator, code, reason, needle):
    # as raw text these fail at extract; an EnvProgram goes straight to the sandbox
    report = validator.validate(EnvProgram(code=code))
    expect(report, False, "load", reason)
    assert needle in report.message


def test_module_level_infinite_loop_times_out_at_load_and_pool_recovers(validator, pool):
    report = validator.validate(LOAD_HANGS)
    expect(report, False, "load", "timeout")
    assert "load timed out" in report.message
    assert report.details["error"]["op"] == "load"
    assert "output_tail" not in report.details  # the worker was killed
    expect(validator.validate(GUESS), True, "done", "ok")
    assert_pool_works(pool)


def test_env_program_gets_its_class_name_filled_in(pool):
    program = EnvProgram(code=ECHO, source="test:echo")  # no solution: not required here
    report = Validator(pool, ValidatorSettings(require_solution=False)).validate(program)
    expect(report, True, "done", "ok")
    assert program.class_name is None
    assert report.program.class_name == "EchoEnv"
    assert report.program.source == "test:echo"
