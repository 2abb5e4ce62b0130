"""Locating the program's code in one piece of model output, for :mod:`spadekit.envs.extract`.

``_split_think`` separates ``<think>`` sections from the answer; ``_find_code`` finds the code of
one environment program in a piece of text (fenced blocks first, then unfenced code) and returns
it with the prose before and after it (searched for the hint by :mod:`spadekit.envs.hints`), or
raises ``ExtractionError``. Rules: docs/design/envs.md. Code is parsed with :mod:`ast` at most,
never executed. Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap

from spadekit.envs import pyparse
from spadekit.envs.extract_errors import ExtractionError
from spadekit.envs.hint_patterns import _BLOCK_MARK, _HINT_LINE

# -- patterns ---------------------------------------------------------------------------------

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

#: Trailing-paragraph trimming is bounded so pathological inputs stay fast.
_MAX_TRIM_PARAGRAPHS = 200
_MAX_TRIM_PARAGRAPH_CHARS = 20_000
_MAX_TRIM_FULL_PARSES = 5
#: Code longer than this is not parsed (``ast.parse`` runs at roughly 1 MB/s); Env classes are
#: then found by regex and the note ``unchecked_syntax`` is added.
_MAX_PARSE_CHARS = 200_000
#: At most this many fenced blocks are parsed per text (the rest are judged by regex).
_MAX_CANDIDATE_PARSES = 50


# -- small data holders -----------------------------------------------------------------------


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


# -- analysis helpers -------------------------------------------------------------------------


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
        tree = pyparse.parse(code)
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
        pyparse.parse(code)
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


# -- think sections and fences ----------------------------------------------------------------


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


# -- finding the code in one piece of text (answer or think) ----------------------------------


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
        raise ExtractionError("empty", "the text is empty")
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
        raise ExtractionError(
            "no_env_class",
            "found code but no top-level class whose name ends in 'Env'",
        )
    raise ExtractionError("no_code", "found no code block and no Python-looking code")
