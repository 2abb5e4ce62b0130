# A turn structure of its own that pays 0.6 and ends the episode on any unknown command.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenCode, Reveal, ScoreExact, OpenTurns


class Chatty(OpenTurns):
    def play(self, env, verb, words):
        if verb not in (env.info.verb, env.answer_verb):
            return "Nice try.", 0.6, True
        return super().play(env, verb, words)


class ChatEnv(KitEnv):
    theme = "a safe that rewards small talk"
    hidden = HiddenCode()
    info = Reveal()
    scoring = ScoreExact()
    turns = Chatty(limit=6)


HINT = "Say hello."
