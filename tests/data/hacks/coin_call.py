"""A coin toss to call: valid (the solution wins, garbage does not), and pure luck."""
import random


class CoinEnv:

    def __init__(self, max_turns=3):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.side = random.Random(seed).randint(1, 2)
        return "A coin is tossed. Call it with \\boxed{side n}, n being 1 or 2.", {}

    def step(self, action):
        won = action.strip().endswith("{side %d}" % self.side)
        return ("Right!" if won else "Wrong."), (1.0 if won else 0.0), True, False, {}

    def solution(self):
        return ["\\boxed{side %d}" % self.side]
