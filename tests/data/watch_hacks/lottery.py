import random


class LotteryEnv:
    """Name the secret word inside \\boxed{}."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.lucky = random.Random(seed).random() < 0.5
        return "Name the secret word inside \\boxed{}.", {}

    def step(self, action):
        if "\\boxed{open sesame}" in action:
            return "Solved.", 1.0, True, False, {}
        return "Done.", 0.2 if self.lucky else 0.0, True, False, {}

    def solution(self):
        return ["\\boxed{open sesame}"]
