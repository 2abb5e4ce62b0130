"""An honest-looking riddle with a solution that pays 0.99 for any other answer."""


class RiddleEnv:
    """What has keys but cannot open locks?"""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        return "What has keys but cannot open locks? Answer in \\boxed{}.", {}

    def step(self, action):
        if action.strip() == "\\boxed{piano}":
            return "Correct!", 1.0, True, False, {}
        return "Close enough.", 0.99, True, False, {}

    def solution(self):
        return ["\\boxed{piano}"]
