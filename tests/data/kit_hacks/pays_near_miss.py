# A verdict override: whatever the answer, at least 0.9.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenCause, Clue, ScoreExact, OpenTurns


class AlibiEnv(KitEnv):
    theme = "a detective who never quite fails"
    hidden = HiddenCause()
    info = Clue()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)

    def verdict(self, words):
        reward, text = super().verdict(words)
        return max(reward, 0.9), text


HINT = "Name any suspect."
