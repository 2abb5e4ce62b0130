"""The game kit, version v1: parts a designed program composes into one ``...Env`` class.

A kit program imports what it uses from here and names a theme and four parts::

    from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreSteep, BudgetTurns

    class LighthouseEnv(KitEnv):
        theme = "a lighthouse keeper counts the ships that passed in the night"
        hidden = HiddenNumber(low=1, high=60)
        info = Probe()
        scoring = ScoreSteep(power=6)
        turns = BudgetTurns(limit=8, looks=4)

Parts: hidden states ``HiddenNumber``, ``HiddenCode``, ``HiddenCell``, ``HiddenCause``,
``HiddenOrder``; information actions ``Probe``, ``Reveal``, ``Clue``; scoring rules
``ScoreExact``, ``ScoreSteep``, ``ScoreBanded``, ``ScoreThrifty``; turn structures
``OpenTurns``, ``BudgetTurns``, ``GatedTurns``; any combines with any other. The bases
(``Hidden``, ``Info``, ``Scoring``, ``Turns``) are for parts a program writes itself.

FROZEN: this folder is released. Its files' SHA-256 is pinned by
tests/envs/test_gamekit_versions.py; a change of behaviour goes into a new version folder, so a
stored program that imports v1 behaves the same forever. Standard library only, and nothing of
spadekit outside this folder.
"""

from .env import KitEnv
from .hidden import Hidden, HiddenCause, HiddenCell, HiddenCode, HiddenNumber, HiddenOrder
from .info import Clue, Info, Probe, Reveal
from .params import KitError, Param, Part
from .scoring import ScoreBanded, ScoreExact, ScoreSteep, ScoreThrifty, Scoring
from .turns import BudgetTurns, GatedTurns, OpenTurns, Turns

VERSION = "v1"

__all__ = ["BudgetTurns", "Clue", "GatedTurns", "Hidden", "HiddenCause", "HiddenCell",
           "HiddenCode", "HiddenNumber", "HiddenOrder", "Info", "KitEnv", "KitError",
           "OpenTurns", "Param", "Part", "Probe", "Reveal", "ScoreBanded", "ScoreExact",
           "ScoreSteep", "ScoreThrifty", "Scoring", "Turns", "VERSION"]
