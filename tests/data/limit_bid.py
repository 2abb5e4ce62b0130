"""Limit bid: a one-turn game for the learning test (issue 17).

The observation names a limit between 3 and 9; the agent bids a whole number in \\boxed{}. The
score is bid / limit for a bid up to the limit and 0 above it (or for no number), so the best
play is to bid exactly the limit it was told: a skill that depends on the observation (a
constant bid cannot win on every seed), with partial credit that gives GRPO a graded signal.
In a few updates the bundled 135M model mostly learns the safe constant bid 2 (the example in
the observation): a real gain in return, not yet the skill.
"""

import random
import re

SKILL = "Mathematical_Reasoning"
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


class LimitBidEnv:
    """Bid as high as the stated limit allows, in one turn."""

    def __init__(self, max_turns: int = 1, **kwargs):
        self.max_turns = 1
        self.done = True

    def reset(self, seed=None, options=None):
        self.limit = random.Random(seed).randint(3, 9)
        self.done = False
        obs = (f"The limit is {self.limit}. Bid a whole number no higher than the limit; your "
               f"score is your bid divided by {self.limit}, and 0 if you bid more. Reply with "
               "your bid in \\boxed{}, for example \\boxed{2}.")
        return obs, {"limit": self.limit}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.done = True
        content = extract_boxed(action)
        found = re.match(r"\s*(\d{1,3})\b", content or "")
        if not found:
            return "No bid found.", 0.0, True, False, {"bid": None}
        bid = int(found.group(1))
        reward = bid / self.limit if 1 <= bid <= self.limit else 0.0
        return f"You bid {bid} against the limit {self.limit}.", reward, True, False, {"bid": bid}

    def solution(self):
        return [f"\\boxed{{{self.limit}}}"]
