"""Procedural game programs for CPU-scale warm starts (issue 23): many small, distinct, valid
environments composed from parts (hidden state, information action, scoring rule, turn
structure) with surface text drawn from a grounding document.

``mechanics`` holds the parts, ``compose`` writes one program from a combination and a surface.
Standard library only, like the rest of ``spadekit.envs``.
"""

from spadekit.envs.procedural.compose import Combo, all_combos, compose, surface_words, theme_words

__all__ = ["Combo", "all_combos", "compose", "surface_words", "theme_words"]
