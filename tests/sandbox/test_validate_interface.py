"""Staged-validator tests (``spadekit.sandbox.validate``, real sandboxes): interface, tools.

Every stage gets at least one program that gets through it and one that fails it with its stable
``reason`` code (the other stages: ``test_validate_load.py``, ``test_validate_episodes.py``;
shared programs and helpers: ``validate_cases.py``). The programs are small but written the way
a model would write them, bugs included. Each test runs once per isolation tier that boots here
(the ``pool`` fixture).

Hangs cost a real deadline (step 2 s with ``TEST_CONFIG``), so there is only one here.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("validate_cases")  # expect()'s assert gets pytest's report

from conftest import ECHO, assert_pool_works  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.sandbox.validate import Validator, ValidatorSettings  # noqa: E402
from validate_cases import (  # noqa: E402,F401
    GUESS,
    STEP_RAISES_ON_GARBAGE,
    STEP_REWARD_TOO_BIG,
    STOCK,
    STOCK_BASE,
    STOCK_SOLUTION,
    expect,
    validator,
)


# ---------------------------------------------------------------------------------------------
# interface

RESET_RETURNS_LIST = r'''
import random


class BoardEnv:
    def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        self.board = [rng.randint(0, 9) for _ in range(9)]
        return self.board, {}

    def step(self, action):
        return "ok", 0.0, False, False, {}
'''

RESET_WITHOUT_INFO = r'''
class PlainEnv:
    def reset(self, seed=None, options=None):
        return "Type a word."

    def step(self, action):
        return "ok", 0.0, False, False, {}
'''

RESET_EMPTY = r'''
class LogEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.lines = []

    def reset(self, seed=None, options=None):
        self.turn = 0
        return "\n".join(self.lines), {}  # nothing has been logged yet

    def step(self, action):
        self.turn += 1
        self.lines.append(action)
        return "logged", 0.0, False, self.turn >= self.max_turns, {}
'''

STEP_OLD_GYM_API = r'''
class OldGymEnv:
    def reset(self, seed=None, options=None):
        self.turn = 0
        return "Say something.", {}

    def step(self, action):
        self.turn += 1
        return "heard: " + action, 0.0, self.turn >= 5, {}  # gym < 0.26 style
'''

STEP_NAN_REWARD = r'''
import math
import random


class SumEnv:
    """Add up five numbers shown one at a time; three tries at the total."""

    def reset(self, seed=None, options=None):
        self.numbers = random.Random(seed).sample(range(1, 50), 5)
        self.turn, self.tries = 0, 3
        self.score = math.nan  # 'no score yet'
        return f"First number: {self.numbers[0]}. Reply 'next' for more, \\boxed{{sum}} to answer.", {}

    def step(self, action):
        self.turn += 1
        if "\\boxed{" in action:
            self.tries -= 1
            if action.split("\\boxed{")[-1].rstrip("}").strip() == str(sum(self.numbers)):
                self.score = 1.0
            elif self.tries == 0:
                self.score = 0.0
            return "Checked.", self.score, self.tries == 0 or self.score == 1.0, False, {}
        shown = self.numbers[min(self.turn, 4)]
        return f"Next number: {shown}", self.score, False, False, {}
'''

# STEP_REWARD_TOO_BIG and STEP_RAISES_ON_GARBAGE: in validate_cases.py (validate_many and the
# report tests use them too).

DOUBLE_ONE_TRY = r'''
class DoubleOnceEnv:
    """Double 21 in one try."""

    def reset(self, seed=None, options=None):
        return "What is twice 21? Answer in \\boxed{}.", {}

    def step(self, action):
        guess = int(action.split("\\boxed{")[-1].split("}")[0])  # raises on non-numbers
        return ("Right." if guess == 42 else "Wrong."), float(guess == 42), True, False, {}
'''


STEP_HANGS_ON_GARBAGE = r'''
import random


class DigitsEnv:
    def reset(self, seed=None, options=None):
        self.target = random.Random(seed).randint(100, 999)
        self.turn = 0
        return "Guess the three-digit number in \\boxed{n}.", {}

    def step(self, action):
        self.turn += 1
        text = action.split("\\boxed{")[-1].split("}")[0]
        value, i = 0, 0
        while i < len(text):
            ch = text[i]
            if not ch.isdigit():
                continue  # never advances past a non-digit
            value = value * 10 + int(ch)
            i += 1
        won = value == self.target
        return ("yes" if won else "no"), float(won), won, self.turn >= 12, {}
'''


@pytest.mark.parametrize("code, reason, needle", [
    (RESET_RETURNS_LIST, "bad_reset_type", "observation must be str, got list"),
    (RESET_WITHOUT_INFO, "bad_reset_type", "reset() must return (observation: str, info: dict)"),
    (RESET_EMPTY, "empty_observation", "reset(seed={first}) returned an empty observation"),
    (STEP_OLD_GYM_API, "bad_step_type", "must return a 5-tuple"),
    (STEP_NAN_REWARD, "reward_not_finite", "reward must be finite, got nan"),
    (STEP_REWARD_TOO_BIG, "reward_out_of_range", "reward must be in [0, 1], got 2.0"),
    (STEP_RAISES_ON_GARBAGE, "env_raised", "ValueError: invalid literal for int()"),
], ids=["reset_list", "reset_no_info", "reset_empty", "step_4_tuple", "reward_nan",
        "reward_2", "step_raises"])
def test_contract_violations_fail_at_interface(validator, code, reason, needle):
    report = validator.validate(code)
    expect(report, False, "interface", reason)
    assert needle.format(first=report.details["seeds"]["interface"][0]) in report.message
    assert "determinism" not in report.details["timings_ms"]
    if reason == "env_raised":
        assert report.details["error"]["exc_type"] == "ValueError"
        assert 'File "env.py"' in report.details["error"]["traceback"]
        assert report.details["error"]["op"] == "step"


QUIZ_NAN_ON_PLAIN_TEXT = r'''
import math


class QuizEnv:
    """One question, answered in a box."""

    def reset(self, seed=None, options=None):
        return "What is 6 * 7? Answer in \\boxed{}.", {}

    def step(self, action):
        if "\\boxed{" in action:
            right = action.split("\\boxed{")[-1].rstrip("}").strip() == "42"
            return ("Right." if right else "Wrong."), float(right), True, False, {}
        return "Please answer in \\boxed{}.", math.nan, False, False, {}
'''


@pytest.mark.parametrize("code, reason", [
    (DOUBLE_ONE_TRY, "env_raised"),  # today: not_trivially_won / env_raised
    (QUIZ_NAN_ON_PLAIN_TEXT, "reward_not_finite"),  # today: ok (!)
], ids=["raises_after_early_end", "nan_after_early_end"])
def test_garbage_is_probed_even_when_the_first_probe_ends_the_episode(validator, code, reason):
    expect(validator.validate(code), False, "interface", reason)


def test_step_that_hangs_on_garbage_times_out_and_pool_recovers(validator, pool):
    report = validator.validate(STEP_HANGS_ON_GARBAGE)
    expect(report, False, "interface", "timeout")
    assert "step timed out after 2s" in report.message
    assert report.details["error"]["op"] == "step"
    assert report.details["class_name"] == "DigitsEnv"
    good = validator.validate(GUESS)
    expect(good, True, "done", "ok")
    assert good.details["solution"] == "replayed"
    assert_pool_works(pool)


def test_total_budget_is_enforced(pool):
    v = Validator(pool=pool, settings=ValidatorSettings(total_timeout=1e-6))
    report = v.validate(GUESS)
    expect(report, False, "interface", "timeout")
    assert "total budget" in report.message


# ---------------------------------------------------------------------------------------------
# tools (tool-use programs only)
# STOCK_BASE, STOCK_CRITERIA, STOCK_SOLUTION and STOCK: in validate_cases.py (the solution and
# validate_many tests use them too).

STOCK_TRIVIAL_CRITERIA = STOCK_BASE + r'''
    def criteria(self):
        # compares with the starting stock instead of the target: true before any call
        return {"target_reached": self.stock[self.item] >= self.before[self.item],
                "others_untouched": True}
''' + STOCK_SOLUTION

STOCK_NO_TOOLS = r'''
from spadekit.envs.tooluse import ToolEnv


class LedgerEnv(ToolEnv):
    def setup(self, rng):
        self.balance = rng.randint(10, 99)
        self.paid = False
        return f"Pay the outstanding balance of {self.balance} dollars."

    def pay(self, amount: int) -> str:  # forgot the tool_ prefix
        """Pay an amount."""
        self.paid = amount == self.balance
        return "paid"

    def criteria(self):
        return {"paid": self.paid}

    def solution(self):
        return ['<tool_call>{"name": "pay", "arguments": {"amount": %d}}</tool_call>'
                % self.balance, "<answer>done</answer>"]
'''

WEATHER = r'''
import json
import random

CITIES = {"Oslo": 4, "Lima": 19, "Cairo": 27, "Perth": 22}
TOOLS = [{"type": "function", "function": {
    "name": "get_temperature", "description": "Current temperature of a city in Celsius.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


class WeatherEnv:
    """Look up a temperature with a tool and report it."""

    def __init__(self, max_turns=6):
        self.max_turns = max_turns

    def tools(self):
        return TOOLS

    def reset(self, seed=None, options=None):
        self.city = random.Random(seed).choice(sorted(CITIES))
        self.turn = 0
        return (f"What is the temperature in {self.city}? Call get_temperature, then reply "
                "<answer>N</answer>."), {"tools": TOOLS}

    def step(self, action):
        self.turn += 1
        if "<answer>" in action:
            answer = action.split("<answer>", 1)[1].split("</answer>", 1)[0].strip()
            right = answer == str(CITIES[self.city])
            return ("Correct." if right else "Wrong."), float(right), True, False, {}
        obs = "No tool call found."
        if "<tool_call>" in action:
            body = action.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
            try:
                call = json.loads(body)
                obs = json.dumps({"temperature": CITIES[call["arguments"]["city"]]})
            except (ValueError, KeyError, TypeError):
                obs = json.dumps({"error": "bad tool call"})
        return obs, 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        call = {"name": "get_temperature", "arguments": {"city": self.city}}
        return ["<tool_call>" + json.dumps(call) + "</tool_call>",
                f"<answer>{CITIES[self.city]}</answer>"]
'''

GOOD_TOOLS_LINE = 'TOOLS = [{"type": "function", "function": {'
WEATHER_BARE_SCHEMA = WEATHER.replace(GOOD_TOOLS_LINE, 'TOOLS = [{"function": {')
WEATHER_ARRAY_PARAMS = WEATHER.replace('"parameters": {"type": "object"',
                                       '"parameters": {"type": "array"')
WEATHER_TOOLS_NOT_LIST = WEATHER.replace("        return TOOLS\n", "        return TOOLS[0]\n")


def test_tool_env_passes_every_stage(validator):
    report = validator.validate(STOCK)
    expect(report, True, "done", "ok")
    assert report.details["domain"] == "tooluse"
    assert report.details["has_tools"] is True
    assert report.details["tools"] == ["add_stock", "get_stock"]
    assert "tools" in report.details["timings_ms"]
    assert report.details["solution"] == "replayed"
    assert report.details["solution_turns"] == [2] * 6  # 3 fixed seeds, 3 drawn
    assert report.details["seeds"]["tools"][:3] == [0, 1, 2]  # and one drawn
    assert len(report.details["seeds"]["tools"]) == 4
    # garbage is drawn broadly (typed calls of the listed tools too) and may now win by luck;
    # what admission judges is its mean return against the solution's
    assert report.details["garbage_mean_return"] <= \
        report.details["solution_mean_return"] - report.details["action_margin"]
    ends = report.details["ends"]
    assert ends == "truncated after 12 steps" or ends.startswith("terminated after "), ends


def test_hand_written_tool_env_is_tooluse_and_passes(validator):
    report = validator.validate(WEATHER)
    expect(report, True, "done", "ok")
    assert report.details["domain"] == "tooluse"
    assert report.details["tools"] == ["get_temperature"]
    assert report.details["solution_turns"] == [2] * 6  # 3 fixed seeds, 3 drawn


def test_criteria_already_met_at_reset_fail_at_tools(validator):
    report = validator.validate(STOCK_TRIVIAL_CRITERIA)
    expect(report, False, "tools", "criteria_trivial")
    assert "answering at once after reset(seed=0) already scores 1.0" in report.message
    assert "solution" not in report.details


@pytest.mark.parametrize("code, needle", [
    (STOCK_NO_TOOLS, "no tools"),
    (WEATHER_BARE_SCHEMA, "schema 0 is not {'type': 'function', 'function': {...}}"),
    (WEATHER_ARRAY_PARAMS, "tool 'get_temperature': parameters must be a JSON schema of type "
                           "object"),
    (WEATHER_TOOLS_NOT_LIST, "tools() must return a list of schema dicts"),
], ids=["no_tool_methods", "missing_wrapper", "array_parameters", "not_a_list"])
def test_bad_tool_schemas_fail_at_tools(validator, code, needle):
    report = validator.validate(code)
    expect(report, False, "tools", "bad_tools")
    assert needle in report.message
    assert report.details["domain"] == "tooluse"


def test_domain_on_the_program_overrides_detection(validator):
    as_games = validator.validate(EnvProgram(code=WEATHER, domain="games"))
    expect(as_games, True, "done", "ok")
    assert as_games.details["domain"] == "games"
    assert "tools" not in as_games.details
    as_tools = validator.validate(EnvProgram(code=ECHO, domain="tooluse"))
    expect(as_tools, False, "tools", "env_raised")  # EchoEnv has no tools() to call
    assert "no method 'tools'" in as_tools.message
