"""How much do the format aids help a model write the reply format? (issue 17)

Agent: ``--agent-n`` replies of the model to the first observation of a library game (one turn,
seeded), under each agent aid: none, the response prefix ``\\boxed{``, the demonstrations, both.
It counts replies whose text (prefix + reply, as the environment gets it) holds a closed box,
replies the game accepts as a command, and the mean one-turn reward.

Designer: ``--designer-n`` designs by the model through the real design phase (the loop's prompt
with memory seeds from the library, real validation in the sandbox), under each designer
prefix; it reports the valid share and the rejection reasons.

The last line is one JSON object with every figure and ``n`` per cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.selfplay.config import load_config  # noqa: E402
from spadekit.envs import library  # noqa: E402
from spadekit.envs.library.games_knapsack_reveal import extract_boxed  # noqa: E402
from spadekit.policy.registry import load_policy  # noqa: E402
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from spadekit.sandbox import SandboxPool  # noqa: E402

AGENT_AIDS = {"none": {}, "prefix": {"response_prefix": {"games": "\\boxed{"}},
              "demonstrations": {"demonstrations": ("games",)},
              "both": {"response_prefix": {"games": "\\boxed{"}, "demonstrations": ("games",)}}
DESIGNER_AIDS = {"none": "", "code_block": "```python\n",
                 "code_block_and_class": "```python\nimport random\n\n\nclass "}


def agent_cell(policy, pool, game: str, aid: dict, n: int, max_new_tokens: int) -> dict:
    program = library.program(library.get(game))
    cfg = RolloutConfig(max_turns=1, max_new_tokens=max_new_tokens, temperature=0.6, seed=0,
                        **aid)
    trajs = RolloutEngine(policy, pool, cfg).run(
        [EpisodeSpec(program, seed=1000 + i) for i in range(n)])
    actions = [t.turns[0].action if t.turns else "" for t in trajs]
    boxed = [extract_boxed(a) is not None for a in actions]
    accepted = [bool(t.turns) and not t.turns[0].observation.startswith(("No command",
                                                                         "Unknown command"))
                for t in trajs]
    rewards = [t.turns[0].reward if t.turns else 0.0 for t in trajs]
    return {"n": n, "boxed_rate": sum(boxed) / n, "command_rate": sum(accepted) / n,
            "mean_reward": sum(rewards) / n, "examples": actions[:3]}


def designer_cell(policy, pool, prefix: str, n: int, max_new_tokens: int, seed: int) -> dict:
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.common.streams import RoundStreams
    from spadekit.selfplay.design import DesignPhase
    from spadekit.selfplay.memory import EnvironmentMemory
    from spadekit.runs.store import RunStore
    from spadekit.sandbox.validate import Validator, ValidatorSettings

    cfg = load_config("cpu-tiny", overrides=[f"envs_per_round={n}",
                                             f"designer.max_new_tokens={max_new_tokens}"])
    cfg = dataclasses.replace(cfg, designer=dataclasses.replace(cfg.designer,
                                                                response_prefix=prefix))
    with tempfile.TemporaryDirectory() as tmp, RunStore(Path(tmp), create=True) as store:
        memory = EnvironmentMemory(store, cap=cfg.memory_size,
                                   duplicate_threshold=cfg.dedup_threshold)
        memory.seed_from_library()
        phase = DesignPhase(cfg, policy, pool,
                            Validator(pool, ValidatorSettings(max_turns=cfg.turn_cap)),
                            store, memory, load_corpus(None, seed=seed))
        out = phase.run(0, RoundStreams(seed, 0))
    return {"n": out.attempted, "valid": out.valid, "valid_share": out.valid_share,
            "reasons": out.reasons, "designer_tokens": out.designer_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--game", default="games_knapsack_reveal")
    ap.add_argument("--agent-n", type=int, default=16)
    ap.add_argument("--designer-n", type=int, default=6)
    ap.add_argument("--agent-tokens", type=int, default=48)
    ap.add_argument("--designer-tokens", type=int, default=512)
    ap.add_argument("--skip-designer", action="store_true")
    ap.add_argument("--skip-agent", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    policy = load_policy(args.model)
    result: dict = {"model": args.model, "game": args.game, "agent": {}, "designer": {}}
    with SandboxPool(warm=2) as pool:
        for name, aid in ({} if args.skip_agent else AGENT_AIDS).items():
            result["agent"][name] = agent_cell(policy, pool, args.game, aid, args.agent_n,
                                               args.agent_tokens)
            print(json.dumps({"agent_aid": name, **result["agent"][name]}), flush=True)
        if not args.skip_designer:
            for name, prefix in DESIGNER_AIDS.items():
                result["designer"][name] = designer_cell(policy, pool, prefix, args.designer_n,
                                                         args.designer_tokens, 0)
                print(json.dumps({"designer_aid": name, **result["designer"][name]}),
                      flush=True)
    result["minutes"] = round((time.perf_counter() - t0) / 60, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
