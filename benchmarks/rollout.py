"""Rollout engine benchmark: the engine against raw batched ``generate`` on the same prompts.

1. The engine plays N episodes of library environments (batch 16 by default) with the tiny model
   (or --model); every batched request it sends to the policy is recorded.
2. The same request batches are replayed straight into ``policy.generate`` (seeded, so the very
   same tokens are produced): that is the raw model cost of those tokens.

engine_vs_raw_throughput = raw time / engine time (sampled tokens per second, engine over raw);
outside_model_share = share of the engine's wall time spent outside ``policy.generate``
(sandbox steps, parsing, rendering, bookkeeping). Targets: >= 0.9 and <= 0.05 at batch 16.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.envs import library  # noqa: E402
from spadekit.envs.program import EnvProgram  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from spadekit.sandbox import SandboxPool  # noqa: E402


class Recording:
    """Delegates to a policy and keeps every batch of requests it was given."""

    def __init__(self, policy) -> None:
        self.inner = policy
        self.name = policy.name
        self.capabilities = policy.capabilities
        self.tokenizer = policy.tokenizer
        self.batches: list = []

    def render(self, *args, **kwargs):
        return self.inner.render(*args, **kwargs)

    def generate(self, requests):
        self.batches.append(list(requests))
        return self.inner.generate(requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--setting", choices=["games", "tooluse", "both"], default="games")
    args = ap.parse_args()

    policy = Recording(load_policy(args.model))
    entries = [e for e in library.list_library()
               if args.setting == "both" or e.setting == args.setting]
    programs = [EnvProgram(code=library.source(e.name), domain=e.setting) for e in entries]
    specs = [EpisodeSpec(programs[i % len(programs)], seed=i) for i in range(args.episodes)]
    config = RolloutConfig(max_turns=args.turns, max_new_tokens=args.max_new_tokens, seed=0,
                           max_context_tokens=32768)
    with SandboxPool(warm=min(len(programs), 8)) as pool:
        engine = RolloutEngine(policy, pool, config)
        engine.run(specs[:2])  # warm up the model and the pool
        policy.batches.clear()
        time.sleep(2.0)  # let the pool boot its warm workers again
        t = time.perf_counter()
        trajs = engine.run(specs)
        engine_s = time.perf_counter() - t
        stats = dict(engine.stats)
    tokens = sum(tr.num_sampled for tr in trajs)
    t = time.perf_counter()
    raw_tokens = 0
    for batch in policy.batches:
        raw_tokens += sum(g.num_tokens for g in policy.inner.generate(batch))
    raw_s = time.perf_counter() - t
    result = {
        "model": args.model, "episodes": args.episodes, "turns": stats["turns"],
        "sampled_tokens": tokens, "raw_tokens": raw_tokens,
        "engine_s": round(engine_s, 3), "raw_generate_s": round(raw_s, 3),
        "engine_tokens_per_s": round(tokens / engine_s, 1),
        "raw_tokens_per_s": round(raw_tokens / raw_s, 1),
        "engine_vs_raw_throughput": round((tokens / engine_s) / (raw_tokens / raw_s), 3),
        "outside_model_share": round(1 - stats["model_s"] / engine_s, 4),
        "env_s": round(stats["env_s"], 3),
        "failures": sum(1 for tr in trajs if tr.failure),
    }
    for key, value in result.items():
        print(f"{key:28s} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
