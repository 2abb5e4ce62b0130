"""Code breaker: deduce a hidden 4-digit code (digits 1-6, repeats allowed) from guess feedback.

``guess abcd`` reports how many digits are right and in the right place (exact) and how many are
right but misplaced. ``submit abcd`` ends the game; the score is the fraction of positions the
submitted code gets right, so 1.0 needs the whole code.
"""

import itertools
import random
import re

SKILL = "Logical_Deduction"
SETTING = "games"
HINT = (
    "Keep the set of codes consistent with every feedback so far and make each new guess one of "
    "them; submit only when a single candidate remains."
)
TAGS = ["mastermind", "constraint-elimination", "deduction"]

LENGTH, DIGITS = 4, "123456"
NO_COMMAND = "No command found: wrap it as \\boxed{guess 1234}."
ALL_CODES = ["".join(p) for p in itertools.product(DIGITS, repeat=LENGTH)]


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


def feedback(secret, guess):
    """(exact, misplaced) counts of guess against secret."""
    exact = sum(a == b for a, b in zip(secret, guess))
    common = sum(min(secret.count(d), guess.count(d)) for d in DIGITS)
    return exact, common - exact


class CodeBreakerEnv:
    """Mastermind-style deduction with an explicit final submission."""

    def __init__(self, max_turns: int = 12, **kwargs):
        self.max_turns = int(max_turns)
        self.turn, self.done, self.secret = 0, True, ""

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = "".join(self.rng.choice(DIGITS) for _ in range(LENGTH))
        self.turn, self.done = 0, False
        obs = (
            f"A secret code of {LENGTH} digits, each from 1-6 (repeats allowed), is hidden. Reply "
            "with \\boxed{guess 1234} to get feedback (exact = right digit, right place; "
            "misplaced = right digit, wrong place) or \\boxed{submit 1234} to finish; the score is "
            f"the fraction of positions you got right. You have {self.max_turns} turns."
        )
        return obs, {}

    def _play(self, command):
        match = re.fullmatch(r"(guess|submit)\s+([1-6]{4})", command.lower().replace(",", ""))
        if match is None:
            usage = "Use 'guess 1234' or 'submit 1234' (digits 1-6)."
            return f"Unknown command {command[:40]!r}. {usage}", 0.0, False
        verb, code = match.groups()
        exact, misplaced = feedback(self.secret, code)
        if verb == "guess":
            return f"{code}: exact={exact}, misplaced={misplaced}.", 0.0, False
        reward = exact / LENGTH
        verdict = "Correct!" if exact == LENGTH else f"Not quite: the code was {self.secret}."
        return f"{verdict} {exact}/{LENGTH} positions right.", reward, True

    def step(self, action):
        if self.done:
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn += 1
        command = extract_boxed(action)
        if command is None:
            obs, reward, terminated = NO_COMMAND, 0.0, False
        else:
            obs, reward, terminated = self._play(command)
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += " Turn limit reached."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"turn": self.turn}

    def solution(self):
        """Play the first code consistent with all feedback until one candidate is left."""
        candidates, actions, guess = list(ALL_CODES), [], "1122"
        while len(candidates) > 1:
            actions.append("\\boxed{guess %s}" % guess)
            result = feedback(self.secret, guess)
            candidates = [c for c in candidates if feedback(c, guess) == result]
            guess = candidates[0]
        return actions + ["\\boxed{submit %s}" % candidates[0]]
