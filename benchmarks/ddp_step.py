"""Multi-process ``PolicyTrainer.train_step``: seconds per step and tokens/s, one process or many.

Run it alone for the single-process number, under a launcher for DDP/FSDP (CPU: gloo; GPUs:
NCCL, one process per GPU)::

    python benchmarks/ddp_step.py
    torchrun --nproc_per_node 2 benchmarks/ddp_step.py
    accelerate launch --multi_gpu --num_processes 2 benchmarks/ddp_step.py --strategy fsdp

Every rank builds the same tiny Llama (same seed) and passes the same global batch; each trains
its share (``split_batches``). Rank 0 prints one JSON line: the median step seconds over
``--repeats`` steps after a warm-up step, global padded tokens per second, the world size and
strategy, and the first step's loss and gradient norm (equal, up to float rounding, for every
world size on the same batch: the update is the single-process update).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    import torch

    from spadekit.selfplay.advantages import Sample
    from spadekit.policy.hf import HFPolicy
    from spadekit.policy.tiny import tiny_model, tiny_tokenizer
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=32, help="global batch")
    ap.add_argument("--length", type=int, default=256, help="longest sequence")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--strategy", default="auto", help="auto, no, ddp or fsdp")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--backend", default=None,
                    help="process-group backend (TrainConfig.ddp_backend; default NCCL on CUDA, "
                         "else gloo): gloo puts two ranks on one GPU")
    args = ap.parse_args()

    g = torch.Generator().manual_seed(0)
    batch = []
    for i in range(args.sequences):
        n = args.length // 2 + (i * 37) % (args.length // 2)
        prompt = n // 3
        batch.append(Sample(role="agent", group_id=f"e{i % 4}",
                            token_ids=torch.randint(0, 256, (n,), generator=g).tolist(),
                            loss_mask=[0] * prompt + [1] * (n - prompt),
                            behaviour_logprobs=None, advantage=float(torch.randn((), generator=g))))
    knobs = {} if args.strategy == "auto" else {"distributed_strategy": args.strategy}
    if args.backend:
        knobs["ddp_backend"] = args.backend
    cfg = TrainConfig(learning_rate=1e-6, per_device_train_batch_size=args.micro,
                      use_peft=args.lora, **knobs)
    policy = HFPolicy(tiny_model(0, hidden=args.hidden, layers=args.layers), tiny_tokenizer())
    trainer = PolicyTrainer(policy, cfg)
    dist = getattr(trainer, "dist", None)  # None: a trainer from before multi-process support
    enabled = dist is not None and dist.enabled
    first = trainer.train_step(batch)  # warm-up
    times, tokens = [], first["num_padded_tokens"]
    for _ in range(args.repeats):
        if enabled:
            dist.barrier()
        t0 = time.perf_counter()
        trainer.train_step(batch)
        if enabled:
            dist.barrier()
        times.append(time.perf_counter() - t0)
    if dist is None or dist.is_main:
        median = statistics.median(times)
        print(json.dumps({"world_size": dist.world_size if dist else 1,
                          "strategy": dist.strategy if dist else "no",
                          "step_seconds": round(median, 4),
                          "tokens_per_second": round(tokens / median, 1),
                          "first_loss": first["loss"], "first_grad_norm": first["grad_norm"],
                          "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
