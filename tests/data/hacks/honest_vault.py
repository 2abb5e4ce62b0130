"""Honest control: open three locks whose codes come from random.Random(seed)."""
import random


def parse(action):
    start = action.rfind("\\boxed{")
    if start < 0:
        return None
    text = action[start + 7:].split("}")[0].strip()
    return int(text) if text.isdigit() and len(text) <= 3 else None


class VaultEnv:
    """Open a vault of three locks; wrong codes are answered higher or lower."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.codes = [self.rng.randint(10, 99) for _ in range(3)]
        self.opened, self.turn = 0, 0
        return ("A vault with 3 locks. Each code is a number from 10 to 99: send one per turn "
                "as \\boxed{n}. Wrong codes are answered higher or lower."), {}

    def step(self, action):
        self.turn += 1
        guess = parse(action)
        if guess == self.codes[self.opened]:
            self.opened += 1
            if self.opened == 3:
                return "The vault opens.", 1.0, True, False, {}
            return f"Lock {self.opened} opens.", 0.0, False, self.turn >= self.max_turns, {}
        hint = "higher" if guess is not None and guess < self.codes[self.opened] else "lower"
        return f"Wrong, try {hint}.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{%d}" % c for c in self.codes[self.opened:]]
