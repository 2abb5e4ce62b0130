"""Does the kit designer learn? A long CPU self-play run from the kit warm start against the
same run with the designer frozen (issue 39).

Usage: python3 benchmarks/kit_learning.py [--rounds 30] [--preset cpu-kit] [--seed 0]
                                          [--set key=value ...] [--out DIR] [--no-parallel]

Two runs of ``spadekit selfplay`` (the real CLI, each in its own process; at the same time,
``--no-parallel`` one after the other; each run's console goes to ``OUT/<name>.log``) on the
same preset, seed and ``stream_key`` (so the same skills, documents and sampling seeds
are drawn): ``learning`` as is, and ``frozen`` with ``train_designer=false`` (designer samples
rewarded and logged, never trained: the ablation of paper Table 3). The warm start is built
once (cached) before either and not counted. Per round, from each run's ``run.sqlite``:

- the designer reward of the samples due that round, and, over the samples whose programs
  were pooled, its two parts: the regret part ``regret_weight * regret_norm`` and the plateau
  part ``plateau_weight * plateau(win rate)`` (from the ``designer_samples`` events: the
  plateau part from each sample's window win rate, the regret part the rest);
- the valid share of that round's designs, the kit-novel share of the valid ones (a
  composition or own code that neither the warm-start programs nor any earlier program of the
  run has), the distinct compositions in the pool so far;
- the agent's no-hint mean return on that round's new designs, and whether it lies in the
  plateau band [0.4, 0.6].

The trend of the designer reward is the OLS slope over rounds with a 95% interval (t quantile);
``learning_beats_frozen`` is whether the learning run's slope interval excludes 0 from above
and its slope exceeds the frozen run's. Also the share of designed environments with regret >
0. Writes ``OUT/kit_learning.json`` and ``OUT/kit_learning.png``; the last line printed is one
JSON object (``slope``, ``slope_ci``, ``slope_frozen``, ratio of mean rewards
learning/frozen, minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

BAND = (0.4, 0.6)


def _t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (table, then 1.96)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
             9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}
    if df <= 0:
        return math.inf
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.96


def trend(xs: list[float], ys: list[float]) -> dict:
    """OLS slope of ``ys`` on ``xs`` with its 95% interval (None with fewer than 3 points)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    n = len(pts)
    if n < 3:
        return {"slope": None, "ci": None, "n": n}
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return {"slope": None, "ci": None, "n": n}
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in pts)
    se = math.sqrt(resid / (n - 2) / sxx)
    half = _t975(n - 2) * se
    return {"slope": round(slope, 5), "ci": [round(slope - half, 5), round(slope + half, 5)],
            "n": n}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def read_run(run_dir: Path, known: list) -> tuple[list[dict], list[float]]:
    """One row per round (see the module docstring)."""
    from spadekit.runs.store import RunStore
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.kit_identity import kit_identity
    from spadekit.selfplay.rewards import plateau

    config = load_config(None, path=run_dir / "config.yaml")
    rp = config.reward
    store = RunStore.open(run_dir)
    try:
        seen_comp = {i.composition for i in known if i is not None}
        seen_own = {o for i in known if i is not None for o in i.own}
        envs = [e for e in store.environments() if str(e.get("source") or "").startswith(
            "designer:")]
        by_step: dict[int, list] = {}
        for env in envs:
            by_step.setdefault(env["created_step"], []).append(env)
        designed = dict(store.metrics("designed"))
        valid = dict(store.metrics("valid"))
        samples: dict[int, list] = {}
        for event in store.events("designer_samples"):
            data = event["data"]
            samples.setdefault(data["step"], []).extend(data.get("samples") or [])
        rows, pool_comps = [], set()
        for step in sorted(set(designed) | set(samples)):
            due = [s for s in samples.get(step, []) if s.get("reward") is not None]
            # what the plateau read (above chance with reward.above_chance; the win rate in
            # runs recorded before plateau_input was)
            plateau_parts = [rp.plateau_weight * plateau(s.get("plateau_input", s["win_rate"]),
                                                        rp.plateau_low, rp.plateau_high)
                             if s.get("win_rate") is not None else None for s in due]
            regret_parts = [s["reward"] - p if p is not None else None
                            for s, p in zip(due, plateau_parts)]
            new = by_step.get(step, [])
            novel = 0
            returns = []
            for env in new:
                ident = kit_identity(env["code"])
                if ident is not None:
                    if ident.composition not in seen_comp or any(
                            o not in seen_own for o in ident.own):
                        novel += 1
                    seen_comp.add(ident.composition)
                    seen_own.update(ident.own)
                    pool_comps.add(ident.composition)
                mean = store.query("SELECT AVG(episode_return) FROM plays WHERE env_sha = ? "
                                   "AND with_hint = 0 AND step = ? AND failure IS NULL",
                                   (env["sha256"], step))[0][0]
                if mean is not None:
                    returns.append(mean)
            n = designed.get(step) or 0
            rows.append({
                "round": step,
                "designer_reward": _mean([s["reward"] for s in due]),
                # the parts over the samples whose programs were pooled (the others carry a
                # fixed reward for an invalid program): reward_pooled = regret + plateau part
                "designer_reward_pooled": _mean([s["reward"] for s, p in zip(due, plateau_parts)
                                                 if p is not None]),
                "regret_part": _mean(regret_parts), "plateau_part": _mean(plateau_parts),
                "designer_samples_due": len(due),
                "valid_share": round(valid.get(step, 0) / n, 4) if n else None,
                "kit_novel_share": round(novel / len(new), 4) if new else None,
                "distinct_compositions_in_pool": len(pool_comps),
                "new_design_return": _mean(returns),
                "in_band": (None if not returns else
                            sum(BAND[0] <= r <= BAND[1] for r in returns) / len(returns))})
        regrets = [store.env_stats(e["sha256"]).get("regret_at_gen") for e in envs]
        regrets = [r for r in regrets if r is not None]
    finally:
        store.close()
    return rows, regrets


def _plot(out: Path, runs: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (rows, _r) in runs.items():
        xs = [r["round"] for r in rows]
        a.plot(xs, [r["designer_reward"] for r in rows], marker="o", label=name)
        b.plot(xs, [r["valid_share"] for r in rows], marker=".", label=f"{name} valid")
        b.plot(xs, [r["kit_novel_share"] for r in rows], ls="--", label=f"{name} novel")
    a.set_title("designer reward per round")
    a.set_xlabel("round")
    b.set_title("valid and kit-novel share of designs")
    b.set_xlabel("round")
    a.legend(fontsize=8)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "kit_learning.png", dpi=110)


def _finish(name: str, procs: dict, minutes: dict) -> None:
    """Wait for run ``name`` (once), record its minutes; a failed run stops the benchmark."""
    if name not in procs:
        return
    proc, log, clock = procs.pop(name)
    code = proc.wait()
    log.close()
    minutes[name] = round((time.perf_counter() - clock) / 60, 2)
    if code:
        for _other, rest in procs.items():
            rest[0].kill()
        raise SystemExit(f"[{name}] spadekit selfplay exited {code}: see its log")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-kit")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "kit_learning"))
    ap.add_argument("--parallel", action=argparse.BooleanOptionalAction, default=True,
                    help="run both at once (default: each run's torch takes one thread on 2 "
                    "cores, so together they use both)")
    args = ap.parse_args()
    from spadekit.runs.pool import load_pool
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.kit_identity import kit_identity
    from spadekit.selfplay.warm_cache import progress_bars, warm_model_dir

    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    base = [f"seed={args.seed}", f"stream_key=kit-learning-{args.seed}", "tensorboard=false",
            f"checkpoint_every={args.rounds}", *args.set]
    config = load_config(args.preset, overrides=base)
    with progress_bars() as progress:
        warm = warm_model_dir(config, progress=progress)
    known = [kit_identity(p.code) for p in load_pool(warm.parent / "programs")] if warm else []
    start = time.perf_counter()
    runs, minutes, procs = {}, {}, {}
    for name, extra in (("learning", []), ("frozen", ["train_designer=false"])):
        cmd = [sys.executable, "-m", "spadekit", "selfplay", "--preset", args.preset,
               "--rounds", str(args.rounds), "--run-dir", str(out / name)]
        for item in base + extra:
            cmd += ["--set", item]
        print(f"[{name}] {' '.join(cmd[3:])} > {out / (name + '.log')}", flush=True)
        log = open(out / f"{name}.log", "w")
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log,
                       time.perf_counter())
        if not args.parallel:
            _finish(name, procs, minutes)
    for name in list(procs):
        _finish(name, procs, minutes)
    for name in ("learning", "frozen"):
        runs[name] = read_run(out / name, known)
    stats = {}
    for name, (rows, regrets) in runs.items():
        xs = [r["round"] for r in rows]
        stats[name] = {
            "trend": trend(xs, [r["designer_reward"] for r in rows]),
            "mean_reward": _mean([r["designer_reward"] for r in rows]),
            "regret_positive_share": round(sum(r > 0 for r in regrets) / len(regrets), 4)
            if regrets else None,
            "designed_envs_with_regret": len(regrets),
            "valid_share": _mean([r["valid_share"] for r in rows]),
            "kit_novel_share": _mean([r["kit_novel_share"] for r in rows]),
            "in_band": _mean([r["in_band"] for r in rows]),
            "distinct_compositions_in_pool": rows[-1]["distinct_compositions_in_pool"]
            if rows else 0, "minutes": minutes[name]}
    learn, frozen = stats["learning"], stats["frozen"]
    ci = learn["trend"]["ci"]
    beats = bool(ci and ci[0] > 0 and frozen["trend"]["slope"] is not None
                 and learn["trend"]["slope"] > frozen["trend"]["slope"])
    ratio = (round(learn["mean_reward"] / frozen["mean_reward"], 3)
             if learn["mean_reward"] and frozen["mean_reward"] else None)
    result = {"rounds": args.rounds, "preset": args.preset, "slope": learn["trend"]["slope"],
              "slope_ci": ci, "slope_frozen": frozen["trend"]["slope"],
              "slope_frozen_ci": frozen["trend"]["ci"],
              "mean_reward_ratio_learning_over_frozen": ratio,
              "learning_beats_frozen": beats,
              "regret_positive_share": learn["regret_positive_share"],
              "regret_positive_share_frozen": frozen["regret_positive_share"],
              "minutes": round((time.perf_counter() - start) / 60, 2), "out": str(out)}
    (out / "kit_learning.json").write_text(json.dumps(
        {**result, "stats": stats, "rows": {k: v[0] for k, v in runs.items()}}, indent=1))
    _plot(out, runs)
    for name, s in stats.items():
        print(f"{name:>8}: {json.dumps(s)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
