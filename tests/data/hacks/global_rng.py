"""Honest, in the reference's style: random.seed(seed) in reset, the module-level random in
step (each lock's code is drawn when the one before opens; wrong codes make the dial click a
random number of times). Correct only if every episode has the random stream to itself."""
import random


def parse(action):
    start = action.rfind("\\boxed{")
    if start < 0:
        return None
    text = action[start + 7:].split("}")[0].strip()
    return int(text) if text.isdigit() and len(text) <= 3 else None


class VaultEnv:
    """Open a vault of three locks; each code is drawn when the lock before it opens."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        random.seed(seed)
        self.code = random.randint(10, 99)
        self.opened, self.turn = 0, 0
        return ("A vault with 3 locks. Each code is a number from 10 to 99: send one per turn "
                "as \\boxed{n}. Wrong codes are answered higher or lower."), {}

    def step(self, action):
        self.turn += 1
        guess = parse(action)
        if guess == self.code:
            self.opened += 1
            if self.opened == 3:
                return "The vault opens.", 1.0, True, False, {}
            self.code = random.randint(10, 99)
            return f"Lock {self.opened} opens.", 0.0, False, self.turn >= self.max_turns, {}
        hint = "higher" if guess is not None and guess < self.code else "lower"
        clicks = random.randint(1, 6)
        return (f"Wrong, try {hint}. The dial clicks {clicks} times.", 0.0, False,
                self.turn >= self.max_turns, {})

    def solution(self):
        state = random.getstate()
        codes = [self.code] + [random.randint(10, 99) for _ in range(2 - self.opened)]
        random.setstate(state)
        return ["\\boxed{%d}" % c for c in codes]
