"""Compare evaluation results: side-by-side metrics with deltas, and head-to-head win rates.

Input files are what ``spadekit eval --out`` writes (``{"format": ..., "model": ..., "suites":
{name: result}}``). For each suite both files hold, every group (and optionally dataset) gets a
row with A's and B's ``win_rate`` and ``mean_score`` and B - A. Head-to-head counts, over the items
both results scored (matched by item id), how often A's item score beats B's, loses, or ties; the
head-to-head win rate of B is ``(B better + ties / 2) / items``, the paper-style pairwise metric.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spadekit.common import safe_json
from spadekit.eval.base import EvalError
from spadekit.eval.runner import RESULT_FORMAT, aggregate

FILE_FORMAT = "spadekit-eval-file/1"


def read_results(path: str | Path) -> dict[str, Any]:
    """A results file, checked; ``EvalError`` if it is missing, not JSON, or not ours."""
    path = Path(path)
    if not path.exists():
        raise EvalError(f"{path}: no such results file")
    try:  # the hardened decoder: no NaN/Infinity, bounded size and nesting
        data = safe_json.load_file(path).value
    except safe_json.UntrustedJsonError as exc:
        raise EvalError(f"{path}: not a readable JSON results file ({exc.detail})") from None
    if not isinstance(data, dict) or data.get("format") != FILE_FORMAT \
            or not isinstance(data.get("suites"), dict):
        raise EvalError(f"{path}: not a spadekit eval results file (format {FILE_FORMAT})")
    for name, result in data["suites"].items():
        if not isinstance(result, dict) or result.get("format") != RESULT_FORMAT \
                or not isinstance(result.get("items"), list):
            raise EvalError(f"{path}: suite {name!r} is not a {RESULT_FORMAT} result")
    return data


def results_file(model: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": FILE_FORMAT, "model": model,
            "suites": {r["suite"]: r for r in results}}


def head_to_head(a_items: list[dict], b_items: list[dict], eps: float = 1e-9) -> dict[str, Any]:
    """Pairwise comparison of per-item mean scores over the items both results hold."""
    a = {r["id"]: r["mean_score"] for r in a_items}
    b = {r["id"]: r["mean_score"] for r in b_items}
    common = [i for i in a if i in b]
    a_better = sum(1 for i in common if a[i] > b[i] + eps)
    b_better = sum(1 for i in common if b[i] > a[i] + eps)
    ties = len(common) - a_better - b_better
    n = len(common)
    return {"items": n, "a_better": a_better, "b_better": b_better, "ties": ties,
            "b_win_rate": (b_better + ties / 2) / n if n else None}


def compare(a: dict[str, Any], b: dict[str, Any], *, datasets: bool = False
            ) -> list[dict[str, Any]]:
    """Rows for every suite both files hold: overall, then groups (then datasets)."""
    rows = []
    for suite in [s for s in a["suites"] if s in b["suites"]]:
        ra, rb = a["suites"][suite], b["suites"][suite]
        levels = [("group", "group")] + ([("dataset", "dataset")] if datasets else [])
        keys: list[tuple[str, str | None]] = [("overall", None)]
        for level, field in levels:
            names = sorted({r[field] for r in ra["items"]} | {r[field] for r in rb["items"]})
            keys += [(level, n) for n in names]
        for level, name in keys:
            pick_a = [r for r in ra["items"] if name is None or r.get(level) == name]
            pick_b = [r for r in rb["items"] if name is None or r.get(level) == name]
            ma, mb = aggregate(pick_a), aggregate(pick_b)
            rows.append({"suite": suite, "level": level, "name": name or "overall",
                         "a_items": ma["items"], "b_items": mb["items"],
                         "a_win_rate": ma["win_rate"], "b_win_rate": mb["win_rate"],
                         "delta_win_rate": mb["win_rate"] - ma["win_rate"],
                         "a_mean_score": ma["mean_score"], "b_mean_score": mb["mean_score"],
                         "delta_mean_score": mb["mean_score"] - ma["mean_score"],
                         "head_to_head": head_to_head(pick_a, pick_b)})
    return rows


def missing_suites(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(set(a["suites"]) ^ set(b["suites"]))
