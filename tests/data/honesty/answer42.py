"""A constant answer (tests/selfplay/test_designer_honesty.py): every episode is won by the same
short number, and the designer's hint says it ("Always answer 42.")."""


class NAMEAnswerEnv:
    """Find the number the oracle wants."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turns = 0
        return "The oracle waits for a number inside \\boxed{}.", {}

    def step(self, action):
        self.turns += 1
        if action.rsplit("\\boxed{", 1)[-1].split("}", 1)[0].strip() == "ANSWER":
            return "The oracle nods.", 1.0, True, False, {}
        return "The oracle frowns.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{ANSWER}"]
