"""What a round's table says beyond its numbers: why an update was empty, and the one line a
run ends with (what changed between its first and last round).

An update is empty when the trainer made no optimizer step; the reason comes from the round's
metrics: no samples at all (no episode was played, or every one failed), every sample dropped
by the trainer (no behaviour logprobs, masked truncations, nothing sampled), or every advantage
zero: each GRPO group tied (for a small model, most often every play returned 0, because
no reply held a command the game accepts; the format aids in ``rollout`` are the remedy).
"""

from __future__ import annotations

from typing import Any, Sequence


def empty_update_reason(m: dict[str, Any]) -> str | None:
    """Why round ``m``'s update changed no weight, or None when it did."""
    if m.get("train/optimizer_steps", 0) and m.get("train/optimizer_steps") > 0:
        return None
    total = m.get("train/num_samples", 0) or 0
    if not total:
        return "no samples (no episode played, or every episode failed)"
    trained = m.get("train/num_samples_trained", 0) or 0
    if not trained:
        dropped = {k: int(m.get(f"train/{k}", 0) or 0)
                   for k in ("dropped_no_logprobs", "dropped_truncated", "dropped_empty")}
        parts = ", ".join(f"{k.removeprefix('dropped_')} {v}" for k, v in dropped.items() if v)
        return f"every sample dropped by the trainer ({parts or 'none kept'})"
    agent_mean = m.get("agent_mean_return")
    if agent_mean == 0 and m.get("agent_win_rate", 0) == 0:
        return ("every advantage zero: each group tied, every agent play returned 0 (no reply "
                "scored; check rollout.response_prefix / demonstrations)")
    return "every advantage zero: each environment's plays tied (no preference to learn)"


def summary_line(history: Sequence[dict[str, Any]]) -> str:
    """One line: the agent's mean return, win rate and non-zero-advantage share in the first
    and last round, the designer's valid share (SPADE curriculum), and how many updates were
    empty."""
    if not history:
        return "no round was played"
    first, last = history[0], history[-1]

    def pct(m: dict, key: str) -> str:
        v = m.get(key)
        return f"{v:.0%}" if isinstance(v, (int, float)) else "-"

    def num(m: dict, key: str) -> str:
        v = m.get(key)
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"

    empty = sum(1 for m in history if empty_update_reason(m))
    span = f"rounds {first['step']}..{last['step']}"
    text = (f"what changed ({span}): agent return {num(first, 'agent_mean_return')} -> "
            f"{num(last, 'agent_mean_return')}, win {pct(first, 'agent_win_rate')} -> "
            f"{pct(last, 'agent_win_rate')}, non-zero advantages "
            f"{pct(first, 'agent_nonzero_advantage_share')} -> "
            f"{pct(last, 'agent_nonzero_advantage_share')}")
    valid = [m["valid_share"] for m in history if isinstance(m.get("valid_share"), (int, float))]
    if valid:
        text += f", designer valid share {valid[0]:.0%} -> {valid[-1]:.0%}"
    return text + f"; empty updates {empty} of {len(history)}"
