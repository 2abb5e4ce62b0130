"""Repair turns: inference-only retries for a designer program that failed validation.

The repair prompt is the designer's own conversation, its failed output as the assistant turn,
and a user turn holding the validation report (stage, reason code, message, cut to
``MAX_REPORT_CHARS``) that asks for a corrected, complete program. The reply is validated again
like any designer output.

Training (SPEC point 3): the designer trains on its FIRST attempt only. That attempt was invalid,
so its delayed sample keeps the fixed invalid reward (0, or -0.5 for a hang) even when a repair
succeeds; repair generations are never put in the delay buffer. A repaired program that passes
enters the pool with ``lineage["repaired"] = {"attempts": n, "first_reason": ..., "first_stage":
...}`` and the same mark in its validation summary (``validation["repaired"]``, stored in the
environments and memory tables without a schema change).
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
