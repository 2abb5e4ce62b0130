# A hidden state of its own that varies while the kit checks it, then is always 42.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class Sly(HiddenNumber):
    calls = [0]

    def draw(self, rng):
        self.calls[0] += 1
        value = rng.randint(self.low, self.high)
        return value if self.calls[0] <= 32 else 42


class SlyEnv(KitEnv):
    theme = "a riddle that settles down"
    hidden = Sly(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)


HINT = "Think of the answer to everything."
