"""How often an honest game is refused at admission or retired in play (issue item 6).

The validator (``spadekit.sandbox.validate``) and the watch (``spadekit.selfplay.watch``) judge a
program by margins on drawn seeds: garbage, a random policy and the policy's replies must score
well below its solution. Those draws can be lucky for an honest game too; this measures how
often. For every library game (both settings) and a set of procedural games (drawn with a fixed
seed from both splits, ``spadekit.selfplay.procedural_pool``), it runs, with the house's real
parts (a real ``SandboxPool``, the run's default ``ValidatorSettings``, a ``PoolWatch`` over a
real ``RunStore``; no mocks):

- the validator, once per validation seed (``Validator.validate_many``), recording refusals,
  their reason and the tightest margin seen;
- the watch's spot checks as ``after_play`` runs them when a round's batch carries none
  (``_spot_checks_outside``: the same plans, probes and verdicts; nothing is retired, so every
  round judges every game again), once per round with ``RoundStreams(seed + i, i)``, in two
  reply modes: ``drawn`` (round 0: no stored replies, drawn model-like ones stand in) and
  ``solved`` (the run database holds episodes in which the agent played the solution of every
  OTHER pooled game: a policy that has learnt them all, the replies likeliest to score).

Guarantees: everything is fixed by ``--seed`` (the game set, every validation seed and every
round's streams; only timing verdicts depend on the machine), each rate comes with its Wilson
95% interval, and the last line is one JSON object ``{"benchmark": "retire_rates", ...}`` with
the per-game rates and the maximum. A watch rate is per round: a program pooled for R rounds is
retired with chance 1 - (1 - p) ** R. Defaults: 100 validations and 200 rounds per game and
mode, about 25 minutes on 2 shared cores; ``--quick`` under a minute. Figures:
docs/reward_integrity.md, "How often an honest game is refused or retired".

Usage: python benchmarks/retire_rates.py [--quick] [--validator-seeds N] [--watch-rounds N]
[--procedural N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.common.streams import RoundStreams, derive_seed  # noqa: E402
from spadekit.envs import library  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.runs.store import RunStore  # noqa: E402
from spadekit.sandbox.pool import SandboxPool  # noqa: E402
from spadekit.sandbox.validate import Validator  # noqa: E402
from spadekit.selfplay.config import SelfPlayConfig  # noqa: E402
from spadekit.selfplay.watch import PoolWatch, ProbeResult, solution_actions_for  # noqa: E402

REPLY_MODES = ("drawn", "solved")
LIMIT = 0.01
"""The issue's bar: an honest game refused or retired more often than this needs a rule fix."""
CHUNK = 50
"""Watch rounds per run database (the chunks run side by side)."""
SOLVED_EPISODES = 2
"""Stored solution episodes per pooled game in the ``solved`` reply mode."""


@dataclass(frozen=True)
class Honest:
    """One honest game: its name in the table, its program, its setting and where it is from."""

    name: str
    program: EnvProgram
    setting: str
    family: str


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials (95% at z = 1.96)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, mid - half), min(1.0, mid + half)


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"n": n, "k": k, "rate": k / n if n else 0.0, "ci95": [round(lo, 4), round(hi, 4)]}


def honest_games(procedural: int = 24, seed: int = 0,
                 names: Sequence[str] | None = None) -> list[Honest]:
    """Every library game (or those in ``names``), then ``procedural`` procedural games, half
    drawn from the training split and half from the held-out one (``candidates`` with
    ``seed``, themed on the offline default corpus; the first of each split's drawn order)."""
    out = [Honest(e.name, library.program(e), e.setting, "library")
           for e in library.list_library() if names is None or e.name in names]
    if procedural > 0:
        from spadekit.selfplay.corpus import load_corpus
        from spadekit.selfplay.procedural_pool import candidates, split_combos

        split = split_combos(seed)
        texts = [(d.id, d.text) for d in load_corpus(None)]
        for part, count in (("train", (procedural + 1) // 2), ("held_out", procedural // 2)):
            for program in candidates(split.of(part), texts, seed)[:count]:
                combo = program.meta["procedural"]["combo"]
                out.append(Honest(f"proc:{part}:{combo}", program, "games",
                                  f"procedural:{part}"))
    return out


def validator_rates(pool: SandboxPool, games: Sequence[Honest], seeds: int, seed: int,
                    settings: Any, workers: int = 2) -> dict[str, dict[str, Any]]:
    """Per game: refusals in ``seeds`` validations (validation seed ``derive_seed(seed,
    "validation", name, i)``), their reasons, the evidence of the first ones, and the tightest
    slack of each margin among all (solution mean - baseline mean - margin)."""
    validator = Validator(pool, settings)
    jobs = [(g, i) for g in games for i in range(seeds)]
    reports = validator.validate_many([g.program for g, _i in jobs], workers=workers,
                                      seeds=[derive_seed(seed, "validation", g.name, i)
                                             for g, i in jobs])
    out: dict[str, dict[str, Any]] = {}
    for (game, _i), report in zip(jobs, reports):
        row = out.setdefault(game.name, {"n": 0, "refused": 0, "reasons": Counter(),
                                         "evidence": [], "garbage_slack_min": None,
                                         "random_slack_min": None, "garbage_mean_max": 0.0,
                                         "random_mean_max": 0.0})
        row["n"] += 1
        d = report.details
        if "garbage_mean_return" in d and "solution_mean_return" in d:
            sol = d["solution_mean_return"]
            for who, margin in (("garbage", settings.action_margin),
                                ("random", settings.random_margin)):
                mean = d[f"{who}_mean_return"]
                slack = round(sol - mean - margin, 4)
                key = f"{who}_slack_min"
                row[key] = slack if row[key] is None else min(row[key], slack)
                row[f"{who}_mean_max"] = max(row[f"{who}_mean_max"], mean)
        if not report.ok:
            row["refused"] += 1
            row["reasons"][report.reason] += 1
            if len(row["evidence"]) < 3:
                row["evidence"].append({
                    "validation_seed": d.get("validation_seed"), "stage": report.stage,
                    "reason": report.reason, "message": report.message[:300],
                    **{k: d[k] for k in ("garbage_returns", "random_returns",
                                         "solution_returns") if k in d}})
    return out


class _Watch(PoolWatch):
    """The real watch, with each program's probe results kept as ``_verdict`` sees them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, dict[str, list[ProbeResult]]] = {}

    def _verdict(self, sha: str, kinds: dict[str, list[ProbeResult]]
                 ) -> tuple[str | None, dict[str, Any]]:
        self.seen[sha] = kinds
        return super()._verdict(sha, kinds)


def _admitted(validator: Validator, game: Honest, seed: int) -> Any:
    """The validation report a pooled copy of ``game`` carries (its first valid one)."""
    last = None
    for i in range(20):
        last = validator.validate(game.program, seed=derive_seed(seed, "validation",
                                                                 game.name, "admit", i))
        if last.ok:
            return last
    raise SystemExit(f"{game.name} was never admitted: {last.reason}: {last.message}")


def _store_solutions(store: RunStore, pool: SandboxPool, shas: dict[str, Honest],
                     max_turns: int, tooluse: bool, seed: int) -> None:
    """Agent episodes of each pooled game's solution (``SOLVED_EPISODES`` seeds each)."""
    for sha, game in shas.items():
        seeds = [derive_seed(seed, "play", game.name, k) % 2 ** 31
                 for k in range(SOLVED_EPISODES)]
        found, _tools = solution_actions_for(pool, game.program, seeds, max_turns, tooluse)
        for s, actions in found.items():
            store.record_episode({"seed": s, "episode_return": 1.0, "terminated": True,
                                  "turns": [{"action": a} for a in actions]},
                                 step=0, env_sha=sha, with_hint=False)


def watch_rates(pool: SandboxPool, games: Sequence[Honest], rounds: int, seed: int,
                config: SelfPlayConfig, modes: Sequence[str] = REPLY_MODES,
                admitted: dict[str, Any] | None = None,
                progress: Callable[[str], None] | None = None,
                workers: int = 4) -> dict[str, dict[str, Any]]:
    """Per game and reply mode: the watch's verdicts over ``rounds`` rounds, each game pooled
    (as a designed program, with its admission report) in a run database of its setting beside
    the other games of that setting, one run database per (setting, mode) and ``CHUNK`` rounds,
    run side by side in ``workers`` threads (sandboxes mostly wait on their workers);
    ``{name: {mode: row}}``."""
    validator = Validator(pool, config.validation.settings(config.turn_cap))
    admitted = dict(admitted or {})
    for game in games:
        if game.name not in admitted:
            admitted[game.name] = _admitted(validator, game, seed)
    out: dict[str, dict[str, Any]] = {g.name: {} for g in games}
    runs = [(setting, mode, range(start, min(rounds, start + CHUNK)))
            for setting in ("games", "tooluse") if any(g.setting == setting for g in games)
            for mode in modes for start in range(0, rounds, CHUNK)]
    with tempfile.TemporaryDirectory(prefix="retire_rates_") as tmp, \
            ThreadPoolExecutor(max(1, min(workers, len(runs) or 1))) as ex:
        jobs = [ex.submit(_watch_run, pool, [g for g in games if g.setting == setting], mode,
                          span, seed, config, admitted,
                          Path(tmp) / f"{setting}_{mode}_{span.start}", progress)
                for setting, mode, span in runs]
        for (_setting, mode, _span), job in zip(runs, jobs):
            for name, row in job.result().items():
                _merge(out[name].setdefault(mode, _row()), row)
    return out


def _row() -> dict[str, Any]:
    return {"n": 0, "retired": 0, "reasons": Counter(), "evidence": [],
            "garbage_mean_max": 0.0, "reply_mean_max": 0.0}


def _merge(into: dict[str, Any], row: dict[str, Any]) -> None:
    into["n"] += row["n"]
    into["retired"] += row["retired"]
    into["reasons"].update(row["reasons"])
    into["evidence"] = (into["evidence"] + row["evidence"])[:3]
    for key in ("garbage_mean_max", "reply_mean_max"):
        into[key] = max(into[key], row[key])


def _watch_run(pool: SandboxPool, games: Sequence[Honest], mode: str, rounds: range, seed: int,
               config: SelfPlayConfig, admitted: dict[str, Any], run_dir: Path,
               progress: Callable[[str], None] | None) -> dict[str, dict[str, Any]]:
    """One run database of one setting and reply mode, watched for the rounds ``rounds``."""
    tooluse = games[0].setting == "tooluse"
    with RunStore(run_dir, create=True) as store:
        shas = {store.add_environment(g.program, step=0, validation=admitted[g.name]): g
                for g in games}
        if mode == "solved":
            _store_solutions(store, pool, shas, config.turn_cap, tooluse, seed)
        watch = _Watch(config.watch, store, {}, pool, config.turn_cap, tooluse)
        rows = {sha: _row() for sha in shas}
        t = time.perf_counter()
        for i in rounds:
            found: dict[str, tuple[str, dict[str, Any]]] = {}
            watch.seen = {}
            watch._spot_checks_outside(RoundStreams(seed + i, i), found, set())
            for sha, row in rows.items():
                _tally(row, shas[sha], watch.seen.get(sha), found.get(sha), seed + i)
        if progress is not None:
            progress(f"watch {games[0].setting}/{mode}: {len(games)} games x rounds "
                     f"{rounds.start}-{rounds.stop - 1} in {time.perf_counter() - t:.0f}s")
        return {shas[sha].name: row for sha, row in rows.items()}


def _tally(row: dict[str, Any], game: Honest, kinds: dict[str, list[ProbeResult]] | None,
           verdict: tuple[str, dict[str, Any]] | None, run_seed: int) -> None:
    """One round's verdict on one game into its row, with the evidence of a retirement."""
    row["n"] += 1
    if kinds:
        for who, key in (("garbage", "garbage_mean_max"), ("reply", "reply_mean_max")):
            if kinds[who]:
                mean = sum(r.episode_return for r in kinds[who]) / len(kinds[who])
                row[key] = max(row[key], round(mean, 4))
    if verdict is None:
        return
    reason, details = verdict
    row["retired"] += 1
    row["reasons"][reason] += 1
    if len(row["evidence"]) < 3:
        hint = game.program.hint or ""
        actions = details.get("actions") or []
        probe = details.get("baseline")
        if probe == "garbage":
            probe = "hint_echo" if hint and actions and actions[0].startswith(hint) \
                else "garbage"
        row["evidence"].append({
            "run_seed": run_seed, "reason": reason, "probe": probe,
            "garbage_mean_return": details.get("garbage_mean_return"),
            "solution_mean_return": details.get("solution_mean_return"),
            "margin": details.get("margin"), "seed": details.get("seed"),
            "actions": [a[:160] for a in actions[:4]], "rewards": details.get("rewards"),
            **{k: details[k] for k in ("mean_step_s", "mean_worker_turn_s", "error",
                                       "episodes", "seeds", "returns") if k in details}})


def measure(games: Sequence[Honest], validator_seeds: int, watch_rounds: int, seed: int = 0,
            modes: Sequence[str] = REPLY_MODES, pool: SandboxPool | None = None,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The benchmark's core: per game, the validator's refusal rate and the watch's retirement
    rate in each reply mode, each ``{"n", "k", "rate", "ci95"}`` with its reasons, evidence and
    margins; and ``max_rate`` (the highest rate of any game), ``above_limit`` (the
    (game, check) pairs above ``LIMIT``) and the seconds each part took."""
    config = SelfPlayConfig()
    settings = config.validation.settings(config.turn_cap)
    own = pool is None
    pool = pool if pool is not None else SandboxPool(warm=4)
    try:
        t0 = time.perf_counter()
        refused = validator_rates(pool, games, validator_seeds, seed, settings) \
            if validator_seeds > 0 else {}
        t1 = time.perf_counter()
        if progress is not None and validator_seeds > 0:
            progress(f"validator: {len(games)} games x {validator_seeds} seeds in "
                     f"{t1 - t0:.0f}s")
        retired = watch_rates(pool, games, watch_rounds, seed, config, modes,
                              progress=progress) if watch_rounds > 0 else {}
        t2 = time.perf_counter()
    finally:
        if own:
            pool.close()
    rows: dict[str, Any] = {}
    above: list[list[str]] = []
    top = 0.0
    for game in games:
        row: dict[str, Any] = {"setting": game.setting, "family": game.family}
        v = refused.get(game.name)
        if v is not None:
            row["refused"] = {**_rate(v["refused"], v["n"]), "reasons": dict(v["reasons"]),
                              "evidence": v["evidence"],
                              **{k: v[k] for k in ("garbage_slack_min", "random_slack_min",
                                                   "garbage_mean_max", "random_mean_max")}}
        for mode, w in retired.get(game.name, {}).items():
            row[f"retired_{mode}"] = {**_rate(w["retired"], w["n"]),
                                      "reasons": dict(w["reasons"]), "evidence": w["evidence"],
                                      "garbage_mean_max": w["garbage_mean_max"],
                                      "reply_mean_max": w["reply_mean_max"]}
        for check in [k for k in row if k.startswith(("refused", "retired_"))]:
            top = max(top, row[check]["rate"])
            if row[check]["rate"] > LIMIT:
                above.append([game.name, check])
        rows[game.name] = row
    return {"games": rows, "max_rate": top, "above_limit": above,
            "validator_seeds": validator_seeds, "watch_rounds": watch_rounds, "seed": seed,
            "modes": list(modes), "validator_s": round(t1 - t0, 1),
            "watch_s": round(t2 - t1, 1),
            "settings": {"validation_action_margin": settings.action_margin,
                         "validation_random_margin": settings.random_margin,
                         "watch_action_margin": config.watch.action_margin,
                         "watch_spot_checks": config.watch.spot_checks,
                         "turn_cap": config.turn_cap}}


def _pct(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    lo, hi = cell["ci95"]
    return f"{cell['k']}/{cell['n']} {100 * cell['rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(result: dict[str, Any]) -> list[str]:
    """The per-game table (refused, retired per reply mode: k/n, % and the 95% interval)."""
    modes = result["modes"] if result["watch_rounds"] > 0 else []
    heads = ["game", "refused"] + [f"retired ({m})" for m in modes]
    lines = [" | ".join(heads), " | ".join("---" for _ in heads)]
    for name, row in result["games"].items():
        cells = [name, _pct(row.get("refused"))] + [_pct(row.get(f"retired_{m}"))
                                                     for m in modes]
        lines.append(" | ".join(cells))
    return lines


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Totals over all games: checks run and honest games refused or retired, per check."""
    out: dict[str, Any] = {}
    for check in ["refused"] + [f"retired_{m}" for m in result["modes"]]:
        cells = [r[check] for r in result["games"].values() if check in r]
        if cells:
            k, n = sum(c["k"] for c in cells), sum(c["n"] for c in cells)
            reasons: Counter = Counter()
            for c in cells:
                reasons.update(c["reasons"])
            out[check] = {**_rate(k, n), "reasons": dict(reasons),
                          "games_with_any": sum(1 for c in cells if c["k"])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validator-seeds", type=int, default=None,
                    help="validations per game (default 100; --quick 8)")
    ap.add_argument("--watch-rounds", type=int, default=None,
                    help="watch rounds per game and reply mode (default 200; --quick 8)")
    ap.add_argument("--procedural", type=int, default=None,
                    help="procedural games, half per split (default 24; --quick 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default=",".join(REPLY_MODES),
                    help="reply modes of the watch, comma-separated (drawn, solved)")
    ap.add_argument("--quick", action="store_true", help="a small run (under 2 minutes)")
    ap.add_argument("--out", type=Path, default=None, help="also write the full result here")
    args = ap.parse_args()
    quick = args.quick
    seeds = args.validator_seeds if args.validator_seeds is not None else (8 if quick else 100)
    rounds = args.watch_rounds if args.watch_rounds is not None else (8 if quick else 200)
    nproc = args.procedural if args.procedural is not None else (4 if quick else 24)
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= set(REPLY_MODES):
        ap.error(f"--modes: one or more of {', '.join(REPLY_MODES)}")
    t = time.perf_counter()
    games = honest_games(nproc, args.seed)
    result = measure(games, seeds, rounds, args.seed, modes,
                     progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    result["elapsed_s"] = round(time.perf_counter() - t, 1)
    for line in table(result):
        print(line)
    totals = summary(result)
    print()
    for check, cell in totals.items():
        print(f"{check:16s} {cell['k']} of {cell['n']} checks ({100 * cell['rate']:.2f}%, 95% "
              f"CI [{100 * cell['ci95'][0]:.2f}, {100 * cell['ci95'][1]:.2f}]), "
              f"{cell['games_with_any']} games with any; reasons {cell['reasons']}")
    print(f"max rate {100 * result['max_rate']:.2f}% ; above {100 * LIMIT:g}%: "
          f"{result['above_limit'] or 'none'} ; {result['elapsed_s']:.0f}s")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    line = {"benchmark": "retire_rates", "seed": args.seed, "validator_seeds": seeds,
            "watch_rounds": rounds, "games": len(games), "modes": modes,
            "rates": {name: {check: round(row[check]["rate"], 4)
                             for check in row if check.startswith(("refused", "retired_"))}
                      for name, row in result["games"].items()},
            "totals": {c: {"k": v["k"], "n": v["n"], "rate": round(v["rate"], 5)}
                       for c, v in totals.items()},
            "max_rate": round(result["max_rate"], 4), "above_limit": result["above_limit"],
            "validator_s": result["validator_s"], "watch_s": result["watch_s"],
            "elapsed_s": result["elapsed_s"]}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
