"""One module-level random.Random shared by every instance (seeded in reset): deterministic
when episodes run one after another, not when they are interleaved in one worker."""
import random

RNG = random.Random(0)


class DiceEnv:
    """Say the sum of the two dice shown; each wrong answer rerolls them."""

    def __init__(self, max_turns=8):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        RNG.seed(seed)
        self.dice = (RNG.randint(1, 6), RNG.randint(1, 6))
        self.turn = 0
        return f"Dice: {self.dice}. Say their sum as \\boxed{{n}}.", {}

    def step(self, action):
        self.turn += 1
        if action.strip() == "\\boxed{%d}" % sum(self.dice):
            return "Right.", 1.0, True, False, {}
        self.dice = (RNG.randint(1, 6), RNG.randint(1, 6))
        return f"Wrong. New dice: {self.dice}.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{%d}" % sum(self.dice)]
