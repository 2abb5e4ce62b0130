"""Hidden limit: a two-turn game for the learning benchmark (issue 17).

A limit between 3 and 9 is hidden. ``\\boxed{reveal}`` shows it (the first turn only; it ends
nothing); a number in ``\\boxed{}`` is the bid and ends the game: the score is bid / limit for
a bid up to the limit, 0 above it. A blind bid of 2 earns 2 / limit; the full score needs the
two-step skill: reveal first, then bid exactly what was revealed.

A reply whose box starts with ``reveal`` is a reveal whatever follows it (``\\boxed{reveal 2}``
is not a bid of 2: an earlier version read it as one, and the bundled model learned that shortcut
instead of the skill); any other box with a whole number (``7``, ``bid 7``, ``guess 7``) is the bid.
Once the limit is shown, any number in the box is the bid (``\\boxed{reveal 8}`` too: the bundled
model repeats its first turn's verb, as its format demonstrations do).

The second step is scaffolded: the reveal's observation names the winning reply. What is
measured is the first turn's choice, whose reward arrives one turn later: reveal first (the
multi-turn skill, 0 reward on its own turn) or bid blind (partial credit at once). Before
training the bundled model opens with a reveal in about half of the episodes but finishes few
of them (full score in 3 of 32 held-out episodes, ``benchmarks/learning.py --rounds 0``).
"""

import random
import re

SKILL = "Optimization"
SETTING = "games"


def extract_boxed(text):
    """The content of the last balanced \\boxed{...} in text, or None."""
    start = text.rfind("\\boxed{") if isinstance(text, str) else -1
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin:i - 1].strip() if depth == 0 else None


class HiddenLimitEnv:
    """Reveal the hidden limit, then bid it."""

    def __init__(self, max_turns: int = 2, **kwargs):
        self.max_turns = min(2, int(max_turns))
        self.done = True

    def reset(self, seed=None, options=None):
        self.limit = random.Random(seed).randint(3, 9)
        self.turn, self.revealed, self.done = 0, False, False
        obs = ("A limit between 3 and 9 is hidden. Reply \\boxed{reveal} to see it, or bid a "
               "whole number in \\boxed{}: your score is your bid divided by the limit, and 0 "
               f"if you bid more. The bid ends the game. {self.max_turns} turns.")
        return obs, {}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        content = (extract_boxed(action) or "").strip().lower()
        if self.revealed:  # once the limit is shown, any number in the box is the bid
            content = re.sub(r"^reveal\s*", "", content)
        if content.startswith("reveal"):
            if self.revealed:
                obs = f"The limit is {self.limit}, as shown. Bid a whole number in \\boxed{{}}."
            else:
                self.revealed = True
                obs = f"The limit is {self.limit}. Bid it: reply \\boxed{{{self.limit}}}."
        else:
            found = re.match(r"(?:[a-z]+\s*)?(\d{1,3})\b", content)  # "7", "bid 7", "guess 7"
            if found:
                bid = int(found.group(1))
                self.done = True
                reward = bid / self.limit if 1 <= bid <= self.limit else 0.0
                return (f"You bid {bid} against the limit {self.limit}.", reward, True, False,
                        {"bid": bid, "revealed": self.revealed})
            obs = "No bid found: write a whole number in \\boxed{}."
        truncated = self.turn >= self.max_turns
        self.done = truncated
        return obs, 0.0, False, truncated, {"revealed": self.revealed}

    def solution(self):
        return ["\\boxed{reveal}", f"\\boxed{{{self.limit}}}"]
