"""Repair turns: inference-only retries for a designer program that failed validation.

The repair prompt is the designer's conversation, its failed output, and a user turn with the
validation report (cut to ``MAX_REPORT_CHARS``) asking for a corrected program; the reply is
validated like any designer output. The designer trains on its FIRST attempt only, which keeps
its fixed invalid reward; repair generations never enter the delay buffer. A repaired program
enters the pool with ``lineage["repaired"]`` and ``validation["repaired"]``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_OUTPUT_CHARS", "MAX_REPORT_CHARS", "REPAIR_MARK", "build_repair_messages"]

MAX_REPORT_CHARS = 1500
MAX_OUTPUT_CHARS = 16000
REPAIR_MARK = "Your program did not pass the automatic validation"


def _field(report: Any, name: str) -> Any:
    if isinstance(report, dict):
        return report.get(name)
    return getattr(report, name, None)


def build_repair_messages(messages: list[dict[str, str]], failed_output: str, report: Any
                          ) -> list[dict[str, str]]:
    """The designer conversation + the failed output + the validation report, asking for a
    corrected complete program in the designer's output format."""
    output = str(failed_output or "")
    if len(output) > MAX_OUTPUT_CHARS:
        output = output[:MAX_OUTPUT_CHARS] + "\n... (cut)"
    message = str(_field(report, "message") or "").strip()
    if len(message) > MAX_REPORT_CHARS:
        message = message[:MAX_REPORT_CHARS] + " ... (cut)"
    stage = _field(report, "stage") or "unknown"
    reason = _field(report, "reason") or "unknown"
    user = (f"{REPAIR_MARK}.\n"
            f"Failed stage: {stage}\n"
            f"Reason code: {reason}\n"
            f"Report: {message or '(no message)'}\n\n"
            "Fix the problem the report describes and keep the environment's idea. Reply with "
            "the corrected COMPLETE program in one ```python block (not a diff, not only the "
            "changed lines), then the HINT: line.")
    return list(messages) + [{"role": "assistant", "content": output},
                             {"role": "user", "content": user}]
