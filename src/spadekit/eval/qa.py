"""``qa:FILE``: single-answer questions from a JSONL file (AIME-style math, GPQA-style choice).

One object per line: ``{"question", "answer"}`` (math, scored with math-verify) or
``{"question", "choices", "answer"}`` (the answer a letter, a 0-based index or a choice's text);
``problem`` aliases ``question``; optional ``id`` and ``dataset``. A bad line, a duplicate id or
choice, or an unparsable math answer raises :class:`EvalError` naming file and line. The
committed answer is :func:`final_answer` (last ``<answer>``, else last ``\\boxed{}``); a reply
without one, or one longer than ``MAX_ANSWER_CHARS``, scores 0. Math compares
``verify(parse(gold), parse(answer))``; choice accepts the letter (``B``, ``(B)``, ``B.``...),
``B) <its text>`` or exactly one choice's text. Default Avg@32. Details: docs/design/eval.md.
"""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path
from typing import Any, NoReturn

from spadekit.common import safe_json
from spadekit.eval.base import EvalError, EvalItem, Suite, SuiteDefaults, final_answer, safe_score

MAX_ANSWER_CHARS = 1000
MATH_TIMEOUT_S = 5
QA_SYSTEM = (
    "Answer the question. Think step by step if it helps, then give only your final answer inside "
    "<answer>...</answer> (or \\boxed{...}): a number or expression for a math problem, the "
    "letter of the correct option for a multiple-choice question. Only the last one counts.")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_REPAIR = str.maketrans({"\x0c": "\\f", "\x08": "\\b"})
_BARE_LETTER = re.compile(r"\(?([A-Z])\)?[.:]?")
_LETTER_TEXT = re.compile(r"\(?([A-Z])[).:]\s*(.+)", re.DOTALL)
_WRAPPED = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}|\*\*(.*)\*\*", re.DOTALL)
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)


def repair_escapes(text: str) -> str:
    """Undo JSON-escape damage: a form feed back to ``\\f``, a backspace back to ``\\b``."""
    return text.translate(_REPAIR)


class QASuite(Suite):
    """Questions with one gold answer each, read from a JSONL file (see the module docstring)."""

    defaults = SuiteDefaults(k=32, temperature=0.6, top_p=0.95, max_new_tokens=8192,
                             max_turns=1, system_prompt=QA_SYSTEM)
    """Avg@32 at temperature 0.6, as the paper reports AIME; ``--k`` overrides ``k``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"qa:{path}"

    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        if limit is not None and limit < 0:
            raise EvalError(f"limit must be >= 0, got {limit}")
        items, per_dataset = [], {}
        for item in self._read_all():
            count = per_dataset.get(item.dataset, 0)
            if limit is None or count < limit:
                items.append(item)
            per_dataset[item.dataset] = count + 1
        return items

    def groups(self) -> dict[str, str]:
        return {item.dataset: item.group for item in self._read_all()}

    def score(self, item: EvalItem, completion: Any) -> float:
        return safe_score(lambda: _score(item, completion))

    def gold_completion(self, item: EvalItem) -> str:
        """A reply that scores 1 for ``item``."""
        return f"The answer follows.\n<answer>{item.answer}</answer>"

    # -- reading -------------------------------------------------------------------------------

    def _read_all(self) -> list[EvalItem]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvalError(f"cannot read QA file {self.path}: {exc}",
                            path=str(self.path)) from None
        items, seen = [], {}
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            item = self._parse_line(line, line_no)
            if item.id in seen:
                self._fail(line_no, f"duplicate id {item.id!r} (first on line {seen[item.id]})")
            seen[item.id] = line_no
            items.append(item)
        if not items:
            raise EvalError(f"QA file {self.path} has no items", path=str(self.path))
        return items

    def _fail(self, line_no: int, message: str) -> NoReturn:
        raise EvalError(f"{self.path}, line {line_no}: {message}", path=str(self.path),
                        line=line_no)

    def _parse_line(self, line: str, line_no: int) -> EvalItem:
        try:  # the hardened decoder: no NaN/Infinity, bounded nesting
            row = safe_json.loads(line)
        except safe_json.UntrustedJsonError as exc:
            self._fail(line_no, exc.detail)
        if not isinstance(row, dict):
            self._fail(line_no, "each line must be a JSON object")
        question = row.get("question", row.get("problem"))
        if not isinstance(question, str) or not question.strip():
            self._fail(line_no, "missing 'question' (or 'problem'): a non-empty string")
        question = repair_escapes(question).strip()
        if "answer" not in row or row["answer"] is None:
            self._fail(line_no, "missing 'answer'")
        stem = self.path.stem
        dataset = row.get("dataset", stem)
        if not isinstance(dataset, str) or not dataset.strip():
            self._fail(line_no, "'dataset' must be a non-empty string")
        raw_id = row.get("id", f"{stem}/{line_no}")
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or str(raw_id) == "":
            self._fail(line_no, "'id' must be a non-empty string or an integer")
        if "choices" in row:
            prompt, answer, data = self._choice(row, question, line_no)
        else:
            prompt, answer, data = question, self._math_answer(row["answer"], line_no), {}
            data["kind"] = "math"
        data["line"] = line_no
        return EvalItem(id=str(raw_id), dataset=dataset, group=dataset, prompt=prompt,
                        answer=answer, data=data)

    def _math_answer(self, raw: Any, line_no: int) -> str:
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            self._fail(line_no, "'answer' must be a string or a number")
        gold = repair_escapes(str(raw)).strip()
        if not gold:
            self._fail(line_no, "'answer' is empty")
        try:
            parsed = _parse_math(gold)
        except ImportError:
            raise EvalError("QA math scoring needs math-verify: "
                            "pip install 'math-verify[antlr4_13_2]'") from None
        if not parsed:
            self._fail(line_no, f"math-verify cannot parse the answer {gold!r}")
        return gold

    def _choice(self, row: dict, question: str, line_no: int) -> tuple[str, str, dict]:
        choices = row["choices"]
        if not isinstance(choices, list) or not choices:
            self._fail(line_no, "'choices' must be a non-empty list")
        if len(choices) > len(LETTERS):
            self._fail(line_no, f"at most {len(LETTERS)} choices")
        if not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices):
            self._fail(line_no, "each choice must be a string or a number")
        choices = [repair_escapes(str(c)).strip() for c in choices]
        keys = [_norm(c) for c in choices]
        if "" in keys or len(set(keys)) != len(keys):
            self._fail(line_no, "choices must be non-empty and distinct")
        letters = LETTERS[:len(choices)]
        raw = row["answer"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            if not 0 <= raw < len(choices):
                self._fail(line_no, f"answer index {raw} out of range 0..{len(choices) - 1}")
            letter = letters[raw]
        elif isinstance(raw, str) and len(raw.strip()) == 1 and raw.strip().isalpha():
            letter = raw.strip().upper()
            if letter not in letters:
                self._fail(line_no, f"answer letter {letter!r} out of range A..{letters[-1]}")
        elif isinstance(raw, str) and _norm(repair_escapes(raw)) in keys:
            letter = letters[keys.index(_norm(repair_escapes(raw)))]
        else:
            self._fail(line_no, f"answer {raw!r} is not a letter, a 0-based index or a choice")
        lines = [question, ""] + [f"{l}) {c}" for l, c in zip(letters, choices)]
        lines += ["", f"Answer with the letter of the correct choice ({letters[0]}-{letters[-1]})."]
        return "\n".join(lines), letter, {"kind": "choice", "choices": choices, "letter": letter}


# -- scoring ------------------------------------------------------------------------------------

def _score(item: EvalItem, completion: Any) -> float:
    text = _committed_answer(completion)
    if text is None:
        return 0.0
    text = text.strip()
    if not text or len(text) > MAX_ANSWER_CHARS:
        return 0.0
    kind = item.data.get("kind")
    if kind == "choice":
        return float(_choice_letter(text, item.data["choices"]) == item.data["letter"])
    if kind == "math":
        return float(_math_equal(str(item.answer), text))
    return 0.0


def _committed_answer(text: Any) -> str | None:
    """:func:`final_answer`, guarded against its quadratic scan of unclosed ``<answer>`` tags
    (which takes seconds on 100 kB): text after the last ``</answer>`` cannot hold a tagged
    answer, and with no closing tag at all only the boxes count."""
    if not isinstance(text, str):
        return None
    end = text.lower().rfind("</answer>")
    if end >= 0:
        return final_answer(text[:end + len("</answer>")])
    return final_answer(_OPEN_TAG.sub("", text))


def _norm(text: str) -> str:
    """Choice-text comparison key: case, spacing, surrounding ``$`` and a final period ignored."""
    return " ".join(text.split()).strip("$ ").rstrip(".").strip().casefold()


def _choice_letter(text: str, choices: list[str]) -> str | None:
    """The letter a committed answer names under the strict rules, or None."""
    for _ in range(3):
        wrapped = _WRAPPED.fullmatch(text)
        if not wrapped:
            break
        text = (wrapped.group(1) if wrapped.group(1) is not None else wrapped.group(2)).strip()
    letters = LETTERS[:len(choices)]
    bare = _BARE_LETTER.fullmatch(text)
    if bare:
        return bare.group(1) if bare.group(1) in letters else None
    keys = [_norm(c) for c in choices]
    if _norm(text) in keys:
        return letters[keys.index(_norm(text))]
    labelled = _LETTER_TEXT.fullmatch(text)
    if labelled and labelled.group(1) in letters:
        index = letters.index(labelled.group(1))
        if _norm(labelled.group(2)) == keys[index]:
            return labelled.group(1)
    return None


def _timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which raises outside the main thread."""
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_math(text: str) -> tuple:
    """math-verify's parse of ``\\boxed{text}``: the box makes it read the whole answer as one
    expression instead of hunting for the last number in it."""
    from math_verify import parse

    return tuple(parse("\\boxed{" + text + "}", parsing_timeout=_timeout()))


def _math_equal(gold: str, answer: str) -> bool:
    from math_verify import verify

    gold_parsed, answer_parsed = _parse_math(gold), _parse_math(answer)
    if not gold_parsed or not answer_parsed:
        return False
    return bool(verify(list(gold_parsed), list(answer_parsed), timeout_seconds=_timeout()))
