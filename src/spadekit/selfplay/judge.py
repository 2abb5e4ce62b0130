"""The policy as judge: an optional validation stage after the mechanical checks.

A program that passed every sandbox stage is shown to a policy, asked whether it has a *fatal*
bug (unplayable, or its reward meaningless; difficulty is never a reason). The reply ends with
``VERDICT: ACCEPT`` or ``VERDICT: REJECT: <reason>``; :func:`parse_judgement` reads the last such
line (after ``<think>`` blocks). No verdict, or a failed call, counts as accept. Judge
generations are never trained. ``designer.judge``: ``auto`` (on for tool use), ``on``, ``off``.
"""

from __future__ import annotations

import re

__all__ = ["JUDGE_MODES", "build_judge_messages", "judge_enabled", "parse_judgement",
           "parse_verdict"]

JUDGE_MODES = ("auto", "on", "off")
MAX_JUDGE_CODE_CHARS = 16000

_SYSTEM = (
    "You review the source code of text environments that will be used to train an AI agent. "
    "Each program has already passed automatic checks: it loads, runs deterministically, its "
    "solution() wins and random moves do not. Your only job is to catch FATAL bugs that those "
    "checks miss, for example: the rules shown to the player contradict what step() actually "
    "rewards; the observation never gives the player the information needed to act; the reward "
    "is granted or withheld regardless of what the player does; a correct answer in the stated "
    "format is parsed wrongly. Never reject a program for being too easy, too hard, long, "
    "unusual or unpolished: difficulty is somebody else's concern. When in doubt, accept. "
    "Think briefly, then end your reply with exactly one final line, either\n"
    "VERDICT: ACCEPT\n"
    "or\n"
    "VERDICT: REJECT: <the fatal bug in one sentence>")

_FORMATS = {
    "games": "The player answers each turn with a command written as \\boxed{command}.",
    "tooluse": ("The player calls tools as <tool_call>{\"name\": ..., \"arguments\": {...}}"
                "</tool_call> and finishes with <answer>done</answer>."),
}


def judge_enabled(mode: str | bool, setting: str) -> bool:
    """``auto``: on for tool use, off for games; ``on``/``off`` (or YAML's true/false) as said."""
    if isinstance(mode, bool):
        return mode
    mode = str(mode).strip().lower()
    if mode not in JUDGE_MODES:
        raise ValueError(f"designer.judge must be one of {JUDGE_MODES}, got {mode!r}")
    if mode == "auto":
        return setting == "tooluse"
    return mode == "on"


def build_judge_messages(code: str, setting: str) -> list[dict[str, str]]:
    """System + user messages asking for a verdict on one program."""
    code = code.strip()
    if len(code) > MAX_JUDGE_CODE_CHARS:
        code = code[:MAX_JUDGE_CODE_CHARS] + "\n# ... (cut)"
    user = (f"Setting: {setting}. {_FORMATS.get(setting, '')}\n\n"
            f"Environment program:\n```python\n{code}\n```\n\n"
            "Does this program have a fatal bug that makes it unplayable or its reward "
            "meaningless? Reject only for such a bug, never for difficulty. Finish with the "
            "VERDICT line.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


_THINK = re.compile(r"<(think|thinking)>.*?(</\1>|\Z)", re.IGNORECASE | re.DOTALL)
_VERDICT = re.compile(r"verdict[ \t*_]*[:\uff1a][ \t*_]*(accept|reject)\b[ \t*_]*"
                      r"(?:[:\-\u2013\u2014][ \t]*)?([^\n]*)", re.IGNORECASE)


def parse_judgement(text: str | None) -> tuple[str | None, str]:
    """``(verdict, reason)`` from a judge reply: the last ``VERDICT:`` line wins; ``verdict`` is
    ``"accept"``, ``"reject"`` or ``None`` (no verdict found: treat as accept)."""
    if not text:
        return None, ""
    matches = list(_VERDICT.finditer(_THINK.sub("", str(text))))
    if not matches:
        return None, ""
    last = matches[-1]
    reason = last.group(2).strip().strip("*_ ").strip()
    return last.group(1).lower(), reason[:500]


def parse_verdict(text: str | None) -> str | None:
    """``"accept"``, ``"reject"`` or ``None`` (no parseable verdict)."""
    return parse_judgement(text)[0]
