"""Run a suite with a policy: every item ``k`` times through the rollout engine, then per-item
scores and a summary per group and dataset, as one JSON-safe result.

Every sample's score is kept (``items[i].scores``). Metrics: ``mean_score`` (Avg@k),
``win_rate`` (share of samples scoring >= 1.0, averaged over items), ``pass_rate`` (pass@k),
``any_credit_rate`` (share of samples > 0) and ``failures`` (scored 0, never raised). In-process
generation calls are bounded by ``EvalSettings.max_batch_cells``. An ``envs:`` suite is screened
by the validator on the very seeds this run plays unless already screened or trusted; only valid
programs are played, the others are listed under ``invalid``, never in the summary.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from spadekit.eval.batching import DEFAULT_BATCH_CELLS, bounded
from spadekit.eval.base import WIN_THRESHOLD, EvalError, EvalItem, Suite
from spadekit.common.jsonl import JsonlAppender
from spadekit.rollout.engine import RolloutConfig, RolloutEngine, Trajectory

RESULT_FORMAT = "spadekit-eval/1"
REPLY_CHARS = 4000


@dataclass(frozen=True)
class EvalSettings:
    """Overrides of a suite's own sampling defaults (None keeps the suite's value)."""

    k: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    max_turns: int | None = None
    limit: int | None = None
    """Items per dataset."""
    seed: int = 0
    batch_size: int = 64
    """Episodes per engine call (bounds the policy's batch and memory)."""
    max_context_tokens: int | None = None
    """None: the policy's context length when it reports one, else 32768."""
    transcripts: bool = False
    """Keep every sample's whole conversation in the result (large)."""
    max_batch_cells: int | None = DEFAULT_BATCH_CELLS
    """An in-process model (``HFPolicy``) generates at most this many padded attention cells
    per call: rows x (longest prompt, in tokens)²; longer calls are split into calls of similar
    prompt length (:mod:`spadekit.eval.batching`), on every turn. The default 2**27 keeps a
    call's attention near 1 GB for ``tiny`` and 4 GB for SmolLM2-135M on a CPU; one request
    always makes a call. None or 0: calls sized by ``batch_size`` alone. Other policies (vLLM,
    a server) manage their own memory and are not split."""

    def resolve(self, suite: Suite) -> dict[str, Any]:
        d = suite.defaults
        pick = lambda mine, theirs: theirs if mine is None else mine  # noqa: E731
        out = {"k": pick(self.k, d.k), "temperature": pick(self.temperature, d.temperature),
               "top_p": pick(self.top_p, d.top_p),
               "max_new_tokens": pick(self.max_new_tokens, d.max_new_tokens),
               "max_turns": pick(self.max_turns, d.max_turns), "limit": self.limit,
               "seed": self.seed}
        if out["k"] < 1 or out["max_turns"] < 1 or out["max_new_tokens"] < 1:
            raise EvalError("k, max_turns and max_new_tokens must be >= 1")
        if self.max_batch_cells is not None and self.max_batch_cells < 0:
            raise EvalError("max_batch_cells must be >= 0 (0 or None: no bound)")
        return out


def sample_seed(base: int, item_id: str, sample: int) -> int:
    """The environment/sampling seed of one sample: stable across runs, models and batching."""
    return zlib.crc32(f"{base}:{item_id}:{sample}".encode())


class Journal:
    """Scored samples appended after every batch (JSON lines, fsynced), so a killed evaluation
    resumes where it stopped. The first line names the suite, model and settings; a journal for
    anything else is moved aside to ``<name>.stale``. A torn last line is skipped and moved to
    ``<name>.partial`` before the next append; a line the hardened decoder refuses, or that is not a
    sample's record, is skipped and that sample played again.
    """

    def __init__(self, path: str | Path, key: dict[str, Any]):
        self.path = Path(path)
        self.key = json.loads(json.dumps(key))
        self.done: dict[tuple[str, int], dict[str, Any]] = {}
        if self.path.exists():
            lines = self._read()
            header = lines[0].value if lines else None
            if not isinstance(header, dict) or header.get("key") != self.key:
                self.path.replace(self.path.with_name(self.path.name + ".stale"))
            else:
                for line in lines[1:]:
                    found = _journal_record(line.value)
                    if found is not None:
                        self.done[found[0]] = found[1]
        fresh = not self.path.exists()
        self._out = JsonlAppender(self.path)
        if fresh:
            self._out.write({"journal": 1, "key": self.key})

    def _read(self) -> list[Any]:
        from spadekit.common.jsonl import read_jsonl

        try:
            return list(read_jsonl(self.path))
        except OSError as exc:
            raise EvalError(f"cannot read the journal {self.path}: {exc}") from None

    def append(self, item_id: str, record: dict[str, Any]) -> None:
        self._out.write({"item": item_id, "sample": record["sample"], "record": record})
        self.done[(item_id, record["sample"])] = record

    def close(self) -> None:
        self._out.close()


def _journal_record(line: Any) -> tuple[tuple[str, int], dict[str, Any]] | None:
    """``((item, sample), record)`` of one journal line's value, None unless it is a scored
    sample's line (a refused line's value is None)."""
    if not isinstance(line, dict):
        return None
    item, sample, record = line.get("item"), line.get("sample"), line.get("record")
    if not isinstance(item, str) or isinstance(sample, bool) or not isinstance(sample, int) \
            or not isinstance(record, dict) or record.get("sample") != sample:
        return None
    score = record.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) \
            or not math.isfinite(score) or "failure" not in record:
        return None
    return (item, sample), record


def run_suite(policy: Any, suite: Suite, settings: EvalSettings | None = None, *,
              pool: Any = None, items: list[EvalItem] | None = None,
              on_progress: Callable[[int, int], None] | None = None,
              model_label: str | None = None,
              journal: str | Path | None = None) -> dict[str, Any]:
    """Evaluate ``policy`` on ``suite``; returns the result dict (see the module docstring).
    ``pool`` (a ``SandboxPool``) is needed only by sandboxed suites (``envs:``), which it also
    validates (unless screened or trusted already).
    ``on_progress(done_samples, total_samples)`` is called as each episode ends. ``journal``: a
    file that keeps every scored sample (see :class:`Journal`); samples already in it are not
    played again."""
    settings = settings or EvalSettings()
    cfg = settings.resolve(suite)
    t0 = time.perf_counter()
    screened = callable(getattr(suite, "screen", None))
    again = getattr(suite, "needs_screen", None)  # validated on other seeds than these
    if screened and (not suite.ready or (callable(again) and again(settings.seed, cfg["k"]))):
        suite.screen(pool, cfg["max_turns"], seed=settings.seed, limit=settings.limit,
                     samples=cfg["k"])  # untrusted programs: only validated ones are played
    if items is None:
        items = suite.load_items(settings.limit)
    if screened:
        items = [item for item in items if suite.playable(item)]
    load_s = time.perf_counter() - t0
    system = suite.defaults.system_prompt
    engine = RolloutEngine(bounded(policy, settings.max_batch_cells), pool, RolloutConfig(
        max_turns=cfg["max_turns"], max_new_tokens=cfg["max_new_tokens"],
        max_context_tokens=settings.max_context_tokens or _context_of(policy),
        temperature=cfg["temperature"], top_p=cfg["top_p"], seed=settings.seed))
    label = model_label or getattr(policy, "name", type(policy).__name__)
    book = Journal(journal, {"suite": suite.name, "model": label, "settings": cfg,
                             "items": len(items)}) if journal is not None else None
    specs = []
    samples: list[list[dict[str, Any]]] = [[] for _ in items]
    for index, item in enumerate(items):
        for j in range(cfg["k"]):
            if book is not None and (item.id, j) in book.done:
                samples[index].append(book.done[(item.id, j)])
                continue
            tag = {"item": index, "sample": j}
            specs.append(suite.episode_spec(item, sample_seed(settings.seed, item.id, j),
                                            cfg["max_turns"], system, tag))
    t1 = time.perf_counter()
    total = len(items) * cfg["k"]
    resumed = total - len(specs)
    done = resumed
    ended = [0]

    def episode_ended(_tr: Any) -> None:
        ended[0] += 1
        if on_progress is not None:
            on_progress(resumed + ended[0], total)

    engine.on_episode = episode_ended
    try:
        for start in range(0, len(specs), max(1, settings.batch_size)):
            batch = specs[start:start + max(1, settings.batch_size)]
            for tr in engine.run(batch):
                record = _sample_record(suite, items, tr, settings.transcripts)
                samples[tr.spec.tag["item"]].append(record)
                if book is not None:
                    book.append(items[tr.spec.tag["item"]].id, record)
            done += len(batch)
            ended[0] = done - resumed  # every episode of the batch, however it ended
    finally:
        if book is not None:
            book.close()
    item_rows = [_item_row(item, rows) for item, rows in zip(items, samples)]
    return {
        "format": RESULT_FORMAT, "suite": suite.name, "model": label, "resumed_samples": resumed,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "settings": cfg, "summary": summarize(item_rows, suite.groups()),
        "items": item_rows, "skipped": [list(s) for s in getattr(suite, "skipped", [])],
        **({"invalid": [dict(row) for row in suite.invalid],
            "validation": suite.validation()} if screened else {}),
        "timing_s": {"load": round(load_s, 3), "play": round(time.perf_counter() - t1, 3)},
    }


def _context_of(policy: Any) -> int:
    for owner in (policy, getattr(policy, "model", None)):
        cfg = getattr(owner, "config", None)
        n = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
        if isinstance(n, int) and n > 0:
            return n
    return 32768


def _sample_record(suite: Suite, items: list[EvalItem], tr: Trajectory,
                   transcripts: bool) -> dict[str, Any]:
    score = suite.score(items[tr.spec.tag["item"]], tr) if getattr(suite, "sandboxed", False) \
        else tr.episode_return
    replies = [m["content"] for m in tr.messages if m["role"] == "assistant"]
    record = {"sample": tr.spec.tag["sample"], "score": float(score),
              "turns": len(tr.turns), "stop_reason": tr.stop_reason,
              "failure": (tr.failure or {}).get("reason") or (tr.failure or {}).get("type"),
              "tokens": tr.num_sampled,
              "reply": replies[-1][-REPLY_CHARS:] if replies else ""}
    if transcripts:
        record["messages"] = tr.messages
    return record


def _item_row(item: EvalItem, rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows.sort(key=lambda r: r["sample"])
    scores = [r["score"] for r in rows]
    return {"id": item.id, "dataset": item.dataset, "group": item.group,
            "answer": _short(item.answer), "scores": scores,
            "mean_score": sum(scores) / len(scores) if scores else 0.0,
            "win_rate": sum(s >= WIN_THRESHOLD for s in scores) / len(scores) if scores else 0.0,
            "failures": sum(1 for r in rows if r["failure"]), "samples": rows}


def _short(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, bool)):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text[:500]


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary metrics (module docstring) over item rows."""
    n = len(rows)
    scores = [s for r in rows for s in r["scores"]]
    if not n:
        return {"items": 0, "samples": 0, "mean_score": 0.0, "win_rate": 0.0, "pass_rate": 0.0,
                "any_credit_rate": 0.0, "failures": 0}
    return {"items": n, "samples": len(scores),
            "mean_score": sum(r["mean_score"] for r in rows) / n,
            "win_rate": sum(r["win_rate"] for r in rows) / n,
            "pass_rate": sum(1 for r in rows if r["win_rate"] > 0) / n,
            "any_credit_rate": sum(s > 0 for s in scores) / len(scores) if scores else 0.0,
            "failures": sum(r["failures"] for r in rows)}


def summarize(rows: list[dict[str, Any]], groups: dict[str, str] | None = None
              ) -> dict[str, Any]:
    by_group: dict[str, list] = {}
    by_dataset: dict[str, list] = {}
    for g in sorted(set((groups or {}).values())):
        by_group[g] = []
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
        by_dataset.setdefault(r["dataset"], []).append(r)
    return {"overall": aggregate(rows),
            "groups": {g: aggregate(rs) for g, rs in sorted(by_group.items())},
            "datasets": {d: aggregate(rs) for d, rs in sorted(by_dataset.items())}}
