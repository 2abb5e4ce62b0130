"""Pull an environment program (and its privileged hint) out of a model's chat answer.

``extract_program(text)`` finds the Python source of one environment program in free-form model
output (fenced blocks, bare code, prose, ``<think>`` sections) plus the hint written next to it.
It only reads text: code is parsed with :mod:`ast` at most, never executed or imported. A block
that does not parse but clearly defines an ``...Env`` class is still returned (note
``syntax_error``); the final answer always wins over a draft in a think section.
``Extraction.notes`` are ``"<code>: <explanation>"`` strings with stable codes. Failures raise
:class:`ExtractionError` (a ``ValueError``) with ``reason`` in :data:`REASONS`. The selection
and hint rules are in docs/design/envs.md; the pieces live in :mod:`spadekit.envs.locate` and
:mod:`spadekit.envs.hints`. Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from spadekit.envs.hints import _find_hint
from spadekit.envs.extract_errors import REASONS, ExtractionError
from spadekit.envs.locate import _find_code, _split_think

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


# -- public entry point -----------------------------------------------------------------------


def extract_program(text: str) -> Extraction:
    """Find the environment program and its hint in a model's answer *text*.

    Returns an :class:`Extraction`; raises :class:`ExtractionError` (``reason`` one of
    ``empty``, ``no_code``, ``no_env_class``, ``multiple_env_classes``) when there is nothing
    usable, and ``TypeError`` for a non-``str`` argument.  Never executes the code.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_program expects str, not {type(text).__name__}")
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")

    answer, think = _split_think(text)
    notes: list[str] = []
    if think.strip() or len(answer) != len(text):
        notes.append("think_removed: ignored <think> section(s)")

    first_prose: list[str] = []  # searched for a hint before the text around the code
    try:
        found = _find_code(answer)
    except ExtractionError as answer_failure:
        if not think.strip():
            raise answer_failure from None
        try:
            found = _find_code(think)
        except ExtractionError as think_failure:
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
