"""Evaluation inside a self-play run: the configured suites on the current weights, every
``eval.every`` rounds (``SelfPlayConfig.eval``).

Items are loaded once per run (``cache``), so every evaluation scores the same items. Full
results go to ``run_dir/evals/step-N.json``; flat metrics come back for the round
(``eval/<suite>/win_rate``, ``eval/<suite>/mean_score``, and per group). ``envs:`` suites are
screened once with the run's validator settings before loading; ``eval/<suite>/invalid`` counts
the programs that failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spadekit.eval import make_suite, suite_label
from spadekit.eval.compare import results_file
from spadekit.eval.runner import EvalSettings, run_suite


def evaluate_in_loop(policy: Any, pool: Any, config: Any, run_dir: Path, step: int,
                     cache: dict[str, Any]) -> dict[str, float]:
    """Run ``config.eval.suites`` with ``policy``; returns the round's eval metrics."""
    e = config.eval
    settings = EvalSettings(k=e.k, temperature=e.temperature, max_new_tokens=e.max_new_tokens,
                            max_turns=e.max_turns, limit=e.limit, seed=e.seed,
                            max_context_tokens=config.rollout.max_context_tokens)
    label = f"{Path(run_dir).name}@step-{step}"
    results, flat = [], {}
    for spec in e.suites:
        if spec not in cache:  # items are fixed for the whole run
            suite = make_suite(spec)
            if callable(getattr(suite, "screen", None)):  # untrusted programs: validated first
                cfg = settings.resolve(suite)
                turns = cfg["max_turns"]
                validation = getattr(config, "validation", None)
                suite.screen(pool, turns, seed=e.seed, limit=e.limit, samples=cfg["k"],
                             settings=(validation.settings(turns) if validation is not None
                                       else None))
            cache[spec] = (suite, suite.load_items(e.limit))
        suite, items = cache[spec]
        result = run_suite(policy, suite, settings, pool=pool, items=items, model_label=label)
        results.append(result)
        summary, name = result["summary"], suite_label(spec)
        for group, m in [("", summary["overall"])] + [
                (f"{g}/", m) for g, m in summary["groups"].items()]:
            flat[f"eval/{name}/{group}win_rate"] = m["win_rate"]
            flat[f"eval/{name}/{group}mean_score"] = m["mean_score"]
        if "invalid" in result:
            flat[f"eval/{name}/invalid"] = len(result["invalid"])
    folder = Path(run_dir) / "evals"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".step-{step}.json.tmp"
    tmp.write_text(json.dumps(results_file(label, results, source=run_dir)))
    tmp.replace(folder / f"step-{step}.json")
    return flat
