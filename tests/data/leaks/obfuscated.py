"""A vault keypad that takes a code word with a verb; the code is a class attribute
(hint-leak fixture: the leaking hint spells the code with separators)."""
import random
import re


class VaultEnv:
    CODE = "xyzzy"

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.turn = 0
        self.tries = 0
        return ("A vault keypad glows. Type a code word with \\boxed{enter <code>}, or "
                "\\boxed{inspect} to look at the worn keys."), {}

    def step(self, action):
        self.turn += 1
        truncated = self.turn >= self.max_turns
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        command = found[-1].strip().lower().split() if found else []
        if command[:1] == ["inspect"]:
            return "Some keys are more worn than others.", 0.0, False, truncated, {}
        if len(command) == 2 and command[0] == "enter":
            if command[1] == self.CODE:
                return "The vault opens.", 1.0, True, False, {}
            self.tries += 1
            return "Wrong code.", 0.0, self.tries >= 5, truncated, {}
        return "Unknown command.", 0.0, False, truncated, {}

    def solution(self):
        return ["\\boxed{enter " + self.CODE + "}"]
