"""Does training make the bundled model better? The learning benchmark (issue 17).

Trains a model with spadekit's own loop (``SelfPlay``, the code behind ``spadekit selfplay`` and
``spadekit train-fixed``) and measures it on held-out seeds, before, after every
``--eval-every`` rounds, and at the end:

- ``--mode fixed`` (default): ``train-fixed``, the agent role only, on a pool of library games
  (``--games``; the knapsack is multi-turn: inspect items, then pack);
- ``--mode spade``: the SPADE loop (designer and agent) with the library's bootstrap
  environments (``--games``) in the pool beside the designed ones.

Held-out seeds (``spadekit.selfplay.learning.HELD_OUT_BASE`` on) are checked against every seed the run
played (from its database): none may coincide. Reported: mean return and win rate before and
after, the after-minus-before gain of each with a 95% paired bootstrap interval, a per-round
curve (training return and share of non-zero advantages per round, held-out return at each
evaluation) as JSON and PNG, example transcripts before and after (what was learned, not only a
number), one out-of-distribution check (``--ood``: a library game never trained on), the engine
and the minutes. Per game it also reports the full-score share, the share of multi-turn episodes
and which move each episode opened with (``reveal`` or a blind bid in ``hidden_limit``,
``inspect`` or ``pack`` in the knapsack): the multi-turn skill's visible trace. A held-out
episode that failed (engine or game) stops the benchmark instead of counting as a zero.
Generation goes through vLLM when it is installed (``--engine``). Training uses the
``cpu-tiny`` preset (with its format aids) unless ``--set`` says otherwise. The last line is one
JSON object with at least ``return_before``, ``return_after``, ``return_gain_ci_low``,
``win_rate_before``, ``win_rate_after``, ``minutes`` and ``engine``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.selfplay.config import load_config  # noqa: E402
from spadekit.envs import library  # noqa: E402
from spadekit.envs.actions import extract_boxed  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.selfplay.learning import (evaluate, held_out_seeds, mean, paired_gain_ci,  # noqa: E402
                               win_rate)
from spadekit.rollout.engine import RolloutEngine  # noqa: E402
from spadekit.selfplay.loop import SelfPlay  # noqa: E402


def source_of(name: str) -> str:
    """A library game's source by name, or a program file's."""
    path = Path(name)
    return path.read_text() if path.suffix == ".py" else library.source(name)


def transcript(tr, limit: int = 3) -> dict:
    return {"seed": tr.spec.seed, "return": tr.episode_return,
            "turns": [{"action": t.action[:200], "reward": t.reward,
                       "observation": t.observation[:200]} for t in tr.turns[:limit]]}


def first_verb(action: str) -> str:
    """The first word in the box a game reads (the last one) of an episode's first action:
    ``reveal``, ``pack``, ``<number>`` for a bare number, ``<no box>``. Which move an episode
    opened with is the multi-turn skill's visible trace (inspect first, or commit at once)."""
    content = extract_boxed(action)
    match = re.match(r"\s*([A-Za-z]+|\d+)", content or "")
    if not match:
        return "<no box>" if content is None else "<other>"
    word = match.group(1).lower()
    return "<number>" if word.isdigit() else word


def game_figures(trajs) -> dict:
    returns = [t.episode_return for t in trajs]
    verbs: dict[str, int] = {}
    stops: dict[str, int] = {}
    for t in trajs:
        stops[t.stop_reason or "?"] = stops.get(t.stop_reason or "?", 0) + 1
        verb = first_verb(t.turns[0].action) if t.turns else "<no turn>"
        verbs[verb] = verbs.get(verb, 0) + 1
    return {"episodes": len(trajs), "mean_return": round(mean(returns), 4),
            "win_rate": round(win_rate(returns), 4),
            "full_score_share": round(mean([1.0 if r >= 0.999 else 0.0 for r in returns]), 4),
            "turns": round(mean([len(t.turns) for t in trajs]), 3),
            "multi_turn_share": round(mean([1.0 if len(t.turns) > 1 else 0.0 for t in trajs]), 4),
            "first_moves": dict(sorted(verbs.items(), key=lambda kv: -kv[1])),
            "stop_reasons": stops,
            "first_failure": next((str(t.failure)[:300] for t in trajs if t.failure), None)}


FAILED = ("policy_error", "env_error")


def measure(engine, programs, seeds, names=None) -> dict:
    """Held-out figures; a held-out episode that failed (the engine or the game, not the
    model) stops the benchmark, since counting it as a zero would fake a result."""
    trajs = evaluate(engine, programs, seeds)
    failed = [t for t in trajs if t.stop_reason in FAILED]
    if failed:
        raise SystemExit(f"{len(failed)} of {len(trajs)} held-out episodes failed "
                         f"({failed[0].stop_reason}: {failed[0].failure}); no figures reported")
    returns = [t.episode_return for t in trajs]
    first_actions: dict[str, int] = {}
    for t in trajs:
        if t.turns:
            key = t.turns[0].action.strip()[:60]
            first_actions[key] = first_actions.get(key, 0) + 1
    names = names or [f"env{i}" for i in range(len(programs))]
    per_game = {name: game_figures(trajs[i * len(seeds):(i + 1) * len(seeds)])
                for i, name in enumerate(names)}
    return {"returns": returns, "mean_return": mean(returns), "win_rate": win_rate(returns),
            "turns": mean([len(t.turns) for t in trajs]), "per_game": per_game,
            "top_first_actions": sorted(first_actions.items(), key=lambda kv: -kv[1])[:5],
            "examples": [transcript(trajs[i]) for i in range(0, len(trajs),
                                                             max(1, len(trajs) // 4))][:4]}


def played_seeds(run_dir: Path) -> set[int]:
    con = sqlite3.connect(run_dir / "run.sqlite")
    try:
        cols = [r[1] for r in con.execute("PRAGMA table_info(episodes)")]
        if "seed" not in cols:
            return set()
        return {int(r[0]) for r in con.execute("SELECT seed FROM episodes") if r[0] is not None}
    finally:
        con.close()


def plot(curve: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = [c["round"] for c in curve if "train_mean_return" in c]
    ax.plot(rounds, [c["train_mean_return"] for c in curve if "train_mean_return" in c],
            marker=".", label="training plays: mean return")
    held = [c for c in curve if "held_out_mean_return" in c]
    ax.errorbar([c["round"] for c in held], [c["held_out_mean_return"] for c in held],
                yerr=[[c["held_out_mean_return"] - c["held_out_ci"][0] for c in held],
                      [c["held_out_ci"][1] - c["held_out_mean_return"] for c in held]],
                marker="o", capsize=3, label="held-out seeds: mean return (95% CI)")
    for game in (held[-1].get("held_out_per_game") or {}) if held else ():
        pts = [c for c in held if game in (c.get("held_out_per_game") or {})]
        ax.plot([c["round"] for c in pts],
                [c["held_out_per_game"][game]["full_score_share"] for c in pts],
                marker="x", linestyle="--", label=f"held-out full-score share: {game}")
    ax.plot(rounds, [c["nonzero_advantage_share"] for c in curve if "train_mean_return" in c],
            linestyle=":", label="share of non-zero advantages")
    ax.set_xlabel("round (-1: before training)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("fixed", "spade"), default="fixed")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--games", default="tests/data/limit_bid.py,tests/data/hidden_limit.py",
                    help="Library game names or program files, comma-separated.")
    ap.add_argument("--ood", default="games_knapsack_reveal",
                    help="A library game never trained on, measured before and after.")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--plays", type=int, default=8, help="num_generations per environment")
    ap.add_argument("--held-out", type=int, default=24, help="held-out seeds per game")
    ap.add_argument("--ood-seeds", type=int, default=16, help="held-out seeds of --ood")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="also measure the held-out seeds every N rounds (0: only at the end)")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling temperature of both roles (training and held-out plays)")
    ap.add_argument("--max-new-tokens", type=int, default=16,
                    help="the agent's tokens per turn (a box needs few)")
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto",
                    help="generation engine: auto = vLLM when it is installed (the faster one), "
                         "else transformers; the trainer is always transformers")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default="runs/learning")
    args = ap.parse_args()

    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [g.strip() for g in args.games.split(",") if g.strip()]
    sources = {Path(n).stem: source_of(n) for n in names}
    names = list(sources)
    programs = [EnvProgram(code=code, domain="games") for code in sources.values()]
    ood = [library.program(library.get(args.ood))] if args.ood else []
    pool_dir = Path(tempfile.mkdtemp(prefix="learning-pool-"))
    for name, code in sources.items():
        (pool_dir / f"{name}.py").write_text(code)
    # --rounds 0 measures the untrained model only (the config still needs one round)
    sets = [f"rounds={max(1, args.rounds)}", f"num_generations={args.plays}",
            f"train.learning_rate={args.learning_rate}", f"train.lora_r={args.lora_r}",
            f"train.lora_alpha={2 * args.lora_r}", "checkpoint_every=1000", "tensorboard=false",
            f"model={args.model}", f"rollout.temperature={args.temperature}",
            f"designer.temperature={args.temperature}",
            f"rollout.max_new_tokens={args.max_new_tokens}"]
    engine_name = args.engine
    if engine_name == "auto":
        engine_name = "vllm" if importlib.util.find_spec("vllm") else "transformers"
    if engine_name == "vllm":
        sets.append(f"generation_model=vllm:{args.model}")
    if args.mode == "fixed":
        sets += ["curriculum.kind=fixed", f"curriculum.pool={pool_dir}",
                 f"envs_per_round={len(names)}"]
    else:  # the loop's bootstrap reads a pool directory (pool.jsonl)
        from spadekit.selfplay.generate import write_pool

        write_pool(pool_dir / "pool", [(p, None) for p in programs])
        sets += [f"bootstrap={pool_dir / 'pool'}", f"bootstrap_per_round={len(names)}"]
    config = load_config("cpu-tiny", overrides=sets + args.overrides)
    run_dir = out / f"run-{args.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    curve: list[dict] = []
    with SelfPlay(config, run_dir) as sp:
        policy = sp.gen_policy or sp.policy
        engine = RolloutEngine(policy, sp.env_backend, dataclasses.replace(
            config.rollout, max_turns=config.turn_cap, seed=12345),
            chat_template_kwargs=config.chat_template.for_role("agent"))
        seeds = held_out_seeds(args.held_out)
        before = measure(engine, programs, seeds, names)
        ood_seeds = held_out_seeds(args.ood_seeds)
        ood_before = measure(engine, ood, ood_seeds, [args.ood]) if ood else None
        curve.append({"round": -1, "held_out_mean_return": before["mean_return"],
                      "held_out_win_rate": before["win_rate"],
                      "held_out_ci": [before["mean_return"]] * 2,
                      "held_out_per_game": before["per_game"]})
        print(json.dumps({"before": {k: v for k, v in before.items() if k != "returns"}}),
              flush=True)
        last = before
        for r in range(args.rounds):
            m = sp.round(sp.next_step)
            sp.next_step += 1
            point = {"round": r, "train_mean_return": m.get("agent_mean_return"),
                     "train_win_rate": m.get("agent_win_rate"),
                     "nonzero_advantage_share": m.get("agent_nonzero_advantage_share"),
                     "valid_share": m.get("valid_share"), "loss": m.get("train/loss"),
                     "seconds": round(m.get("seconds", 0.0), 1),
                     "minutes_so_far": round((time.perf_counter() - t0) / 60, 2)}
            if (args.eval_every and (r + 1) % args.eval_every == 0) or r == args.rounds - 1:
                last = measure(engine, programs, seeds, names)
                _, low, high = paired_gain_ci(before["returns"], last["returns"])
                point.update(held_out_mean_return=last["mean_return"],
                             held_out_per_game=last["per_game"],
                             held_out_win_rate=last["win_rate"],
                             held_out_ci=[before["mean_return"] + low,
                                          before["mean_return"] + high])
            curve.append(point)
            print(json.dumps(point), flush=True)
        after = last
        ood_after = measure(engine, ood, ood_seeds, [args.ood]) if ood else None
    overlap = sorted(set(seeds) & played_seeds(run_dir))
    gain, low, high = paired_gain_ci(before["returns"], after["returns"])
    wgain, wlow, whigh = paired_gain_ci(before["returns"], after["returns"], stat=win_rate)
    minutes = (time.perf_counter() - t0) / 60
    title = (f"{args.model}, {args.mode}: {','.join(names)}; held-out return "
             f"{before['mean_return']:.3f} -> {after['mean_return']:.3f}")
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    plotted = plot(curve, out / "curve.png", title)
    examples = {"before": before["examples"], "after": after["examples"],
                "top_first_actions_before": before["top_first_actions"],
                "top_first_actions_after": after["top_first_actions"]}
    (out / "transcripts.json").write_text(json.dumps(examples, indent=1))
    result = {
        "mode": args.mode, "model": args.model, "games": names, "rounds": args.rounds,
        "plays_per_env": args.plays,
        "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
        "held_out_episodes": len(before["returns"]),
        "held_out_seeds_played_in_training": overlap,
        "return_before": round(before["mean_return"], 4),
        "return_after": round(after["mean_return"], 4),
        "return_gain": round(gain, 4), "return_gain_ci_low": round(low, 4),
        "return_gain_ci_high": round(high, 4),
        "win_rate_before": round(before["win_rate"], 4),
        "win_rate_after": round(after["win_rate"], 4),
        "win_rate_gain_ci_low": round(wlow, 4), "win_rate_gain_ci_high": round(whigh, 4),
        "turns_before": round(before["turns"], 2), "turns_after": round(after["turns"], 2),
        "per_game_before": before["per_game"], "per_game_after": after["per_game"],
        "ood_before": ood_before["per_game"] if ood_before else None,
        "ood_after": ood_after["per_game"] if ood_after else None,
        "ood_game": args.ood or None,
        "ood_return_before": round(ood_before["mean_return"], 4) if ood_before else None,
        "ood_return_after": round(ood_after["mean_return"], 4) if ood_after else None,
        "ood_win_rate_before": round(ood_before["win_rate"], 4) if ood_before else None,
        "ood_win_rate_after": round(ood_after["win_rate"], 4) if ood_after else None,
        "top_first_actions_before": before["top_first_actions"],
        "top_first_actions_after": after["top_first_actions"],
        "curve_json": str(out / "curve.json"), "curve_png": str(out / "curve.png")
        if plotted else None, "transcripts": str(out / "transcripts.json"),
        "run_dir": str(run_dir),
        "engine": f"{config.generation_model} (generation; training: transformers, CPU)"
        if config.generation_model else "transformers (spadekit hf backend, CPU)",
        "threads": os.environ.get("OMP_NUM_THREADS"), "load_average_end": os.getloadavg()[0],
        "minutes": round(minutes, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
