"""What a round's table says beyond its numbers: why an update was empty, and the lines a
run ends with (what changed between its first and last round, and the designed games it
pooled: :func:`designed_games`, read from the run database).

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


def designed_games(store: Any, since_step: int = 0) -> list[dict[str, Any]]:
    """The environments the designer wrote from round ``since_step`` on, in order: class
    name, skill, status, kit composition (None for a whole program), plays and mean return
    without and with the hint (from the ``plays`` table), and the memory's regret and
    designer reward (None until known)."""
    from spadekit.selfplay.kit_identity import kit_identity

    rows = store.query(
        "SELECT e.sha256, e.class_name, e.skill, e.status, e.code, e.created_step, "
        "m.regret, m.designer_reward FROM environments e LEFT JOIN memory m "
        "ON m.sha256 = e.sha256 WHERE e.source LIKE 'designer:%' AND e.created_step >= ? "
        "ORDER BY e.rowid", (since_step,))
    out = []
    for row in rows:
        stats = {}
        for hint in (0, 1):
            n, mean = store.query("SELECT COUNT(*), AVG(episode_return) FROM plays WHERE "
                                  "env_sha = ? AND with_hint = ? AND failure IS NULL",
                                  (row["sha256"], hint))[0]
            stats[hint] = (n, mean)
        ident = kit_identity(row["code"])
        out.append({"sha256": row["sha256"], "class_name": row["class_name"],
                    "skill": row["skill"], "status": row["status"],
                    "step": row["created_step"],
                    "composition": ident.composition if ident else None,
                    "plays": stats[0][0], "plays_with_hint": stats[1][0],
                    "return": stats[0][1], "return_with_hint": stats[1][1],
                    "regret": row["regret"], "designer_reward": row["designer_reward"]})
    return out


def designed_games_line(games: Sequence[dict[str, Any]], limit: int = 8) -> str:
    """One line naming the designed games pooled, each with its mean return without -> with
    the hint, regret and designer reward (``-`` while unknown)."""
    if not games:
        return "designed games pooled: none"

    def num(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, (int, float)) else "-"

    items = [f"{g['class_name']} ({g['composition'] or 'whole program'}; return "
             f"{num(g['return'])} -> {num(g['return_with_hint'])} with hint, regret "
             f"{num(g['regret'])}, designer reward {num(g['designer_reward'])})"
             for g in games[:limit]]
    more = f", and {len(games) - limit} more" if len(games) > limit else ""
    return f"designed games pooled: {len(games)}: " + ", ".join(items) + more
