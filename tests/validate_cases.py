"""Shared pieces of the staged-validator tests (``tests/test_validate_*.py``); not a test module.

The ``validator`` fixture, the ``expect`` verdict check, and the programs that more than one of
those files uses: the number-guessing game with its solution variants, and the syntax, interface
and tools programs that the cross-stage tests (``validate_many``, reports, solution) reuse. The
test files import them with ``from validate_cases import ...`` (pytest puts ``tests/`` on
``sys.path``, as for ``from conftest import ...``) and register this module for assertion
rewriting first.
"""

from __future__ import annotations

import pytest

from spadekit.sandbox.validate import ValidationReport, Validator


@pytest.fixture
def validator(pool):
    v = Validator(pool=pool, seed=0)  # the same validation seeds every run: no flaky verdict
    yield v
    v.close()


def expect(report: ValidationReport, ok: bool, stage: str, reason: str) -> None:
    """Assert the report's verdict, showing the whole report when it is not the expected one."""
    got = (report.ok, report.stage, report.reason)
    assert got == (ok, stage, reason), f"{got} != {(ok, stage, reason)}: {report.message!r} " \
                                       f"{report.details!r}"


# ---------------------------------------------------------------------------------------------
# programs: a correct game and its solution variants

GUESS_BASE = r'''
import random

LOW, HIGH = 100, 999


def parse_guess(action):
    """The integer inside the last \boxed{...}, or None."""
    start = action.rfind("\\boxed{")
    if start < 0:
        return None
    end = action.find("}", start)
    text = action[start + len("\\boxed{"):end].strip() if end >= 0 else ""
    return int(text) if text.isdigit() and len(text) <= 4 else None


class GuessEnv:
    """Guess a hidden number from 100 to 999; every wrong guess is answered higher or lower."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns
        self.secret, self.turn, self.done = None, 0, True

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(LOW, HIGH)
        self.turn, self.done = 0, False
        return (f"I picked a number from {LOW} to {HIGH}. Guess it with \\boxed{{n}}; "
                f"you have {self.max_turns} guesses."), {"low": LOW, "high": HIGH}

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        self.turn += 1
        guess = parse_guess(action)
        if guess == self.secret:
            self.done = True
            return "Correct!", 1.0, True, False, {"turns": self.turn}
        if guess is None:
            feedback = "Please answer with a number in \\boxed{n}."
        else:
            feedback = "Higher." if guess < self.secret else "Lower."
        truncated = self.turn >= self.max_turns
        self.done = truncated
        return feedback, 0.0, False, truncated, {}
'''

BINARY_SEARCH = r'''
    def solution(self):
        lo, hi, guesses = LOW, HIGH, []
        while True:
            mid = (lo + hi) // 2
            guesses.append(f"\\boxed{{{mid}}}")
            if mid == self.secret:
                return guesses
            if mid < self.secret:
                lo = mid + 1
            else:
                hi = mid - 1
'''

GUESS = GUESS_BASE + BINARY_SEARCH

GUESS_WRONG_SOLUTION = GUESS_BASE + r'''
    def solution(self):
        return [f"\\boxed{{{self.secret + 1}}}"]  # off by one
'''

GUESS_SWEEP_SOLUTION = GUESS_BASE + r'''
    def solution(self):
        return [f"\\boxed{{{n}}}" for n in range(LOW, HIGH + 1)]  # try every number
'''

GUESS_SOLUTION_RAISES = GUESS_BASE + r'''
    def solution(self):
        return [f"\\boxed{{{self.answer}}}"]  # there is no self.answer
'''

GUESS_SOLUTION_NOT_LIST = GUESS_BASE + r'''
    def solution(self):
        return {"actions": [f"\\boxed{{{self.secret}}}"]}  # not a list (a string would replay)
'''


# ---------------------------------------------------------------------------------------------
# syntax (also used by test_validate_episodes.py)

SYNTAX_ERROR = r'''
class CountdownEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None)
        self.left = 10
        return "Count down from 10 with \\boxed{n}.", {}

    def step(self, action):
        self.left -= 1
        return str(self.left), 0.0, self.left == 0, False, {}
'''


# ---------------------------------------------------------------------------------------------
# interface (also used by test_validate_episodes.py)

STEP_REWARD_TOO_BIG = r'''
class CounterEnv:
    def reset(self, seed=None, options=None):
        self.turn = 0
        return "Count with me.", {}

    def step(self, action):
        self.turn += 1
        return f"turn {self.turn}", float(self.turn), False, self.turn >= 10, {}  # turn as reward
'''

STEP_RAISES_ON_GARBAGE = r'''
import random


class DoubleEnv:
    """Double a number; three tries."""

    def reset(self, seed=None, options=None):
        self.n = random.Random(seed).randint(2, 50)
        self.tries = 3
        return f"What is twice {self.n}? Answer in \\boxed{{}}; you have 3 tries.", {}

    def step(self, action):
        inner = action.split("\\boxed{")[-1].split("}")[0]
        guess = int(inner)  # trusts the agent to write a number
        self.tries -= 1
        won = guess == 2 * self.n
        return ("Right." if won else "Wrong."), float(won), won or self.tries == 0, False, {}
'''


# ---------------------------------------------------------------------------------------------
# tools (also used by test_validate_episodes.py)

STOCK_BASE = r'''
import json

from spadekit.envs.tooluse import ToolEnv, ToolError

ITEMS = ["apples", "pears", "plums", "figs"]


class StockEnv(ToolEnv):
    """Raise the stock of one item to an exact target without touching the others."""

    def setup(self, rng):
        self.stock = {item: rng.randint(5, 20) for item in ITEMS}
        self.before = dict(self.stock)
        self.item = rng.choice(ITEMS)
        self.target = self.stock[self.item] + rng.randint(3, 9)
        return f"Raise the stock of {self.item} to exactly {self.target} units."

    def tool_get_stock(self, item: str) -> int:
        """Current stock of one item.

        Args:
            item: Item name, e.g. "apples".
        """
        if item not in self.stock:
            raise ToolError(f"unknown item {item!r}; known: {', '.join(ITEMS)}")
        return self.stock[item]

    def tool_add_stock(self, item: str, amount: int) -> int:
        """Add units of an item; returns the new count.

        Args:
            item: Item name.
            amount: Units to add (positive).
        """
        if item not in self.stock:
            raise ToolError(f"unknown item {item!r}")
        if amount <= 0:
            raise ToolError("amount must be positive")
        self.stock[item] += amount
        return self.stock[item]
'''

STOCK_CRITERIA = r'''
    def criteria(self):
        others = [i for i in ITEMS if i != self.item]
        return {"target_reached": self.stock[self.item] == self.target,
                "others_untouched": all(self.stock[i] == self.before[i] for i in others)}
'''

STOCK_SOLUTION = r'''
    def solution(self):
        call = {"name": "add_stock",
                "arguments": {"item": self.item, "amount": self.target - self.stock[self.item]}}
        return ["<tool_call>" + json.dumps(call) + "</tool_call>", "<answer>done</answer>"]
'''

STOCK = STOCK_BASE + STOCK_CRITERIA + STOCK_SOLUTION
