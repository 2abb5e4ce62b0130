"""Evaluation overhead: ``spadekit eval``'s runner against raw batched ``generate`` on the same
prompts, plus the cost of scoring.

1. ``run_suite`` evaluates a Reasoning Gym hard subset (--datasets x --limit items, k samples,
   one turn) with the tiny model (or --model); every batch of requests it sends to the policy is
   recorded.
2. The same batches are replayed straight into ``policy.generate`` (seeded: the same tokens):
   the raw model cost.
3. Every item's gold reply is scored with the suite's scorer alone (all must win): the scoring
   cost per sample (real answers reach the real scorers, unlike the tiny model's bytes).

runner_vs_raw = raw time / runner time (1.0 = no overhead); outside_model_share = the runner's
time outside ``generate`` (item environments, scoring, bookkeeping) over its wall time;
score_ms_per_sample = the scorer's cost per reply. Also the time to load (generate) the items.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout import Recording  # noqa: E402

from spadekit.eval.rg import ReasoningGymSuite  # noqa: E402
from spadekit.eval.runner import EvalSettings, run_suite  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402

DATASETS = ["basic_arithmetic", "chain_sum", "knights_knaves", "word_sorting", "spell_backward",
            "letter_counting", "gcd", "propositional_logic", "number_sorting", "caesar_cipher"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--limit", type=int, default=3, help="items per dataset")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()

    policy = Recording(load_policy(args.model, seed=0))
    suite = ReasoningGymSuite(level="hard", datasets=DATASETS)
    t = time.perf_counter()
    items = suite.load_items(args.limit)
    load_s = time.perf_counter() - t
    settings = EvalSettings(k=args.k, max_new_tokens=args.max_new_tokens, max_turns=1,
                            limit=args.limit, batch_size=64)
    t = time.perf_counter()
    result = run_suite(policy, suite, settings, items=items)
    runner_s = time.perf_counter() - t

    t = time.perf_counter()
    model_in_runner = 0.0
    for batch in policy.batches:
        t0 = time.perf_counter()
        policy.inner.generate(batch)
        model_in_runner += time.perf_counter() - t0
    raw_s = time.perf_counter() - t

    by_id = {item.id: item for item in items}
    replies = [(by_id[r["id"]], s["reply"]) for r in result["items"] for s in r["samples"]]
    golds = [(item, suite.gold_completion(item)) for item in items]
    golds = [(item, text) for item, text in golds if text]
    t = time.perf_counter()
    wins = sum(suite.score(item, text) >= 1.0 for item, text in golds)
    score_s = time.perf_counter() - t
    assert wins == len(golds), "a gold reply did not win"

    out = {"model": args.model, "items": len(items), "samples": len(replies),
           "load_items_s": round(load_s, 3), "runner_s": round(runner_s, 3),
           "raw_generate_s": round(raw_s, 3),
           "runner_vs_raw": round(raw_s / runner_s, 3),
           "outside_model_share": round(max(0.0, runner_s - model_in_runner) / runner_s, 4),
           "score_ms_per_sample": round(1000 * score_s / max(1, len(golds)), 3)}
    print(f"items {out['items']} x k={args.k}: runner {runner_s:.2f}s, raw generate {raw_s:.2f}s "
          f"-> runner_vs_raw {out['runner_vs_raw']:.3f}; outside model "
          f"{100 * out['outside_model_share']:.1f}%; scoring {out['score_ms_per_sample']:.2f} "
          f"ms/sample; loading items {load_s:.2f}s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
