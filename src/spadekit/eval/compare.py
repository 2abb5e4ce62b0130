"""Compare evaluation results: side-by-side metrics with deltas, and head-to-head win rates.

Inputs are ``spadekit eval --out`` files. For each suite both hold, every group (optionally
dataset) gets A's and B's ``win_rate`` and ``mean_score`` and B - A. Head-to-head counts, over
items both scored (by id), A's wins, losses and ties; B's head-to-head win rate is ``(B better +
ties / 2) / items``. :func:`corpus_note` says when two self-play evaluations record different
default corpora (their designers were grounded on different documents).
"""

from __future__ import annotations

import gzip
import json
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


def results_file(model: str, results: list[dict[str, Any]], *,
                 source: str | Path | None = None) -> dict[str, Any]:
    """The file's contents; ``source`` (what was evaluated: a model spec, a run or checkpoint
    directory) adds the run's ``corpus`` when it names a run that pinned one."""
    data: dict[str, Any] = {"format": FILE_FORMAT, "model": model,
                            "suites": {r["suite"]: r for r in results}}
    corpus = run_corpus_record(source) if source is not None else None
    if corpus is not None:
        data["corpus"] = corpus
    return data


#: A run's pinned default corpus (``spadekit.selfplay.corpus_pin.PIN_NAME``, a layer above).
PINNED_CORPUS = "corpus.jsonl.gz"


def run_corpus_record(source: str | Path) -> dict[str, Any] | None:
    """``{"name", "digest", "documents"}`` of the default corpus pinned by the run that
    ``source`` names (a run directory, or a checkpoint ``RUN/checkpoints/step-N`` in one), read
    from the pinned file's header line; None when there is none or it does not read."""
    path = Path(source).expanduser()
    if not path.is_dir():
        return None
    for run_dir in (path, path.parent.parent):
        pinned = run_dir / PINNED_CORPUS
        if not pinned.is_file():
            continue
        try:
            with gzip.open(pinned, "rb") as fh:
                header = json.loads(fh.readline(1 << 20))
        except (OSError, EOFError, ValueError, RecursionError):
            return None
        if isinstance(header, dict) and isinstance(header.get("digest"), str):
            return {"name": str(header.get("name")), "digest": header["digest"],
                    "documents": header.get("documents")}
        return None
    return None


def corpus_note(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """A line saying that A's and B's runs were grounded on different default corpora, when
    both files record one and the digests differ; None otherwise."""
    da, db = (f["corpus"].get("digest") if isinstance(f.get("corpus"), dict) else None
              for f in (a, b))
    if not (isinstance(da, str) and isinstance(db, str)) or da == db:
        return None
    return (f"note: the two runs were grounded on different default corpora (digest "
            f"{da[:12]}... vs {db[:12]}...)")


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
