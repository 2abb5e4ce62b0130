"""The hint-line patterns shared by :mod:`spadekit.envs.hints` (finding the hint) and
:mod:`spadekit.envs.locate` (text blocks, cutting bare code before a trailing hint).

Its own module so that those two do not import each other. Standard library only: sandbox workers
import this package.
"""

from __future__ import annotations

import re

__all__ = ["_BLOCK_MARK", "_HINT_LINE", "_HINT_WORD"]

_HINT_WORD = r"(?:(?:privileged|secret|solution|solver|player)[ \t]+)?hints?"
# (Written so that no two whitespace runs can match the same characters: no quadratic
# backtracking on long lines.)
_HINT_LINE = re.compile(
    r"^[ \t]*(?:>[ \t]*)*(?:[-*+][ \t]+)?(?:(?:\*\*|__)[ \t]*)?" + _HINT_WORD
    + r"[ \t]*(?:(?:\*\*|__)[ \t]*)?[:\uff1a][ \t]*(?:(?:\*\*|__)[ \t]*)?(?P<rest>.*)$",
    re.IGNORECASE,
)

_BLOCK_MARK = "\x00"  # stands for a code block in the prose searched for hints
