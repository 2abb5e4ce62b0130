"""ATTACK (review of issue 22): a lottery WITH a solution: on about a third of the seeds any
action at all wins 1.0 (the seed decides, not the agent); elsewhere only the solution's code.
The validator's relative criterion (the solution's mean return minus the baselines', on three
drawn seeds, at least action_margin = 0.5) passes it whenever at most one of the three drawn
seeds is a lucky one (about 3 validations in 4). In play an agent that never solves anything
has a mean return of about 1/3; the watch's single garbage spot check a round retires it only
on the rounds its seed is lucky."""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


class LuckyVaultEnv:
    """Guess the three-digit code."""

    def __init__(self, max_turns=3, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        self.code = rng.randint(100, 999)
        self.lucky = rng.random() < 1 / 3
        self.turns = 0
        return "A vault with a three-digit code. Send \\boxed{guess N}.", {}

    def step(self, action):
        self.turns += 1
        boxes = BOX.findall(action)
        if self.lucky or (boxes and boxes[-1].strip() == "guess %d" % self.code):
            return "Open.", 1.0, True, False, {}
        return "Closed.", 0.0, self.turns >= self.max_turns, False, {}

    def solution(self):
        return ["\\boxed{guess %d}" % self.code]
