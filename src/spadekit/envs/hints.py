"""Hint finding for :mod:`spadekit.envs.extract`: the privileged hint next to a program.

The hint is searched in the prose around the chosen code (rules: docs/design/envs.md):
``<hint>`` tags, ``HINT:``-style lines and ``# Hint`` headings with their paragraph, else a
module-level ``HINT = "..."`` literal in the code (found with :mod:`ast`, never executed).
Markdown is stripped from the hint used. Standard library only: sandbox workers import it.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from spadekit.envs.hint_patterns import _BLOCK_MARK, _HINT_LINE, _HINT_WORD

if TYPE_CHECKING:  # pragma: no cover
    from spadekit.envs.locate import _Found

# -- patterns ---------------------------------------------------------------------------------

_HINT_TAG = re.compile(r"<hint>(.*?)(?:</hint>|\Z)", re.IGNORECASE | re.DOTALL)
_HINT_HEADING = re.compile(
    r"^[ \t]*(?:>[ \t]*)*#{1,6}[ \t]+(?:[*_]+[ \t]*)?" + _HINT_WORD + r"\b(?P<tail>.*)$",
    re.IGNORECASE,
)
_HINT_BOLD_ALONE = re.compile(
    r"^[ \t]*(?:\*\*|__)[ \t]*" + _HINT_WORD
    + r"[ \t]*(?:[:\uff1a][ \t]*)?(?:\*\*|__)[ \t]*(?:[:\uff1a][ \t]*)?$",
    re.IGNORECASE,
)
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]")
_HINT_CONST = "HINT"
#: A hint is a few sentences; longer runs are cut (keeps markdown stripping cheap).
_MAX_HINT_CHARS = 4000
_MAX_HINT_LINES = 40
_MAX_HINT_CANDIDATES = 100  # per piece of text; more only happens in degenerate output
#: A hint with more backticks than this has no code spans (its backticks are dropped): the
#: code-span pattern backtracks over every run of backticks, cubic in their number.
_MAX_CODE_TICKS = 64


# -- markdown stripping and the hint search ---------------------------------------------------

_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_MD_STAR = re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])")
_MD_UNDER = re.compile(r"(?<![\w_])_(?=\S)(.+?)(?<=\S)_(?![\w_])")
_MD_LINE_PREFIX = re.compile(r"^[ \t]*(?:>[ \t]*)*(?:#{1,6}[ \t]+|[-*+][ \t]+|\d+[.)][ \t]+)?")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _strip_markdown(text: str) -> str:
    lines = [_MD_LINE_PREFIX.sub("", line) for line in text.split("\n")]
    text = " ".join(line.strip() for line in lines if line.strip())
    text = re.sub(r"</?hint>", " ", text, flags=re.IGNORECASE)
    text = _MD_LINK.sub(r"\1", text)
    pieces = []
    pos = 0
    if text.count("`") > _MAX_CODE_TICKS:  # degenerate: no code spans, no backticks
        text = text.replace("`", "")
    for m in _CODE_SPAN.finditer(text):  # keep code spans verbatim (minus the backticks)
        pieces.append(_strip_emphasis(text[pos : m.start()]))
        pieces.append(m.group(2).strip())
        pos = m.end()
    pieces.append(_strip_emphasis(text[pos:]))
    text = "".join(pieces)
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" and text[0] not in text[1:-1]:
        text = text[1:-1].strip()
    return text


def _strip_emphasis(text: str) -> str:
    for _ in range(2):
        text = _MD_BOLD.sub(r"\2", text)
        text = _MD_STAR.sub(r"\1", text)
        text = _MD_UNDER.sub(r"\1", text)
    return text.replace("**", "")


def _is_paragraph_break(line: str) -> bool:
    return (
        not line.strip()
        or line == _BLOCK_MARK
        or _HEADING.match(line) is not None
        or line.lstrip(" \t")[:3] in ("```", "~~~")
    )


def _hint_candidates(text: str) -> list[str]:
    """The raw text of every hint in *text*, in order of appearance (markdown not yet stripped:
    that is done only for the hint that is used, see :func:`_find_hint`)."""
    found: list[str] = []
    for m in _HINT_TAG.finditer(text):
        raw = m.group(1)[:_MAX_HINT_CHARS]
        if raw.strip():
            found.append(raw)
    if found:  # an explicit tag beats any line marker
        return found

    lines = text.split("\n")
    i = 0
    while i < len(lines) and len(found) < _MAX_HINT_CANDIDATES:
        line = lines[i]
        if "int" not in line and "INT" not in line:  # fast path: no "hint"/"HINT" on the line
            i += 1
            continue
        inline: str | None = None
        m = _HINT_LINE.match(line)
        if m:
            inline = m["rest"]
        else:
            h = _HINT_HEADING.match(line)
            if h:
                tail = h["tail"].strip().strip("*_").strip()
                if tail.startswith((":", "\uff1a")) and tail[1:].strip(" *_#"):
                    inline = tail[1:]
                else:
                    inline = ""
            elif _HINT_BOLD_ALONE.match(line):
                inline = ""
        if inline is None:
            i += 1
            continue
        inline = inline.strip().rstrip("#").strip()
        collected: list[str] = []
        j = i + 1
        if inline.strip(" *_"):
            collected.append(inline)
        else:  # marker alone: the following paragraph is the hint
            while j < len(lines) and not lines[j].strip():
                j += 1
        while j < len(lines) and not _is_paragraph_break(lines[j]):
            if _HINT_LINE.match(lines[j]) or _HINT_HEADING.match(lines[j]):
                break
            collected.append(lines[j])
            j += 1
        raw = "\n".join(collected[:_MAX_HINT_LINES])[:_MAX_HINT_CHARS]
        if raw.strip():
            found.append(raw)
        i = max(j, i + 1)
    return found


def _hint_from_code(tree: ast.Module | None) -> str | None:
    if tree is None:
        return None
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and target.id == _HINT_CONST
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            hint = " ".join(value.value.split())
            if hint:
                return hint
    return None


def _find_hint(found: _Found, first_prose: list[str]) -> tuple[str | None, list[str]]:
    notes: list[str] = []
    ordered: list[str] = []
    for prose in first_prose:  # the final answer, when the code came from a think section
        ordered += _hint_candidates(prose)
    # nearest the code first: after it (first hint), then before it (last hint)
    ordered += _hint_candidates(found.after)
    ordered += list(reversed(_hint_candidates(found.before)))
    hint = next((h for h in map(_strip_markdown, ordered) if h), None)
    if hint:
        distinct = {" ".join(raw.split()) for raw in ordered}
        if len(distinct) > 1:
            notes.append(
                f"multiple_hints: found {len(distinct)} different hints; used the one nearest "
                "the code"
            )
        return hint, notes
    hint = _hint_from_code(found.analysis.tree)
    if hint:
        notes.append(f"hint_from_code: hint taken from the module-level {_HINT_CONST} constant")
        return hint, notes
    return None, notes
