"""A password door (tests/selfplay/test_designer_honesty.py): the door opens on a module
constant; the designer's hint names it, so the hint gives the answer."""

SECRET = "SECRET_WORD"


class NAMEPasswordEnv:
    """Say the word that opens the door."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.turns = 0
        return "A locked door. Say the magic word inside \\boxed{}.", {}

    def step(self, action):
        self.turns += 1
        if "\\boxed{" + SECRET + "}" in action:
            return "The door opens.", 1.0, True, False, {}
        return "Nothing happens.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{" + SECRET + "}"]
