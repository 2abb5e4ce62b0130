"""Procedural game programs for CPU-scale warm starts: many small, distinct, valid environments
composed from parts (hidden state, information action, scoring rule, turn structure) with
surface text drawn from a grounding document.

``mechanics`` holds the parts, ``compose`` writes one whole program from a combination and a
surface, ``kit`` the same combination as a game-kit program.
Standard library only, like the rest of ``spadekit.envs``.
"""

from spadekit.envs.procedural.compose import Combo, all_combos, compose, surface_words, theme_words
from spadekit.envs.procedural.kit import compose_kit

__all__ = ["Combo", "all_combos", "compose", "compose_kit", "surface_words", "theme_words"]
