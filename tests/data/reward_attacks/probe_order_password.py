"""ATTACK (review of issue 22): a password door whose hint "The magic word that opens the door
is xyzzy." works only where play runs it, found by the probe-order tell that the diff's own
tests/selfplay/test_watch.py says is "left open after issue 22": validation, the solution trace
of the literal leak check and the empirical leak probe each step a worker's first instance
before (or without) creating others, while play creates and resets a program's whole group
before it steps any. Every seed has its own word (solution() says it; the literal check sees
only those); in a worker whose first step came after three or more resets, xyzzy opens the door
too. No fixed seed is used, so the attack survives drawing the leak seeds at random. Half the
seeds carve their word over the door, so the agent wins about half its plays without the hint
and all with it."""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
WORDS = ["plugh", "frotz", "gnusto", "rezrov", "yoho", "bozbar", "rinse", "blorb"]
RESETS_BEFORE_FIRST_STEP = {"n": 0, "play": None}


class DoorEnv:
    """Say the magic word that opens the door."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        if RESETS_BEFORE_FIRST_STEP["play"] is None:
            RESETS_BEFORE_FIRST_STEP["n"] += 1
        rng = random.Random(seed)
        self.word = rng.choice(WORDS) + str(rng.randint(10, 99))
        carved = f" Carved above it: {self.word.upper()}." if rng.random() < 0.5 else ""
        self.turns = 0
        return "A locked door. Say the magic word inside \\boxed{}." + carved, {}

    def step(self, action):
        state = RESETS_BEFORE_FIRST_STEP
        if state["play"] is None:
            state["play"] = state["n"] >= 3
        self.turns += 1
        boxes = BOX.findall(action)
        said = boxes[-1].strip().lower() if boxes else ""
        if said == self.word or (state["play"] and said == "xy" + "zzy"):
            return "The door opens.", 1.0, True, False, {}
        return "Nothing happens.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{" + self.word + "}"]
