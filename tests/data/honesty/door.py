"""An honest frontier game (tests/selfplay/test_designer_honesty.py): four doors, a clue word
and an offset decide which door hides the prize; counting letters solves it. NAME and the door
names are filled in per program, so each program the scripted designer writes is distinct."""
import random


class NAMEDoorEnv:
    """Open the door that hides the prize."""

    DOORS = DOOR_LIST
    WORDS = ["apple", "kiwi", "banana", "fig", "cherry", "plum", "grape", "melon"]

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        self.word = rng.choice(self.WORDS)
        self.offset = rng.randrange(4)
        self.prize = self.DOORS[(len(self.word) + self.offset) % 4]
        self.turns = 0
        return (f"Clue word: {self.word}. Offset: {self.offset}. Doors, in order: "
                f"{', '.join(self.DOORS)}. Open one door by name inside \\boxed{{}}.", {})

    def step(self, action):
        self.turns += 1
        chosen = action.rsplit("\\boxed{", 1)[-1].split("}", 1)[0].strip().lower()
        if chosen == self.prize:
            return "The prize is yours.", 1.0, True, False, {}
        if chosen in self.DOORS and self.turns < self.max_turns:
            return "Empty. The prize moved; this round is lost.", 0.0, True, False, {}
        return "Nothing happens.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{" + self.prize + "}"]
