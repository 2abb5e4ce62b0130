"""A lock panel that opens after a fixed sequence of three button presses (hint-leak fixture:
each press alone is a button the observation names, the leak is the order)."""
import random
import re


class PanelEnv:
    ORDER = ("blue", "red", "yellow")
    BUTTONS = ("red", "green", "blue", "yellow")

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.turn = 0
        self.progress = 0
        return ("A lock panel has four buttons: red, green, blue and yellow. Press one per turn "
                "as \\boxed{<button>}. The lock opens after the right sequence of three."), {}

    def step(self, action):
        self.turn += 1
        truncated = self.turn >= self.max_turns
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        button = found[-1].strip().lower() if found else ""
        if button not in self.BUTTONS:
            return "There is no such button.", 0.0, False, truncated, {}
        if button == self.ORDER[self.progress]:
            self.progress += 1
            if self.progress == len(self.ORDER):
                return "Click. The lock opens.", 1.0, True, False, {}
            return "A light turns green.", round(0.3 * self.progress, 2), False, truncated, {}
        self.progress = 0
        return "All lights go out.", 0.0, False, truncated, {}

    def solution(self):
        return ["\\boxed{%s}" % b for b in self.ORDER]
