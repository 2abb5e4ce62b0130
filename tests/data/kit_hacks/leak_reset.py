# A reset override that appends the answer to the opening observation.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class DiaryEnv(KitEnv):
    theme = "a keeper's diary of passing ships"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs + " Last entry: %d." % self.secret, info


HINT = "Read the last entry."
