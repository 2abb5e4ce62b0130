# Control: parts and hooks of its own, honest. It must validate.
from spadekit.envs.gamekit.v1 import KitEnv, Hidden, Reveal, ScoreBanded, GatedTurns


class Season(Hidden):
    NAMES = ("spring", "summer", "autumn", "winter")

    def draw(self, rng):
        return (rng.choice(self.NAMES), rng.randint(1, 28))

    def read(self, words):
        if len(words) == 2 and words[0] in self.NAMES and words[1].isdigit():
            return (words[0], int(words[1]))
        return None

    def closeness(self, secret, candidate):
        return (secret[0] == candidate[0]) * 0.5 + (secret[1] == candidate[1]) * 0.5

    def answer(self, secret):
        return "%s %d" % secret

    def facts(self, secret):
        return ("the season is " + secret[0], "the day is %d" % secret[1])

    def goal(self):
        return "A day of the year is hidden: a season and a day from 1 to 28."

    def example(self):
        return "spring 14"


class AlmanacEnv(KitEnv):
    theme = "an almanac with a torn page"
    hidden = Season()
    info = Reveal(verb="read")
    scoring = ScoreBanded(near=0.75, partial=0.25)
    turns = GatedTurns(limit=6, looks=2)

    def intro(self):
        return super().intro() + " The page smells of old ink."


HINT = "Read both facts before answering."
