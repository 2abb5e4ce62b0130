"""Train a model for a few GRPO steps with TRL on a pool's environments, on CPU.

    python examples/trl_pool.py POOL [--model bundled|tiny] [--steps N] [--out DIR]

POOL is anything ``spadekit.runs.sources.load_programs`` reads: an exported or generated pool
directory, a run directory, ``library:games``, a directory of ``.py`` programs. Each program runs in
spadekit's sandbox; TRL's ``GRPOTrainer`` plays it through its ``environment_factory`` (the
``act`` tool; the environment's own reward; the hint withheld). ``--model bundled`` is the
bundled SmolLM2-135M-Instruct, ``tiny`` spadekit's 70k-parameter test model. Ends with one JSON
line: steps done, the mean environment reward of each step, seconds, whether GRPO changed the
weights. A model that never calls tools earns 0 everywhere, so GRPO would learn nothing: first
``--teach-steps`` supervised steps show it one ``act`` call per environment (``teach_act_format``).
Needs the ``trl`` extra (``bash install.sh`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def load_model(name: str):
    """(model, tokenizer) of ``name`` (``bundled`` or ``tiny``), tokenizer ready for tool calls."""
    from spadekit.integrations.trl import tool_chat_template

    if name == "tiny":
        from spadekit.policy.tiny import tiny_model, tiny_tokenizer

        model, tokenizer = tiny_model(), tiny_tokenizer()
    else:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from spadekit.policy.bundled import ensure_smollm2_cache

        path = ensure_smollm2_cache()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tool_chat_template(tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pool", help="an exported pool, a pool or run directory, library:games, "
                                     "or a directory of .py programs")
    parser.add_argument("--model", choices=("bundled", "tiny"), default="bundled")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=None,
                        help="trainer output directory (default: a temp dir)")
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=None,
                        help="tokens per completion (default: 48 for bundled, 160 for tiny, "
                             "whose tokens are bytes)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--teach-steps", type=int, default=None,
                        help="supervised steps on the act call before GRPO (default: 2 for "
                             "bundled, 200 for tiny; 0: none)")
    parser.add_argument("--teach-programs", type=int, default=4,
                        help="environments shown in those steps (one act call each)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    from trl import GRPOConfig, GRPOTrainer

    from spadekit.integrations.trl import PoolEnvironments, teach_act_format

    started = time.monotonic()
    torch.manual_seed(args.seed)
    bundled = args.model == "bundled"
    model, tokenizer = load_model(args.model)
    completion_length = args.max_completion_length or (48 if bundled else 160)
    teach_steps = args.teach_steps if args.teach_steps is not None else (2 if bundled else 200)
    out = args.out or tempfile.mkdtemp(prefix="trl_pool_")
    config = GRPOConfig(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.generations,
        num_generations=args.generations, max_completion_length=completion_length,
        max_tool_calling_iterations=args.max_turns, use_cpu=True, use_vllm=False,
        learning_rate=1e-5 if bundled else 1e-3, logging_steps=1, save_strategy="no",
        report_to=[], seed=args.seed, bf16=False, disable_tqdm=True)
    with PoolEnvironments(args.pool, max_turns=args.max_turns, seeds_per_env=2) as envs:
        teach_loss = None
        if teach_steps > 0:
            teach_loss = teach_act_format(model, tokenizer, envs, steps=teach_steps,
                                          lr=1e-4 if bundled else 3e-3,
                                          max_programs=args.teach_programs)
        before = [p.detach().clone() for p in model.parameters()]
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                              train_dataset=envs.dataset(), environment_factory=envs.factory)
        trainer.train()
    logs = [row for row in trainer.state.log_history if "reward" in row]
    changed = any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    summary = {"steps": trainer.state.global_step, "model": args.model,
               "mean_env_reward": [round(row.get("rewards/PoolEnv/mean", row["reward"]), 4)
                                   for row in logs],
               "tool_calls_per_completion": [round(row.get("tools/call_frequency", 0.0), 4)
                                             for row in logs],
               "teach_steps": teach_steps,
               "teach_loss": None if teach_loss is None else round(teach_loss, 4),
               "seconds": round(time.monotonic() - started, 1), "weights_changed": changed,
               "out": out}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
