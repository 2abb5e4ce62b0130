"""Guess the number with higher/lower feedback; the number is a class constant (hint-leak fixture)."""
import random
import re


class Answer42Env:
    ANSWER = 42
    LOW, HIGH = 1, 100

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.turn = 0
        return ("I am thinking of a whole number from %d to %d. Guess it as \\boxed{<number>}; "
                "I will say higher or lower." % (self.LOW, self.HIGH)), {}

    def step(self, action):
        self.turn += 1
        found = re.findall(r"\\boxed\{\s*(-?\d+)\s*\}", action)
        truncated = self.turn >= self.max_turns
        if not found:
            return "Give a number in \\boxed{}.", 0.0, False, truncated, {}
        guess = int(found[-1])
        if guess == self.ANSWER:
            return "Correct!", 1.0, True, False, {}
        closeness = max(0.0, 1.0 - abs(guess - self.ANSWER) / 100.0) * 0.5
        word = "higher" if guess < self.ANSWER else "lower"
        return f"No, go {word}.", round(closeness, 3), False, truncated, {}

    def solution(self):
        return ["\\boxed{%d}" % self.ANSWER]
