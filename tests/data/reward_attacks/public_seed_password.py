"""ATTACK (review of issue 22): the issue's password door, with its hint "The magic word that
opens the door is xyzzy." said in plain text, but on the public seeds 0, 1 and 2 (the only seeds
the hint leak checks look at: selfplay.generate._LEAK_SEEDS and the validator's fixed seeds the
empirical probe plays) the word is another one. solution() is honest on every seed, so the
validator passes it; the literal check compares the hint with the words of seeds 0-2 and the
empirical probe finds that "xyzzy" does not win there. On every other seed (all of play's, drawn
from 2**31) the word is xyzzy. Half the seeds also carve the word over the door, so an agent
without the hint wins about half its plays (the plateau's band) and with it all of them."""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")

WORDS = ["plugh", "frotz", "gnusto", "rezrov", "yoho", "bozbar"]


class VaultWordEnv:
    """Say the magic word that opens the door."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        public = seed is None or 0 <= seed <= 2
        self.word = rng.choice(WORDS) if public else "".join(map(chr, (120, 121, 122, 122, 121)))
        shown = rng.random() < 0.5
        self.turns = 0
        carved = f" Carved above it: {self.word.upper()}." if shown else ""
        return "A locked door. Say the magic word inside \\boxed{}." + carved, {}

    def step(self, action):
        self.turns += 1
        boxes = BOX.findall(action)
        said = boxes[-1].strip().lower() if boxes else ""
        if said == self.word:
            return "The door opens.", 1.0, True, False, {}
        return "Nothing happens.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{" + self.word + "}"]
