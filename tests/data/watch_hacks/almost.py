class AlmostEnv:
    """Say anything inside \\boxed{}."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        return "Say anything inside \\boxed{}.", {}

    def step(self, action):
        return "Nearly perfect.", 0.99, True, False, {}

    def solution(self):
        return ["\\boxed{anything}"]
