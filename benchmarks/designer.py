"""Does the designer learn? Valid, multi-turn and novel programs from the bundled model before
and after its warm start and after self-play (issue 23).

Usage: python3 benchmarks/designer.py [--samples 16] [--rounds 8] [--set key=value ...]

1. The warm start of the preset (``cpu-warm``: ``warmstart.pool: procedural``), built once and
   cached by ``spadekit.selfplay.warm_cache`` exactly as ``spadekit selfplay`` builds it (its
   minutes are reported, and whether it came from the cache).
2. ``--samples`` designer outputs of the base model and of the warm-started one, each with the
   loop's own prompt for a skill (all six) and a grounding document of the corpus's held-out
   half (``procedural_pool.split_documents``: the warm start never saw them), references drawn
   from the warm start's programs (the run's memory). Validated by the real validator in the
   sandbox and classified by ``spadekit.selfplay.designer_eval`` (valid, multi-turn, novel =
   not a near-duplicate of any warm-start program by the memory's own dedup).
3. ``--rounds`` rounds of ``spadekit selfplay`` from the warm start (the real CLI, its run
   database), then the same sampling from the trained checkpoint, and per round from
   ``run.sqlite``: designs, the sandbox-valid share, the novel share (of those, the ones the
   loop's dedup gate let in: ``valid`` counts only them), designer reward, regret, the
   plateau's input (mean no-hint return of the rewarded environments), and every designed
   environment's regret. After self-play, novelty is also measured against the run's own
   memory and environments.

Generation runs on vLLM's CPU engine when it is installed (``--engine``), each phase in its own
process (an in-process vLLM engine does not give its memory back). Writes ``OUT/designer.json``,
``OUT/designer.png`` (shares per phase, reward and regret per round) and
``OUT/examples.md`` (programs it wrote); the last line printed is one JSON object with
``valid_share_base``, ``valid_share_warm``, ``valid_share_rl``, ``multiturn_share``,
``novel_share``, ``designer_reward_first``, ``designer_reward_last``,
``regret_positive_share``, ``minutes`` (and more).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _config(args):
    from spadekit.selfplay.config import load_config

    return load_config(args.preset, overrides=list(args.set or []))


def _engine(args) -> str:
    if args.engine == "auto":
        return "vllm" if importlib.util.find_spec("vllm") else "transformers"
    return args.engine


def _policy(spec: str, engine: str, seed: int):
    """The generation policy of ``spec`` (a model spec, or a run directory: its checkpoint)."""
    from spadekit.policy.registry import load_policy

    path = Path(spec)
    if (path / "run.sqlite").exists():
        import tempfile

        from spadekit.eval.models import load_eval_policy

        policy, _label = load_eval_policy(str(path), seed=seed)
        if engine != "vllm":
            return policy
        model = policy.model
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        folder = Path(tempfile.mkdtemp(prefix="designer-rl-"))
        model.save_pretrained(folder, state_dict=_merged_state(model))
        policy.tokenizer.save_pretrained(folder)
        return load_policy(f"vllm:{folder}", seed=seed)
    if engine == "vllm":
        name = spec[3:] if spec.startswith("hf:") else spec
        return load_policy(f"vllm:{name}", seed=seed)
    return load_policy(spec, seed=seed)


def _merged_state(model) -> dict:
    """The model's weights with every LoRA layer merged into its base weight, under the base
    model's own names (the policy runs the base module with the adapters injected, which has
    no ``merge_and_unload`` of its own)."""
    for module in model.modules():
        if hasattr(module, "base_layer") and hasattr(module, "merge"):
            module.merge()
    out = {}
    for name, tensor in model.state_dict().items():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def _run_programs(run_dir: Path) -> list:
    """Every environment a run stored and every program in its memory."""
    from spadekit.envs.program import EnvProgram
    from spadekit.runs.store import RunStore
    from spadekit.selfplay.memory import EnvironmentMemory

    store = RunStore.open(run_dir)
    try:
        programs = store.pool(active_only=False)
        programs += [EnvProgram(code=r.code, skill=r.skill)
                     for r in EnvironmentMemory(store).records()]
    finally:
        store.close()
    return programs


def phase_sample(args) -> None:
    """One measurement (run in its own process): ``--spec`` writes ``--samples`` programs."""
    from spadekit.envs.skills import skills_for
    from spadekit.runs.pool import load_pool
    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.designer_eval import sample_designs, summarize
    from spadekit.selfplay.procedural_pool import split_documents

    config = _config(args)
    known = load_pool(args.programs)
    if (Path(args.spec) / "run.sqlite").exists():  # after self-play: its memory and pool too
        known += _run_programs(Path(args.spec))
    _train, held = split_documents([(d.id, d.text) for d in load_corpus(config.corpus)],
                                   config.warmstart.seed)
    policy = _policy(args.spec, _engine(args), config.seed)
    clock = time.perf_counter()
    with SandboxPool(config.sandbox, warm=2) as pool, \
            Validator(pool, config.validation.settings(config.turn_cap), seed=args.seed) as v:
        samples = sample_designs(policy, config, v, n=args.samples, seed=args.seed,
                                 skills=skills_for(config.setting), documents=held,
                                 references=known, known=known)
    out = {**summarize(samples), "seconds": round(time.perf_counter() - clock, 1),
           "samples_detail": [s.to_dict() for s in samples]}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def _sub(args, out: Path, spec: str, name: str) -> dict:
    target = out / f"sample-{name}.json"
    cmd = [sys.executable, __file__, "--phase", "sample", "--spec", spec, "--json", str(target),
           "--programs", str(args.programs), "--samples", str(args.samples),
           "--seed", str(args.seed), "--preset", args.preset, "--engine", args.engine]
    for item in args.set or []:
        cmd += ["--set", item]
    print(f"[{name}] sampling {args.samples} designs from {spec}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(target.read_text())


def _rounds(run_dir: Path) -> tuple[list[dict], list[float]]:
    """Per round from the run database, and every designed environment's regret."""
    from spadekit.runs.store import RunStore

    store = RunStore.open(run_dir)
    try:
        names = ("designed", "valid", "valid_share", "pooled", "pool_designed",
                 "designer_reward", "regret", "designer/win_rate", "agent_mean_return",
                 "seconds")
        series = {n: dict(store.metrics(n)) for n in names}
        steps = sorted({s for values in series.values() for s in values})
        rows = []
        for step in steps:
            row = {"round": step}
            for n in names:
                if step in series[n]:
                    row[n.replace("/", "_")] = round(series[n][step], 4)
            rows.append(row)
        for event in store.events("round"):  # the dedup gate's refusals of the round
            data = event["data"]
            row = next((r for r in rows if r["round"] == data.get("step")), None)
            if row is None:
                continue
            dups = int((data.get("invalid_reasons") or {}).get("near_duplicate", 0))
            designed = data.get("designed") or 0
            row["near_duplicate"] = dups
            passed = int(data.get("valid") or 0) + dups  # sandbox-valid, before the gate
            row["sandbox_valid_share"] = round(passed / designed, 4) if designed else None
            row["novel_share"] = round((passed - dups) / passed, 4) if passed else None
        regrets = []
        for env in store.environments():
            if (env.get("lineage") or {}).get("bootstrap"):
                continue
            stats = store.env_stats(env["sha256"])
            if stats.get("regret_at_gen") is not None and not (
                    env.get("source") or "").startswith("memory"):
                regrets.append(float(stats["regret_at_gen"]))
    finally:
        store.close()
    return rows, regrets


def _plot(out: Path, phases: dict, rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(phases)
    width = 0.25
    for k, key in enumerate(("valid_share", "multiturn_share", "novel_share")):
        a.bar([i + k * width for i in range(len(names))],
              [phases[n].get(key) or 0.0 for n in names], width, label=key)
    a.set_xticks([i + width for i in range(len(names))], names)
    a.set_ylim(0, 1)
    a.set_title("designer outputs (held-out documents)")
    a.legend(fontsize=8)
    steps = [r["round"] for r in rows]
    for key in ("designer_reward", "regret", "valid_share"):
        b.plot(steps, [r.get(key) for r in rows], marker="o", label=key)
    b.set_xlabel("self-play round")
    b.set_title("per round (run.sqlite)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "designer.png", dpi=110)


def _examples(out: Path, phases: dict) -> None:
    lines = ["# Programs the designer wrote (benchmarks/designer.py)", ""]
    for name, result in phases.items():
        valid = [s for s in result["samples_detail"] if s["reason"] == "ok"]
        bad = [s for s in result["samples_detail"] if s["reason"] != "ok"]
        for s in (valid[:2] + bad[:1]):
            lines += [f"## {name}: {s['skill']}, {s['reason']}"
                      + (f", novel={s['novel']}, multi-turn={s['multiturn']}"
                         if s["reason"] == "ok" else ""), "", "````", s["text"][:6000], "````",
                      ""]
    (out / "examples.md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu-warm")
    ap.add_argument("--set", action="append", help="a config override key=value (repeatable)")
    ap.add_argument("--samples", type=int, default=16, help="designer outputs per phase")
    ap.add_argument("--rounds", type=int, default=8, help="self-play rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "designer"))
    ap.add_argument("--phase", default="all", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--programs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase == "sample":
        phase_sample(args)
        return
    from spadekit.selfplay.warm_cache import applies, progress_bars, warm_model_dir

    start = time.perf_counter()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    config = _config(args)
    if not applies(config):
        sys.exit(f"{args.preset}: no warm start configured (set warmstart.pool)")
    clock = time.perf_counter()
    with progress_bars() as progress:
        warm = warm_model_dir(config, progress=progress)
    warm_minutes = (time.perf_counter() - clock) / 60
    cached = warm_minutes < 1.0
    args.programs = str(warm.parent / "programs")
    phases = {"base": _sub(args, out, config.model, "base"),
              "warm": _sub(args, out, f"hf:{warm}", "warm")}
    run_dir = out / "run"
    rows, regrets = [], []
    if args.rounds > 0:
        cmd = [sys.executable, "-m", "spadekit", "selfplay", "--preset", args.preset,
               "--rounds", str(args.rounds), "--run-dir", str(run_dir),
               "--set", "tensorboard=false", "--set", f"checkpoint_every={args.rounds}"]
        for item in args.set or []:
            cmd += ["--set", item]
        print(f"[selfplay] {args.rounds} rounds from the warm start", flush=True)
        subprocess.run(cmd, check=True)
        rows, regrets = _rounds(run_dir)
        phases["rl"] = _sub(args, out, str(run_dir), "rl")
    rewarded = [r for r in rows if r.get("designer_reward") is not None]
    last = phases.get("rl") or phases["warm"]
    result = {
        "valid_share_base": phases["base"]["valid_share"],
        "valid_share_warm": phases["warm"]["valid_share"],
        "valid_share_rl": phases["rl"]["valid_share"] if "rl" in phases else None,
        "multiturn_share": last["multiturn_share"],
        "multiturn_share_warm": phases["warm"]["multiturn_share"],
        "novel_share": last["novel_share"],
        "novel_share_warm": phases["warm"]["novel_share"],
        "designer_reward_first": rewarded[0]["designer_reward"] if rewarded else None,
        "designer_reward_last": rewarded[-1]["designer_reward"] if rewarded else None,
        "regret_positive_share": round(sum(r > 0 for r in regrets) / len(regrets), 4)
        if regrets else None,
        "designed_envs_with_regret": len(regrets),
        "invalid_reasons": {k: v["invalid_reasons"] for k, v in phases.items()},
        "tokens_per_program": {k: v["tokens_mean"] for k, v in phases.items()},
        "rounds": rows, "samples": args.samples, "engine": _engine(args),
        "warmstart_minutes": round(warm_minutes, 2), "warmstart_cached": cached,
        "minutes": round((time.perf_counter() - start) / 60, 2),
        "out": str(out)}
    (out / "designer.json").write_text(json.dumps({**result, "phases": phases}, indent=1))
    _plot(out, phases, rows)
    _examples(out, phases)
    for name, p in phases.items():
        print(f"{name:>5}: valid {p['valid']}/{p['samples']}, multi-turn "
              f"{p['multiturn_share']}, novel {p['novel_share']}, reasons "
              f"{p['invalid_reasons']}, {p['tokens_mean']} tokens, {p['seconds']} s")
    for row in rows:
        print("  round", json.dumps(row))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
