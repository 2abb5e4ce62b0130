"""Does the agent learn? The bundled model on two reference games, agent-only GRPO.

Win rate (share of episodes with return > 0) and mean return on held-out seeds, measured before
and after N rounds of agent-only training on training seeds: each round plays every game
``--plays`` times, computes GRPO advantages within each game, and takes one update. The
designer is not involved (``spadekit selfplay`` trains both roles); this isolates the agent's
learning signal. Slow on a CPU: minutes per round with smollm2-135m.

The last line is one JSON object with ``win_rate_before`` and ``win_rate_after``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.selfplay.advantages import Sample, agent_advantages  # noqa: E402
from spadekit.envs import library  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from spadekit.sandbox import SandboxPool  # noqa: E402
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.trainer import PolicyTrainer  # noqa: E402


def evaluate(engine, programs, seeds):
    trajs = engine.run([EpisodeSpec(p, seed=s) for p in programs for s in seeds])
    returns = [t.episode_return for t in trajs]
    return sum(r > 0 for r in returns) / len(returns), sum(returns) / len(returns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--games", default="games_knapsack_reveal,games_modular_search")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--plays", type=int, default=8)
    ap.add_argument("--eval-seeds", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--learning-rate", type=float, default=2e-5)
    args = ap.parse_args()

    policy = load_policy(args.model)
    programs = [EnvProgram(code=library.source(name), domain="games")
                for name in args.games.split(",")]
    config = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                           temperature=0.6, max_context_tokens=4096, seed=0)
    trainer = PolicyTrainer(policy, TrainConfig(learning_rate=args.learning_rate,
                                                temperature=0.6, use_peft=True,
                                                max_tokens_per_microbatch=2048))
    held_out = list(range(10_000, 10_000 + args.eval_seeds))
    rng = random.Random(0)
    history = []
    with SandboxPool(warm=2) as pool:
        engine = RolloutEngine(policy, pool, config)
        t0 = time.perf_counter()
        before = evaluate(engine, programs, held_out)
        for r in range(args.rounds):
            specs = [EpisodeSpec(p, seed=rng.randrange(10_000), tag={"env": i})
                     for i, p in enumerate(programs) for _ in range(args.plays)]
            trajs = engine.run(specs)
            returns: dict[str, list[float]] = {}
            for tr in trajs:
                returns.setdefault(str(tr.spec.tag["env"]), []).append(tr.episode_return)
            advs = agent_advantages(returns)
            samples, seen = [], {k: 0 for k in returns}
            for tr in trajs:
                key = str(tr.spec.tag["env"])
                adv = advs[key][seen[key]]
                seen[key] += 1
                if tr.num_sampled:
                    samples.append(Sample(role="agent", group_id=key, token_ids=tr.token_ids,
                                          loss_mask=tr.loss_mask,
                                          behaviour_logprobs=tr.logprobs, advantage=adv))
            stats = trainer.train_step(samples)
            mean = sum(sum(v) for v in returns.values()) / len(trajs)
            history.append({"round": r, "train_mean_return": round(mean, 4),
                            "loss": stats.get("loss"), "seconds": round(stats["seconds"], 1)})
            print(json.dumps(history[-1]), flush=True)
        after = evaluate(engine, programs, held_out)
    result = {"model": args.model, "games": args.games.split(","), "rounds": args.rounds,
              "plays_per_game": args.plays, "eval_episodes": len(programs) * len(held_out),
              "win_rate_before": round(before[0], 4), "win_rate_after": round(after[0], 4),
              "mean_return_before": round(before[1], 4), "mean_return_after": round(after[1], 4),
              "seconds": round(time.perf_counter() - t0, 1), "history": history}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
