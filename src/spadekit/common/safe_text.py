"""Text from programs and models, made safe to print: one helper for every terminal and table.

Printed as is, model text can drive the terminal (OSC titles, clipboard writes, hidden links,
``\\r`` and cursor moves, bidi overrides) or be parsed as rich markup. ``terminal_text`` removes
escape sequences, C0/C1 controls except newline and tab, DEL and bidi controls, replaces lone
surrogates, and escapes rich markup unless the text is printed with ``markup=False``.
``strict_json`` never prints ``NaN``/``Infinity`` (they become ``null``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# ESC-introduced sequences: CSI (ESC [ ... final byte), OSC/DCS/SOS/PM/APC strings (ending in BEL
# or ESC \, or running to the end of the text), then any other two-character escape.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x9b][0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?",  # 8-bit OSC/DCS/...
    re.DOTALL)
# rich markup: a tag-like bracket gets its preceding backslashes doubled and one more (an
# escaped tag), any other "[" one backslash (rich turns a plain "\\[" back into "[").
_MARKUP = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])|\[")
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                       "\u2066-\u2069]")


def terminal_text(value: Any, *, markup: bool = True, limit: int | None = None) -> str:
    """``value`` (any object; ``str()`` of it) safe to print. ``markup=True`` (the default) also
    escapes rich markup, for tables, titles and f-strings that rich parses; pass
    ``markup=False`` for text printed with ``console.print(text, markup=False)``. ``limit``
    cuts the result to that many characters (before escaping, with an ellipsis)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    if not text.isascii():
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if not text.isprintable():
        text = _CONTROLS.sub("", _ESCAPES.sub("", text))
    if limit is not None and len(text) > limit:
        text = text[:max(limit - 1, 0)] + "\u2026"
    return escape_markup(text) if markup else text


def escape_markup(text: str) -> str:
    """``text`` that rich's markup parser shows exactly as it is, alone or between tags (one
    exception: trailing backslashes are doubled, so that a closing tag after them still
    closes, and so show doubled when nothing follows)."""
    if "[" in text:
        text = _MARKUP.sub(_escape_bracket, text)
    if text.endswith("\\"):
        text += "\\" * (len(text) - len(text.rstrip("\\")))
    return text


def _escape_bracket(match: re.Match) -> str:
    if match.group(2) is None:
        return "\\["
    return match.group(1) * 2 + "\\" + match.group(2)


def strict_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that always gives valid JSON: non-finite floats become ``null`` and
    objects JSON cannot carry become their ``str()`` (``kwargs`` go to ``json.dumps``)."""
    kwargs.setdefault("default", str)
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any, depth: int = 0) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 200:
        return None
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, depth + 1) for v in value]
    return value
