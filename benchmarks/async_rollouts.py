"""Asynchronous against synchronous rollouts, the same seeded run (issue 24).

Usage: python3 benchmarks/async_rollouts.py [--rounds 8] [--k 1] [--out DIR] [--set key=value]

Runs ``benchmarks/learning.py`` (``SelfPlay`` training the bundled SmolLM2-135M with LoRA on its
two games, held-out seeds measured before and after with the same sampling seeds) twice, each in
its own process, with the same seed: ``rollout.max_staleness=0`` (the synchronous loop) and
``rollout.max_staleness=K``. Generation runs on vLLM's CPU engine in its own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``), pinned to the last core (``VLLM_CPU_OMP_THREADS_BIND``),
and the trainer takes one torch thread (``SPADEKIT_TORCH_THREADS=1``): the same split in both
runs. Without vLLM it falls back to a transformers copy (``generation_model=hf:...``) and says so.

From each run's database (``run.sqlite``): the rounds' wall time (evaluation outside the rounds
is not counted), rounds per hour, the trainer's wait share (the share of a round in which no
update runs: ``1 - update / round``), the generator's idle share (the share in which nothing is
generated: ``1 - (design + validate + hint + play + watch) / round``), and the token ledger
(``token_ledger``: every row must balance). The held-out return after the same number of rounds
comes with learning.py's 95% paired-bootstrap interval of its gain; the async run has one update
fewer (its last round's batch is still queued when the run ends), which is reported as well.

The last line printed is one JSON object with ``async_vs_sync_rounds_per_hour``,
``trainer_wait_share_async``, ``trainer_wait_share_sync``, ``generator_idle_share_async``,
``generator_idle_share_sync``, ``ledger_balanced``, ``held_out_return_sync``,
``held_out_return_async`` (and their intervals), ``engine``, ``minutes``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATION = ("design", "validate", "hint", "play", "watch")


def _run(args, k: int, out: Path, generation: str | None) -> dict:
    """learning.py at ``rollout.max_staleness=k`` in its own process; its closing JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SPADEKIT_TORCH_THREADS": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "VLLM_CPU_OMP_THREADS_BIND": str(max(0, (os.cpu_count() or 2) - 1))}
    env.pop("SPADEKIT_FAULT", None)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--rounds",
           str(args.rounds), "--out", str(out / f"k{k}"), "--ood", "",
           "--held-out", str(args.held_out), "--engine",
           "vllm" if generation is None else "transformers",
           "--set", f"rollout.max_staleness={k}", "--set", "checkpoint_every=1",
           "--set", f"seed={args.seed}"]
    if generation is not None:
        cmd += ["--set", f"generation_model={generation}"]
    for item in args.set or []:
        cmd += ["--set", item]
    print(f"[k={k}] {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"k={k}: learning.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1])
    (out / f"k{k}.log").write_text(proc.stdout + "\n" + proc.stderr)
    return result


def _rounds(run_dir: Path) -> dict:
    """Wall time, wait shares and the ledger's balance from the run's database."""
    con = sqlite3.connect(run_dir / "run.sqlite")
    events = [json.loads(r[0]) for r in con.execute(
        "SELECT data FROM events WHERE kind = 'round' ORDER BY step")]
    ledger = [dict(zip(("step", "version", "generated", "trained", "discarded", "in_flight"), r))
              for r in con.execute("SELECT step, version, generated, trained, discarded, "
                                   "in_flight FROM token_ledger ORDER BY step, version")]
    con.close()
    seconds = sum(e["seconds"] for e in events)
    update = sum(e["timings_s"].get("update", 0.0) for e in events)
    generating = sum(sum(v for k, v in e["timings_s"].items() if k in GENERATION)
                     for e in events)
    balanced = bool(ledger) and all(
        r["generated"] == r["trained"] + r["discarded"] + r["in_flight"] for r in ledger)
    last = max((r["step"] for r in ledger), default=None)
    final = [r for r in ledger if r["step"] == last]
    return {
        "rounds": len(events), "round_seconds": round(seconds, 2),
        "rounds_per_hour": round(3600 * len(events) / max(seconds, 1e-9), 2),
        "trainer_wait_share": round(1 - update / max(seconds, 1e-9), 4),
        "generator_idle_share": round(1 - generating / max(seconds, 1e-9), 4),
        "updates": sum(1 for e in events if e.get("train/optimizer_steps")),
        "ledger_balanced": balanced, "ledger_rows": len(ledger),
        "tokens": {key: sum(r[key] for r in final)
                   for key in ("generated", "trained", "discarded", "in_flight")},
        "staleness_max": max((e.get("async/staleness_max", 0) for e in events), default=0),
        "cancelled_batches": sum(e.get("async/cancelled_batches", 0) for e in events),
        "push_failed": sum(e.get("async/push_failed", 0) for e in events),
        "per_round_seconds": [round(e["seconds"], 2) for e in events]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--k", type=int, default=1, help="rollout.max_staleness of the async run")
    ap.add_argument("--held-out", type=int, default=24, help="held-out seeds per game")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", help="a config override for both runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "async_rollouts"))
    args = ap.parse_args()
    if args.k < 1:
        sys.exit("--k must be >= 1 (the async run); k = 0 is the baseline run")
    start = time.perf_counter()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    generation = None
    if importlib.util.find_spec("vllm") is None:
        sys.path.insert(0, str(ROOT / "src"))
        from spadekit.policy.bundled import ensure_smollm2_cache  # the transformers copy

        generation = f"hf:{ensure_smollm2_cache()}"
        print("vLLM is not installed: generation falls back to a transformers copy in the "
              "trainer's process (the two then share its cores)", flush=True)
    results, rounds = {}, {}
    for k in (0, args.k):
        results[k] = _run(args, k, out, generation)
        rounds[k] = _rounds(Path(results[k]["run_dir"]))
        print(f"[k={k}] " + json.dumps({**rounds[k], "held_out_return_after":
                                        results[k]["return_after"]}), flush=True)
    sync, asyn = rounds[0], rounds[args.k]
    summary = {
        "async_vs_sync_rounds_per_hour": round(asyn["rounds_per_hour"]
                                               / max(sync["rounds_per_hour"], 1e-9), 3),
        "rounds_per_hour_sync": sync["rounds_per_hour"],
        "rounds_per_hour_async": asyn["rounds_per_hour"],
        "trainer_wait_share_sync": sync["trainer_wait_share"],
        "trainer_wait_share_async": asyn["trainer_wait_share"],
        "generator_idle_share_sync": sync["generator_idle_share"],
        "generator_idle_share_async": asyn["generator_idle_share"],
        "ledger_balanced": sync["ledger_balanced"] and asyn["ledger_balanced"],
        "held_out_return_before": results[0]["return_before"],
        "held_out_return_sync": results[0]["return_after"],
        "held_out_return_async": results[args.k]["return_after"],
        "held_out_gain_ci_sync": [results[0]["return_gain_ci_low"],
                                  results[0]["return_gain_ci_high"]],
        "held_out_gain_ci_async": [results[args.k]["return_gain_ci_low"],
                                   results[args.k]["return_gain_ci_high"]],
        "updates_sync": sync["updates"], "updates_async": asyn["updates"],
        "staleness_max_async": asyn["staleness_max"], "k": args.k, "rounds": args.rounds,
        "tokens_async": asyn["tokens"], "cancelled_batches_async": asyn["cancelled_batches"],
        "engine": "vllm (own process)" if generation is None else generation,
        "out": str(out), "minutes": round((time.perf_counter() - start) / 60, 2)}
    # learning not worse beyond its interval: the async gain's interval reaches the sync gain
    summary["async_within_interval"] = (summary["held_out_gain_ci_async"][1]
                                        >= results[0]["return_gain"])
    (out / "async_rollouts.json").write_text(json.dumps(
        {"summary": summary, "runs": {str(k): {**rounds[k], "learning": results[k]}
                                      for k in rounds}}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
