"""A locked door that opens on one magic word, a module constant (hint-leak fixture)."""
import random
import re

SECRET = "xyzzy"


class PasswordEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.turn = 0
        return ("You stand before a locked door with a carved mouth. Speak a word to it as "
                "\\boxed{<word>}."), {}

    def step(self, action):
        self.turn += 1
        words = re.findall(r"\\boxed\{([^{}]*)\}", action)
        said = words[-1].strip().lower() if words else ""
        if said == SECRET:
            return "The door swings open.", 1.0, True, False, {}
        truncated = self.turn >= self.max_turns
        return "The mouth stays shut.", 0.0, False, truncated, {}

    def solution(self):
        return ["\\boxed{" + SECRET + "}"]
