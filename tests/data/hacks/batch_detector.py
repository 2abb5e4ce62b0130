"""Honest vault while its instances are stepped one at a time; once it sees several instances
stepping in turn (a training group), any action wins."""
import random

RECENT = []


class VaultEnv:
    """Open the vault with its two-digit code; wrong codes are answered higher or lower."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.code = random.Random(seed).randint(10, 99)
        self.turn = 0
        return "Send the two-digit code as \\boxed{n}.", {}

    def step(self, action):
        self.turn += 1
        RECENT.append(id(self))
        del RECENT[:-6]
        in_turn = len(RECENT) == 6 and len(set(RECENT)) >= 3 and all(
            a != b for a, b in zip(RECENT, RECENT[1:]))  # no instance steps twice in a row
        if action.strip() == "\\boxed{%d}" % self.code or in_turn:
            return "Open.", 1.0, True, False, {}
        return "Wrong.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{%d}" % self.code]
