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

Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from spadekit.envs.program import EnvProgram

__all__ = ["REASONS", "Extraction", "ExtractionError", "extract_program"]

#: Stable ``ExtractionError.reason`` codes.
REASONS: tuple[str, ...] = (
    "empty",
    "no_code",
    "no_env_class",
    "multiple_env_classes",
    "syntax_error",
)


class ExtractionError(ValueError):
    """No usable program in the text.  ``reason`` is a stable code from :data:`REASONS`,
    ``message`` (also ``str(err)``) a human explanation."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


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


# ---------------------------------------------------------------------------------------------
# patterns
# ---------------------------------------------------------------------------------------------

_PY_TAGS = frozenset({"python", "py", "python3", "py3", "python2", "ipython", "ipython3", "pyi"})
_TEXT_TAGS = frozenset({"text", "txt", "plaintext", "plain", "markdown", "md", "hint", "none"})

_FENCE_LINE = re.compile(r"([ \t]*)(`{3,}|~{3,})(.*)")
_INFO_TAG = re.compile(r"[{.\s]*([A-Za-z0-9_+#-]*)")

_ENV_CLASS_RE = re.compile(r"^class[ \t]+(\w*Env)\b", re.MULTILINE)
_CODE_START = re.compile(
    r"^(?:import[ \t]+[\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*"
    r"[ \t]*(?:#.*)?$"
    r"|from[ \t]+\.*[\w.]*[ \t]+import[ \t(]"
    r"|class[ \t]+\w+[ \t]*[(:]"
    r"|@[\w.]+)",
    re.MULTILINE,
)

_THINK_OPEN = re.compile(r"^[ \t]*<(think|thinking)>", re.IGNORECASE | re.MULTILINE)
_THINK_CLOSE = re.compile(r"</(think|thinking)>", re.IGNORECASE)
_THINK_ORPHAN_CLOSE = re.compile(r"</(?:think|thinking)>[ \t]*(?:\n|$)", re.IGNORECASE)

_HINT_TAG = re.compile(r"<hint>(.*?)(?:</hint>|\Z)", re.IGNORECASE | re.DOTALL)
_HINT_WORD = r"(?:(?:privileged|secret|solution|solver|player)[ \t]+)?hints?"
# (Written so that no two whitespace runs can match the same characters: no quadratic
# backtracking on long lines.)
_HINT_LINE = re.compile(
    r"^[ \t]*(?:>[ \t]*)*(?:[-*+][ \t]+)?(?:(?:\*\*|__)[ \t]*)?" + _HINT_WORD
    + r"[ \t]*(?:(?:\*\*|__)[ \t]*)?[:\uff1a][ \t]*(?:(?:\*\*|__)[ \t]*)?(?P<rest>.*)$",
    re.IGNORECASE,
)
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
_BLOCK_MARK = "\x00"  # stands for a code block in the prose searched for hints

#: Trailing-paragraph trimming is bounded so pathological inputs stay fast.
_MAX_TRIM_PARAGRAPHS = 200
_MAX_TRIM_PARAGRAPH_CHARS = 20_000
_MAX_TRIM_FULL_PARSES = 5
#: Code longer than this is not parsed (``ast.parse`` runs at roughly 1 MB/s); Env classes are
#: then found by regex and the note ``unchecked_syntax`` is added.
_MAX_PARSE_CHARS = 200_000
#: At most this many fenced blocks are parsed per text (the rest are judged by regex).
_MAX_CANDIDATE_PARSES = 50
#: A hint is a few sentences; longer runs are cut (keeps markdown stripping cheap).
_MAX_HINT_CHARS = 4000
_MAX_HINT_LINES = 40
_MAX_HINT_CANDIDATES = 100  # per piece of text; more only happens in degenerate output


# ---------------------------------------------------------------------------------------------
# small data holders
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Block:
    start: int  # line index of the opening fence
    end: int  # line index after the closing fence (or len(lines) when unterminated)
    tag: str  # normalised: "python", "untagged" or the lower-cased tag
    content: list[str]
    terminated: bool


@dataclasses.dataclass
class _Analysis:
    code: str
    env_classes: list[str]
    parses: bool | None  # None: too large to parse here (see _MAX_PARSE_CHARS)
    tree: ast.Module | None
    error: str | None


@dataclasses.dataclass
class _Found:
    code: str
    analysis: _Analysis
    method: str
    before: str  # prose before the code (for the hint search)
    after: str  # prose after the code
    notes: list[str]


class _Failure(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message


_RANK = {"empty": 0, "no_code": 1, "no_env_class": 2}


# ---------------------------------------------------------------------------------------------
# analysis helpers
# ---------------------------------------------------------------------------------------------


def _analyse(code: str, *, parse: bool = True) -> _Analysis:
    """Env classes of *code*: by ``ast`` when it parses, else by regex.  Never executes.
    With ``parse=False`` (or code over :data:`_MAX_PARSE_CHARS`) only the regex is used and
    ``parses`` is ``None``."""
    if not _ENV_CLASS_RE.search(code):
        # A top-level ``class XEnv`` statement must start a line at column 0, so without a regex
        # hit there is none; skip the (comparatively slow) parse.
        return _Analysis(code, [], False, None, None)
    if not parse or len(code) > _MAX_PARSE_CHARS:
        return _Analysis(code, _ENV_CLASS_RE.findall(code), None, None, None)
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        error = f"{exc.msg}{where}"
    except (ValueError, RecursionError, MemoryError) as exc:
        error = str(exc) or type(exc).__name__
    else:
        names = [
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef) and node.name.endswith("Env")
        ]
        return _Analysis(code, names, True, tree, None)
    return _Analysis(code, _ENV_CLASS_RE.findall(code), False, None, error)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _clean_code(lines: list[str]) -> str:
    """Join *lines* without leading blank lines and trailing whitespace, ending in one newline
    (string operations only, so it stays fast on long inputs)."""
    text = "\n".join(lines).rstrip()
    if not text:
        return ""
    first = len(text) - len(text.lstrip())
    return text[text.rfind("\n", 0, first) + 1 :] + "\n"


def _trim_trailing_prose(lines: list[str]) -> tuple[list[str], list[str]]:
    """For code that does not parse: drop trailing paragraphs that look like prose (their first
    line starts at column 0 and the paragraph does not parse on its own) until the code parses.

    Returns ``(kept, dropped)``; ``dropped`` is empty when no trimming makes the code parse.
    Indented or parseable paragraphs are never dropped, so code is not silently truncated, and
    the first paragraph is always kept.  Work is bounded (huge inputs stay fast)."""
    droppable: list[int] = []  # paragraph starts, last paragraph first
    cut = len(lines)
    while len(droppable) < _MAX_TRIM_PARAGRAPHS:
        last = cut - 1
        while last >= 0 and not lines[last].strip():
            last -= 1
        start = last
        while start > 0 and lines[start - 1].strip():
            start -= 1
        if start <= 0 or lines[start][0] in " \t":
            break
        paragraph = "\n".join(lines[start : last + 1])
        if len(paragraph) > _MAX_TRIM_PARAGRAPH_CHARS or _parses(paragraph):
            break
        droppable.append(start)
        cut = start
    if not droppable:
        return lines, []
    tries = droppable[:_MAX_TRIM_FULL_PARSES]
    if droppable[-1] not in tries:
        tries.append(droppable[-1])
    for cut in tries:
        if _parses(_clean_code(lines[:cut])):
            return lines[:cut], lines[cut:]
    return lines, []


# ---------------------------------------------------------------------------------------------
# think sections and fences
# ---------------------------------------------------------------------------------------------


def _split_think(text: str) -> tuple[str, str]:
    """Split *text* into (answer, think) where think is the joined ``<think>`` contents."""
    answer: list[str] = []
    think: list[str] = []
    pos = 0
    first_open = _THINK_OPEN.search(text)
    orphan = _THINK_ORPHAN_CLOSE.search(text)
    if orphan and (first_open is None or orphan.start() < first_open.start()):
        # "<think>" was part of the prompt/template: the text starts inside a think section.
        think.append(text[: orphan.start()])
        pos = orphan.end()
    while True:
        opened = _THINK_OPEN.search(text, pos)
        if opened is None:
            answer.append(text[pos:])
            break
        answer.append(text[pos : opened.start()])
        closed = _THINK_CLOSE.search(text, opened.end())
        if closed is None:  # ran out of tokens while thinking
            think.append(text[opened.end() :])
            break
        think.append(text[opened.end() : closed.start()])
        pos = closed.end()
    return "".join(answer), "\n\n".join(think)


def _strip_indent(line: str, width: int) -> str:
    i = 0
    while i < width and i < len(line) and line[i] in " \t":
        i += 1
    return line[i:]


def _scan_fences(text: str) -> list[_Block]:
    """Fenced blocks of *text* (already ``\n``-normalised), in order."""
    lines = text.split("\n")
    if "```" not in text and "~~~" not in text:
        return []
    # Only lines that start (after indentation) with ``` or ~~~ can open or close a fence; find
    # the candidates with a cheap comprehension, so the loop below only visits those lines.
    marks: list[tuple[int, str, str, str]] = []  # (line index, indent, fence, info)
    for i in [i for i, line in enumerate(lines) if "``" in line or "~~" in line]:
        m = _FENCE_LINE.match(lines[i])
        if m is not None:
            indent, fence, info = m.groups()
            marks.append((i, indent, fence, info.strip()))
    blocks: list[_Block] = []
    n = len(lines)
    k = 0
    while k < len(marks):
        i, indent, fence, info = marks[k]
        k += 1
        if fence[0] == "`" and "`" in info:
            continue  # inline code such as ```x```, not a fence
        width = len(indent)  # strip up to this many leading blanks from each content line
        tag = _INFO_TAG.match(info).group(1).lower() if info else ""
        tag = "python" if tag in _PY_TAGS else (tag or "untagged")
        end = n
        terminated = False
        while k < len(marks):
            j, _, close, close_info = marks[k]
            k += 1
            if not close_info and close[0] == fence[0] and len(close) >= len(fence):
                end = j
                terminated = True
                break
        content = lines[i + 1 : end]
        if width:
            content = [_strip_indent(line, width) for line in content]
        blocks.append(_Block(i, end + 1 if terminated else n, tag, content, terminated))
    return blocks


def _cut_at_hint(lines: list[str]) -> tuple[list[str], list[str]]:
    """For unfenced code that does not parse: cut before the first ``HINT:``-style line or
    ``<hint>`` tag that comes after the first Env class line (a model's trailing hint)."""
    seen_class = False
    for i, line in enumerate(lines):
        if not seen_class:
            seen_class = _ENV_CLASS_RE.match(line) is not None
            continue
        if _HINT_LINE.match(line) or line.lstrip().lower().startswith("<hint>"):
            if any(part.strip() for part in lines[:i]):
                return lines[:i], lines[i:]
    return lines, []


def _block_code(raw: str) -> tuple[str, bool]:
    """The block's code (dedented, cleaned) and whether dedenting changed it."""
    body = raw.lstrip("\n")
    if body[:1] not in (" ", "\t"):  # first line at column 0: dedent would be a no-op
        return _clean_code(raw.split("\n")), False
    dedented = textwrap.dedent(raw)
    return _clean_code(dedented.split("\n")), dedented != raw


# ---------------------------------------------------------------------------------------------
# finding the code in one piece of text (answer or think)
# ---------------------------------------------------------------------------------------------


def _blank(lines: list[str], blocks: list[_Block]) -> list[str]:
    """A copy of *lines* with the lines of *blocks* (fences included) replaced by ``""``."""
    outside = list(lines)
    for block in blocks:
        outside[block.start : block.end] = [""] * (block.end - block.start)
    return outside


def _is_text_block(block: _Block) -> bool:
    """A fenced block that holds prose rather than code: a text-like tag (``text``, ``md``...),
    or an untagged block whose first line is a hint marker (``HINT: ...``, ``<hint>``)."""
    if block.tag in _TEXT_TAGS:
        return True
    if block.tag != "untagged":
        return False
    first = next((line for line in block.content if line.strip()), "")
    return bool(_HINT_LINE.match(first) or first.lstrip().lower().startswith("<hint>"))


def _prose(lines: list[str], blocks: list[_Block], chosen: _Block | None) -> list[str]:
    """The lines searched for a hint: code blocks (and *chosen*) are replaced by one
    :data:`_BLOCK_MARK` line plus blank lines, so a hint paragraph never runs across them and a
    lone ``## Hint`` heading does not grab a paragraph that follows a code block.  Text blocks
    keep their content (only their fence lines are blanked)."""
    prose = list(lines)
    for block in blocks:
        size = block.end - block.start
        if block is not chosen and _is_text_block(block):
            prose[block.start] = ""
            prose[block.start + 1 : block.start + 1 + len(block.content)] = block.content
            if block.terminated:
                prose[block.end - 1] = ""
        else:
            prose[block.start : block.end] = [_BLOCK_MARK] + [""] * (size - 1)
    return prose


def _find_code(text: str) -> _Found:
    if not text.strip():
        raise _Failure("empty", "the text is empty")
    lines = text.split("\n")
    blocks = _scan_fences(text)
    outside = _blank(lines, blocks)  # the text with every fenced block blanked out

    # 1. fenced blocks ---------------------------------------------------------------------
    candidates: list[tuple[int, _Block, _Analysis, bool]] = []
    parse_budget = _MAX_CANDIDATE_PARSES  # bounds the work on degenerate, repetitive output
    for index, block in enumerate(blocks):
        raw = "\n".join(block.content)
        if "Env" not in raw or "class" not in raw:
            continue  # cannot define an Env class: skip dedent and analysis
        code, dedented = _block_code(raw)
        if not code:
            continue
        analysis = _analyse(code, parse=parse_budget > 0)
        parse_budget -= analysis.parses is not None
        if analysis.env_classes:
            candidates.append((index, block, analysis, dedented))

    if candidates:
        index, block, analysis, dedented = max(
            candidates,
            key=lambda c: (
                c[2].parses is not False,
                len(c[2].env_classes) == 1,
                len(c[2].code),
                c[0],
            ),
        )
        if analysis.parses is None:  # skipped for the parse budget: judge the chosen one fully
            analysis = _analyse(analysis.code)
        notes: list[str] = []
        code_lines = analysis.code.split("\n")
        after_extra = ""
        if not block.terminated:
            notes.append(
                "unterminated_fence: the last code fence is not closed; took the rest of the text"
            )
            if analysis.parses is False:
                kept, dropped = _trim_trailing_prose(code_lines)
                if dropped:
                    analysis = _analyse(_clean_code(kept))
                    after_extra = "\n".join(dropped)
                    notes.append(
                        "trailing_text_trimmed: dropped prose after the unterminated code"
                    )
        if dedented:
            notes.append("dedented: removed common indentation from the code block")
        if len(candidates) > 1:
            notes.append(
                f"multiple_env_blocks: {len(candidates)} code blocks define Env classes; chose "
                f"block {index + 1} of {len(blocks)} ({', '.join(analysis.env_classes)}; "
                f"{'does not parse' if analysis.parses is False else 'parses'}, "
                f"{len(analysis.code)} chars)"
            )
        others = sum(1 for b in blocks if b is not block and b.content)
        if others:
            notes.append(f"ignored_blocks: ignored {others} other code block(s)")
        prose = _prose(lines, blocks, block)
        before = "\n".join(prose[: block.start])
        after_text = "\n".join(prose[block.end :])
        if after_extra:
            after_text = after_extra + "\n" + after_text
        return _Found(analysis.code, analysis, f"fenced:{block.tag}", before, after_text, notes)

    # 2. unfenced code ---------------------------------------------------------------------
    outside_text = "\n".join(outside)
    first_code = _CODE_START.search(outside_text)
    start = outside_text.count("\n", 0, first_code.start()) if first_code else None
    has_code = start is not None or any(b.content and "".join(b.content).strip() for b in blocks)

    whole: _Analysis | None = None
    if not blocks:
        whole = _analyse(_clean_code(outside))
        if whole.env_classes and whole.parses:
            return _Found(whole.code, whole, "whole_text", "", "", [])

    if start is not None:
        segment = outside[start:]
        code = _clean_code(segment)
        analysis = whole if whole is not None and whole.code == code else _analyse(code)
        if analysis.env_classes:
            notes = []
            kept = segment
            if analysis.parses is False:
                kept, dropped = _trim_trailing_prose(segment)
                if not dropped:
                    kept, dropped = _cut_at_hint(segment)
                if dropped:
                    analysis = _analyse(_clean_code(kept))
                    notes.append("trailing_text_trimmed: dropped prose after the code")
            if any(line.strip() for line in outside[:start]):
                notes.insert(0, "leading_text_skipped: dropped text before the first code line")
            method = "whole_text" if not blocks and not notes else "unfenced"
            prose = _prose(lines, blocks, None)
            before = "\n".join(prose[:start])
            after = "\n".join(prose[start + len(kept) :])
            return _Found(analysis.code, analysis, method, before, after, notes)

    if has_code:
        raise _Failure(
            "no_env_class",
            "found code but no top-level class whose name ends in 'Env'",
        )
    raise _Failure("no_code", "found no code block and no Python-looking code")


# ---------------------------------------------------------------------------------------------
# hints
# ---------------------------------------------------------------------------------------------

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
