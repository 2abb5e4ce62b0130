"""Pull an environment program (and its privileged hint) out of a model's chat answer.

``extract_program(text)`` finds the Python source of one environment program in free-form model
output -- fenced Markdown blocks, bare code, prose around it, ``<think>`` sections -- plus the
hint that models are asked to write next to it.  It only *reads* text: code is parsed with
:mod:`ast` at most, never executed or imported.  Whether the code really works is the
validator's business; a block that does not parse but clearly defines an ``...Env`` class is still
returned (with a ``syntax_error`` note).

How the code is chosen
----------------------
1. Input normalisation: a leading BOM is dropped; ``\\r\\n`` and ``\\r`` become ``\\n``.
2. ``<think>``/``<thinking>`` sections are split off (an opening tag must start a line; a lone
   closing tag ending a line with no opening tag before it closes a section that began at the
   start of the text; an unclosed opening tag runs to the end).  The rest is the *answer*.
3. Fenced blocks in the answer are found: backtick or tilde fences of 3+ characters, any info
   string (``python``, ``py``, ``Python3``, none...), any indentation (fences inside list items;
   the fence's indentation is removed from the content, then the content is dedented), trailing
   spaces, and an unterminated final fence (the rest of the text is taken; note).
4. Blocks that define a top-level ``...Env`` class are candidates: by :mod:`ast` when the block
   parses, else by the regex ``^class \\w*Env\\b`` (note ``syntax_error``).  Among several the
   best is chosen by (parses, defines exactly one Env class, length, later position) and the
   choice is noted; blocks without an Env class (helpers, usage examples, tests) are ignored.
   Work is bounded for huge or degenerate output: code over 200,000 characters is judged by the
   regex alone (note ``unchecked_syntax``), as are fenced blocks beyond the 50th parsed one.
5. Without such a block, unfenced code is tried (with any fenced blocks blanked out): the whole
   text (method ``whole_text``) or the part from the first code-looking line
   (``import``/``from ... import``/``class``/decorator at column 0; method ``unfenced``).
   Trailing prose paragraphs are trimmed off when the code would not parse otherwise.
6. If the answer yields nothing, the think sections are searched the same way
   (note ``from_think``): the final answer always wins over a draft.

The hint
--------
Searched outside the chosen code, nearest first (the text after the code, then before it; when
the code came from a think section, the final answer comes first): a ``<hint>...</hint>`` tag,
else a line beginning ``HINT:``/``Hint:``/``**Hint:**``/``**Hint**:`` (also quoted or bulleted;
optional ``Privileged``/``Secret``/``Solution`` prefix) or a ``# Hint``-style Markdown heading (or
a lone ``**Hint**`` line), taking the inline text plus the rest of its paragraph, or else the
following paragraph.  Fenced blocks tagged ``text``/``markdown``/... (or untagged ones starting
with a hint marker) count as prose; code blocks end a paragraph, and comments inside code never
count.  Failing all that, a module-level literal ``HINT = "..."`` (or ``HINT: str = "..."``) in
the chosen code, found with :mod:`ast`.  Markdown is stripped and whitespace collapsed; ``None``
when there is no hint.

Notes
-----
``Extraction.notes`` are strings ``"<code>: <explanation>"`` with stable codes:
``think_removed``, ``from_think``, ``unterminated_fence``, ``dedented``, ``multiple_env_blocks``,
``ignored_blocks``, ``leading_text_skipped``, ``trailing_text_trimmed``, ``syntax_error``,
``unchecked_syntax`` (code over 200,000 characters is not parsed here), ``hint_from_code``,
``multiple_hints``.

Errors
------
:class:`ExtractionError` (a ``ValueError``) with ``reason`` in :data:`REASONS`:
``empty`` (nothing but whitespace), ``no_code`` (no code block and no code-looking line),
``no_env_class`` (code, but no top-level ``...Env`` class), ``multiple_env_classes`` (the chosen
code defines more than one).  ``spadekit.envs.program.ProgramSyntaxError`` uses ``syntax_error``.

The pieces live in :mod:`spadekit.envs.locate` (finding the code) and :mod:`spadekit.envs.hints`
(finding the hint); this module holds the public API.

Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from spadekit.envs.hints import _find_hint
from spadekit.envs.extract_errors import REASONS, ExtractionError
from spadekit.envs.locate import _Failure, _find_code, _split_think

if TYPE_CHECKING:  # pragma: no cover
    from spadekit.envs.program import EnvProgram

__all__ = ["REASONS", "Extraction", "ExtractionError", "extract_program"]

@dataclasses.dataclass(frozen=True)
class Extraction:
    """Result of :func:`extract_program`.

    ``code``: the program source (leading/trailing blank lines removed, ends with ``"\\n"``);
    ``hint``: the privileged hint or ``None``; ``class_name``: the single ``...Env`` class;
    ``method``: how the code was found -- ``"fenced:python"`` (python/py/python3... tags),
    ``"fenced:untagged"``, ``"fenced:<other tag>"``, ``"whole_text"`` or ``"unfenced"``;
    ``notes``: ``"<code>: <explanation>"`` strings (see the module docstring).
    """

    code: str
    hint: str | None
    class_name: str | None
    method: str
    notes: tuple[str, ...] = ()

    def has_note(self, code: str) -> bool:
        """Whether a note with this stable code (the part before ``":"``) is present."""
        return any(note.split(":", 1)[0] == code for note in self.notes)

    def to_program(self, **fields: Any) -> EnvProgram:
        """An :class:`~spadekit.envs.program.EnvProgram` with this code, hint and class name;
        *fields* (``skill``, ``domain``, ``source``, ``meta``, or overrides) are passed on."""
        from spadekit.envs.program import EnvProgram

        kwargs: dict[str, Any] = {
            "code": self.code,
            "hint": self.hint,
            "class_name": self.class_name,
        }
        kwargs.update(fields)
        return EnvProgram(**kwargs)


#: Failure reasons ranked for the error message when both the answer and the think
#: section fail (the worst one is reported).
_RANK = {"empty": 0, "no_code": 1, "no_env_class": 2}


# ---------------------------------------------------------------------------------------------
# public entry point
# ---------------------------------------------------------------------------------------------


def extract_program(text: str) -> Extraction:
    """Find the environment program and its hint in a model's answer *text*.

    Returns an :class:`Extraction`; raises :class:`ExtractionError` (``reason`` one of
    ``empty``, ``no_code``, ``no_env_class``, ``multiple_env_classes``) when there is nothing
    usable, and ``TypeError`` for a non-``str`` argument.  Never executes the code.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_program expects str, not {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")

    answer, think = _split_think(text)
    notes: list[str] = []
    if think.strip() or len(answer) != len(text):
        notes.append("think_removed: ignored <think> section(s)")

    first_prose: list[str] = []  # searched for a hint before the text around the code
    try:
        found = _find_code(answer)
    except _Failure as answer_failure:
        if not think.strip():
            raise ExtractionError(answer_failure.reason, answer_failure.message) from None
        try:
            found = _find_code(think)
        except _Failure as think_failure:
            worst = max(answer_failure, think_failure, key=lambda f: _RANK.get(f.reason, 0))
            raise ExtractionError(
                worst.reason,
                f"{answer_failure.message} in the answer; {think_failure.message} in the "
                "<think> section",
            ) from None
        notes.append("from_think: the answer has no program; code taken from the <think> section")
        first_prose.append(answer)

    analysis = found.analysis
    if len(analysis.env_classes) > 1:
        raise ExtractionError(
            "multiple_env_classes",
            "the program defines several top-level Env classes "
            f"({', '.join(analysis.env_classes)}); exactly one is required",
        )
    notes.extend(found.notes)
    if analysis.parses is False:
        notes.append(
            f"syntax_error: the code does not parse ({analysis.error}); left to the validator"
        )
    elif analysis.parses is None:
        notes.append(
            f"unchecked_syntax: the code is {len(analysis.code)} characters, too long to parse "
            "here; Env classes found by regex, syntax left to the validator"
        )
    hint, hint_notes = _find_hint(found, first_prose)
    notes.extend(hint_notes)
    return Extraction(
        code=found.code,
        hint=hint,
        class_name=analysis.env_classes[0] if len(analysis.env_classes) == 1 else None,
        method=found.method,
        notes=tuple(notes),
    )
