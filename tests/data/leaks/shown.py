"""Pick the right colour from the ones shown; the answer is always the same one (hint-leak
fixture: the answer is in the observation, so only playing the hint's words catches the leak)."""
import random
import re


class ColourEnv:
    COLOURS = ("red", "green", "blue", "violet", "amber")

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.shown = list(self.COLOURS)
        self.rng.shuffle(self.shown)
        return ("One of these colours opens the chest: " + ", ".join(self.shown)
                + ". Name it as \\boxed{<colour>}; you get one try."), {}

    def step(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        said = found[-1].strip().lower() if found else ""
        if said == "green":
            return "The chest opens.", 1.0, True, False, {}
        return "The chest stays shut.", 0.0, True, False, {}

    def solution(self):
        return ["\\boxed{green}"]
