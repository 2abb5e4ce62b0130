"""Three doors, the prize behind a different one per seed; knocking tells (honest control: the
hint may say how many doors there are)."""
import random
import re


class DoorsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.prize = (seed or 0) % 3 + 1
        self.turn = 0
        return ("You face a row of doors. \\boxed{knock <n>} listens at door n, "
                "\\boxed{open <n>} opens it (once)."), {}

    def step(self, action):
        self.turn += 1
        truncated = self.turn >= self.max_turns
        found = re.findall(r"\\boxed\{\s*(knock|open)\s+(\d+)\s*\}", action)
        if not found:
            return "Knock or open a door by number.", 0.0, False, truncated, {}
        verb, door = found[-1][0], int(found[-1][1])
        if verb == "knock":
            heard = "a faint chime" if door == self.prize else "nothing"
            return f"Behind door {door} you hear {heard}.", 0.05, False, truncated, {}
        if door == self.prize:
            return "You found the prize!", 1.0, True, False, {}
        return "An empty room.", 0.0, True, False, {}

    def solution(self):
        return ["\\boxed{knock %d}" % self.prize, "\\boxed{open %d}" % self.prize]
