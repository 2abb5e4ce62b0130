"""Modular search: find a hidden integer by asking for its remainders modulo small numbers.

Each turn the agent either asks ``mod k`` (2 <= k <= 12) and learns N mod k, or commits with
``guess x``. Remainders modulo pairwise-coprime numbers pin N down (Chinese remainder theorem)
once their product exceeds the range. A wrong guess scores partial credit for agreeing with the
remainders revealed so far.
"""

import random
import re

SKILL = "Mathematical_Reasoning"
SETTING = "games"
HINT = (
    "Ask for remainders modulo pairwise-coprime numbers whose product exceeds the range, then "
    "combine them with the Chinese remainder theorem before guessing."
)
TAGS = ["number-theory", "chinese-remainder-theorem", "active-querying"]

MIN_MOD, MAX_MOD = 2, 12
COPRIME_PLAN = [11, 9, 8, 7, 5]  # product 27720 covers every range this game draws


def extract_boxed(text):
    """Return the content of the last balanced \\boxed{...} in text, or None."""
    start = text.rfind("\\boxed{") if isinstance(text, str) else -1
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1].strip() if depth == 0 else None


class ModularSearchEnv:
    """Hidden-integer search with remainder queries."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done = 0, True
        self.upper, self.secret, self.revealed = 1, 0, {}

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.upper = self.rng.randint(1000, 27720)
        self.secret = self.rng.randrange(self.upper)
        self.revealed = {}
        self.turn, self.done = 0, False
        obs = (
            f"A hidden integer N satisfies 0 <= N < {self.upper}. Each turn, reply with one "
            f"command inside \\boxed{{}}: 'mod k' ({MIN_MOD} <= k <= {MAX_MOD}) reveals N mod k; "
            f"'guess x' ends the game. You have {self.max_turns} turns. Example: \\boxed{{mod 7}}"
        )
        return obs, {"upper": self.upper}

    def _score_guess(self, value):
        if value == self.secret:
            return 1.0
        if not self.revealed:
            return 0.0
        agree = sum(value % k == r for k, r in self.revealed.items())
        return 0.5 * agree / len(self.revealed)

    def _play(self, command):
        parts = command.lower().split()
        valid = len(parts) == 2 and parts[0] in ("mod", "guess")
        if not valid or not re.fullmatch(r"-?[0-9]{1,9}", parts[1]):
            return f"Unknown command {command[:40]!r}. Use 'mod k' or 'guess x'.", 0.0, False
        verb, value = parts[0], int(parts[1])
        if verb == "mod":
            if not MIN_MOD <= value <= MAX_MOD:
                return f"k must be between {MIN_MOD} and {MAX_MOD}.", 0.0, False
            self.revealed[value] = self.secret % value
            return f"N mod {value} = {self.revealed[value]}.", 0.0, False
        if not 0 <= value < self.upper:
            return f"A guess must lie in [0, {self.upper}).", 0.0, False
        reward = self._score_guess(value)
        verdict = "Correct!" if reward == 1.0 else f"Wrong: N was {self.secret}."
        return f"{verdict} Score {reward:.2f}.", reward, True

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn += 1
        command = extract_boxed(action)
        if command is None:
            obs, reward, terminated = "No command found: wrap it as \\boxed{mod 7}.", 0.0, False
        else:
            obs, reward, terminated = self._play(command)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Turn limit reached."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        actions, product = [], 1
        for k in COPRIME_PLAN:
            if product >= self.upper:
                break
            actions.append("\\boxed{mod %d}" % k)
            product *= k
        return actions + ["\\boxed{guess %d}" % self.secret]
