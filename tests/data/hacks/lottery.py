"""Pays 0.2 on half the seeds whatever the action, and has no solution: plateau bait."""


class LotteryEnv:
    """Pick a lucky number."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.lucky = (seed or 0) % 2 == 0
        return "Pick a lucky number from 1 to 9 as \\boxed{n}.", {}

    def step(self, action):
        return "The draw is over.", 0.2 if self.lucky else 0.0, True, False, {}
