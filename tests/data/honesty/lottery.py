"""A lottery (tests/selfplay/test_designer_honesty.py): pays 0.2 on half the seeds whatever the
agent says, and has no solution(). Its expected plateau under the old "share of returns > 0"
input was the band's middle."""


class NAMELotteryEnv:
    """Say anything; fortune decides."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.lucky = (seed or 0) % 2 == 0
        return "Make a wish inside \\boxed{}.", {}

    def step(self, action):
        return "The wheel stops.", 0.2 if self.lucky else 0.0, True, False, {}
