"""Environment work on Ray actors (``spadekit.rollout.ray_envs``) against the local pool.

1. Scaling: library programs (distinct copies, as designed ones would be) are started and then
   stepped with scripted actions, no model, through an ``EnvSession`` with 1 and with 2 Ray
   workers: environment steps per second of the step phase;
   ``scaling_efficiency_2_workers = steps/s with 2 / (2 * steps/s with 1)``.
2. A paper-shaped round's environment work, as ``benchmarks/round_overhead.py`` shapes it
   (24 programs x 32 episodes x up to 10 turns, a scripted policy that answers at once), played
   by ``RolloutEngine`` on the local pool and on ``RayEnvBackend(workers)`` (the same seeds
   every round, so both sides play the very same episodes; best round of each):
   ``ray_vs_local_round = local time / Ray time`` (above 1: Ray is faster).

On one small machine both sides share the same cores (and Ray's own processes use some), so
expect an efficiency well below 1 there; the numbers mean most on several nodes
(``--address auto``). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.envs import library  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.common.cpus import usable_cpus  # noqa: E402
from spadekit.common.errors import SandboxError  # noqa: E402
from spadekit.rollout.ray_envs import RayEnvBackend  # noqa: E402
from spadekit.policy.scripted import ScriptedPolicy  # noqa: E402
from spadekit.policy.tiny import tiny_tokenizer  # noqa: E402
from spadekit.rollout.engine import (EnvBackend, EpisodeSpec, LocalPoolBackend,  # noqa: E402
                              RolloutConfig, RolloutEngine)
from spadekit.sandbox import SandboxPool  # noqa: E402

ANSWERS = ["\\boxed{1}", "\\boxed{guess 1234}", "\\boxed{mod 7}", "\\boxed{up}",
           '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "\\boxed{inspect 1}"]


def programs(n: int) -> list[EnvProgram]:
    entries = library.list_library()
    out = []
    for i in range(n):
        e = entries[i % len(entries)]
        code = library.source(e.name) + f"\n# copy {i}\n"  # distinct program, own sandbox
        out.append(EnvProgram(code=code, skill=e.skill, domain=e.setting))
    return out


def env_steps(backend: EnvBackend, progs: list[EnvProgram], plays: int, turns: int,
              seed: int) -> dict:
    """Start ``plays`` episodes of each program, then step every live one until all end."""
    items = [(p.sha256, p.code, turns, seed * 100_000 + i)
             for p in progs for i in range(plays)]
    with backend.session() as session:
        t0 = time.perf_counter()
        started = session.start(items)
        start_s = time.perf_counter() - t0
        live = [(r[0], i) for i, r in enumerate(started) if not isinstance(r, SandboxError)]
        failures = len(items) - len(live)
        steps, t1 = 0, time.perf_counter()
        for turn in range(turns):
            if not live:
                break
            results = session.step([(h, ANSWERS[(i + turn) % len(ANSWERS)]) for h, i in live])
            steps += len(live)
            failures += sum(isinstance(r, SandboxError) for r in results)
            live = [x for x, r in zip(live, results)
                    if not isinstance(r, SandboxError) and not (r[2] or r[3])]
        step_s = time.perf_counter() - t1
    return {"start_s": start_s, "step_s": step_s, "steps": steps, "failures": failures,
            "steps_per_s": steps / step_s if step_s else 0.0}


def best_of(fn, rounds: int) -> dict:
    runs = [fn(r) for r in range(rounds)]
    return max(runs, key=lambda x: x["steps_per_s"])


def play_round(engine: RolloutEngine, progs: list[EnvProgram], plays: int, seed: int) -> dict:
    specs = [EpisodeSpec(p, seed=seed * 100_000 + i) for p in progs for i in range(plays)]
    t0 = time.perf_counter()
    trajs = engine.run(specs)
    return {"round_s": time.perf_counter() - t0, "steps": sum(len(t.turns) for t in trajs),
            "env_s": engine.stats["env_s"], "failures": sum(1 for t in trajs if t.failure)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default=None, help="Ray address (default: a local Ray)")
    ap.add_argument("--num-cpus", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2, help="Ray workers for the round")
    ap.add_argument("--scale-envs", type=int, default=24)
    ap.add_argument("--scale-plays", type=int, default=32)
    ap.add_argument("--envs", type=int, default=24)
    ap.add_argument("--plays", type=int, default=32)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokenizer", choices=["smollm2", "tiny"], default="smollm2")
    args = ap.parse_args()

    import ray

    t = time.perf_counter()
    if args.address:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=args.num_cpus or usable_cpus(), include_dashboard=False,
                 log_to_driver=False)
    ray_init_s = time.perf_counter() - t

    # 1. scaling of the environment work alone
    scale_progs = programs(args.scale_envs)
    warm = args.scale_envs
    scale: dict[str, dict] = {}
    with SandboxPool(warm=warm) as pool:
        time.sleep(2.0)
        scale["local"] = best_of(lambda r: env_steps(LocalPoolBackend(pool), scale_progs,
                                                     args.scale_plays, args.turns, r),
                                 args.rounds + 1)
    for n in (1, 2):
        t = time.perf_counter()
        with RayEnvBackend(n, warm=warm // n + 1) as backend:
            backend.workers_info()  # actors up, pools detecting and booting
            actors_s = time.perf_counter() - t
            time.sleep(2.0)
            scale[f"ray_{n}"] = best_of(lambda r: env_steps(backend, scale_progs,
                                                            args.scale_plays, args.turns, r),
                                        args.rounds + 1)
            scale[f"ray_{n}"]["actors_up_s"] = actors_s
    efficiency = scale["ray_2"]["steps_per_s"] / (2 * scale["ray_1"]["steps_per_s"])

    # 2. a paper-shaped round's environment work, local pool vs Ray
    tokenizer = tiny_tokenizer()
    if args.tokenizer == "smollm2":
        from transformers import AutoTokenizer

        from spadekit.policy.bundled import ensure_smollm2_cache

        tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2_cache(), local_files_only=True)
    policy = ScriptedPolicy(tokenizer, lambda ids, _t: ANSWERS[hash(tuple(ids)) % len(ANSWERS)],
                            decode_prompt=False)
    progs = programs(args.envs)
    config = RolloutConfig(max_turns=args.turns, max_new_tokens=256, max_context_tokens=65536,
                           load_workers=8)
    rounds: dict[str, list[dict]] = {"local": [], "ray": []}
    with SandboxPool(warm=args.envs) as pool:
        engine = RolloutEngine(policy, pool, config)
        time.sleep(3.0)  # one warm worker per program, as round_overhead.py
        for _ in range(args.rounds):
            rounds["local"].append(play_round(engine, progs, args.plays, 0))
    with RayEnvBackend(args.workers, warm=args.envs // args.workers + 1) as backend:
        backend.workers_info()
        time.sleep(3.0)
        engine = RolloutEngine(policy, backend, config)
        for _ in range(args.rounds):
            rounds["ray"].append(play_round(engine, progs, args.plays, 0))
    local = min(rounds["local"], key=lambda x: x["round_s"])
    on_ray = min(rounds["ray"], key=lambda x: x["round_s"])
    ray.shutdown()

    result = {
        "cpus": os.cpu_count(), "ray_init_s": round(ray_init_s, 2),
        "scale_workload": f"{args.scale_envs} programs x {args.scale_plays} episodes x up to "
                          f"{args.turns} steps",
        "local_steps_per_s": round(scale["local"]["steps_per_s"], 1),
        "ray_1_steps_per_s": round(scale["ray_1"]["steps_per_s"], 1),
        "ray_2_steps_per_s": round(scale["ray_2"]["steps_per_s"], 1),
        "ray_1_start_s": round(scale["ray_1"]["start_s"], 3),
        "ray_2_start_s": round(scale["ray_2"]["start_s"], 3),
        "local_start_s": round(scale["local"]["start_s"], 3),
        "scaling_efficiency_2_workers": round(efficiency, 3),
        "round_workload": f"{args.envs} programs x {args.plays} episodes x up to {args.turns} "
                          f"turns, {args.workers} Ray workers, {args.tokenizer} tokenizer",
        "local_round_s": round(local["round_s"], 3), "ray_round_s": round(on_ray["round_s"], 3),
        "local_round_env_s": round(local["env_s"], 3),
        "ray_round_env_s": round(on_ray["env_s"], 3),
        "round_steps": [local["steps"], on_ray["steps"]],
        "ray_vs_local_round": round(local["round_s"] / on_ray["round_s"], 3),
        "failures": sum(x["failures"] for x in scale.values()) + local["failures"]
        + on_ray["failures"],
    }
    print(f"steps/s: local {result['local_steps_per_s']}, Ray 1 worker "
          f"{result['ray_1_steps_per_s']}, 2 workers {result['ray_2_steps_per_s']} -> "
          f"efficiency {result['scaling_efficiency_2_workers']}; round: local "
          f"{result['local_round_s']} s, Ray {result['ray_round_s']} s -> ray_vs_local_round "
          f"{result['ray_vs_local_round']} ({result['cpus']} CPUs)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
