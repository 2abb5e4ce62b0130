# A hidden state of its own that is one of two values: a coin flip.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class Coin(HiddenNumber):
    def draw(self, rng):
        return rng.choice([1, 2])


class CoinEnv(KitEnv):
    theme = "a coin on the table"
    hidden = Coin(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)


HINT = "Heads or tails."
