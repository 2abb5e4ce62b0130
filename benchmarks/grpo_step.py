"""GRPO step benchmark: ``PolicyTrainer.train_step`` against TRL's ``GRPOTrainer`` loss + backward.

Both sides get the same tiny Llama (same seed and size), the same batch of sequences (prompts and
completions of varied length, one advantage each) and the same knobs: token-level aggregation
over the whole batch (ours ``loss_type="token"``, TRL's ``"dapo"``), clip 0.2 / 0.28, beta 0,
one iteration, micro-batches of 8 sequences, AdamW (lr 1e-6, wd 0.1, betas 0.9/0.98),
gradient clipping at 1.0. One step = forward + backward over every micro-batch, clip, optimizer
step; TRL's side calls its own ``GRPOTrainer.compute_loss`` on inputs laid out as its
``_generate_and_score_completions`` lays them out (prompts left-padded, completions right-padded
over the whole batch, ``num_items_in_batch`` = the batch's completion tokens), then backward,
clip and step with the optimizer the trainer creates.

Time: both sides live in one process (same thread count) and their steps alternate, after one
warm-up step each, so load from other work on the machine hits both alike;
``time_ratio_vs_trl`` is the median over rounds of ours / TRL's step seconds. Memory: each side
in its own fresh process (``MALLOC_MMAP_THRESHOLD_`` fixed so freed buffers leave the resident
set and it follows live memory): one warm-up step, then the rise of the resident set's
high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) over the resident set before
the measured steps. Both sides' first losses and gradient norms are printed too: they must agree
(same objective, same batch, same weights).

time_ratio_vs_trl and peak_mem_ratio_vs_trl are ours / TRL's (targets <= 1.0 each). The last
line is one JSON object. TRL is optional: ``pip install trl==1.16.0`` (it needs no other torch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from spadekit.common.cpus import usable_cpus  # noqa: E402


# -- the shared batch ---------------------------------------------------------------------------

def make_batch(args) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(args.seed)
    out = []
    for i in range(args.sequences):
        p = int(torch.randint(args.prompt_len // 2, args.prompt_len + 1, (), generator=g))
        c = int(torch.randint(args.completion_len // 8, args.completion_len + 1, (), generator=g))
        if args.fixed_lengths:  # no padding on either side: the per-token cost alone
            p, c = args.prompt_len, args.completion_len
        out.append({"prompt": torch.randint(0, 256, (p,), generator=g).tolist(),
                    "completion": torch.randint(0, 256, (c,), generator=g).tolist(),
                    "advantage": float(torch.randn((), generator=g))})
    return out


def build_model(args):
    from spadekit.policy.tiny import tiny_model

    return tiny_model(args.seed, hidden=args.hidden, layers=args.layers)


# -- memory probe ---------------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory(step, repeats: int) -> dict:
    """Warm-up step (optimizer state allocated), then the resident set's high-water mark over
    ``repeats`` steps, as a rise over the resident set before them."""
    import gc

    step()
    gc.collect()
    exact = _reset_hwm()
    base_kb = _status_kb("VmRSS")
    for _ in range(repeats):
        step()
    peak_kb = _status_kb("VmHWM")
    return {"peak_mb": max(peak_kb - base_kb, 0) / 1024.0, "rss_mb": base_kb / 1024.0,
            "hwm_reset": exact}


# -- the two contenders ---------------------------------------------------------------------------

def build_ours(args, batch):
    from spadekit.selfplay.advantages import Sample
    from spadekit.policy.hf import HFPolicy
    from spadekit.policy.tiny import tiny_tokenizer
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    policy = HFPolicy(build_model(args), tiny_tokenizer(), name="tiny")
    width = args.prompt_len + args.completion_len
    cfg = TrainConfig(learning_rate=1e-6, per_device_train_batch_size=args.micro,
                      max_tokens_per_microbatch=args.micro * width, loss_type="token",
                      seed=args.seed)
    trainer = PolicyTrainer(policy, cfg)
    samples = [Sample(role="agent", group_id=f"g{i // 8}", token_ids=s["prompt"] + s["completion"],
                      loss_mask=[0] * len(s["prompt"]) + [1] * len(s["completion"]),
                      behaviour_logprobs=None, advantage=s["advantage"])
               for i, s in enumerate(batch)]

    def step():
        stats = trainer.train_step(samples)
        return stats["loss"], stats["grad_norm"]

    return step


def build_trl(args, batch):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from spadekit.policy.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = build_model(args)
    tmp = tempfile.mkdtemp(prefix="trl-bench-")
    config = GRPOConfig(
        output_dir=tmp, report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=max(1, args.sequences // args.micro),
        num_generations=8, max_completion_length=args.completion_len, loss_type="dapo",
        beta=0.0, epsilon=0.2, epsilon_high=0.28, num_iterations=1, learning_rate=1e-6,
        weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.98, max_grad_norm=1.0,
        lr_scheduler_type="constant", seed=args.seed, logging_steps=10**6, save_strategy="no",
        gradient_checkpointing=False)  # TRL defaults to True; ours to False: compare like with like
    dataset = Dataset.from_dict({"prompt": ["pick a letter"] * args.sequences})
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(
        completions)], args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.create_optimizer()
    # set by Trainer's training loop, which we do not run: one optimizer step per batch
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    optimizer = trainer.optimizer
    model = trainer.model
    pad = tokenizer.pad_token_id
    # the layout of _generate_and_score_completions: over the whole generation batch
    p_width = max(len(s["prompt"]) for s in batch)
    c_width = max(len(s["completion"]) for s in batch)
    n = len(batch)
    prompt_ids = torch.full((n, p_width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_width), dtype=torch.long)
    completion_ids = torch.full((n, c_width), pad, dtype=torch.long)
    completion_mask = torch.zeros((n, c_width), dtype=torch.long)
    for i, s in enumerate(batch):
        p, c = s["prompt"], s["completion"]
        prompt_ids[i, p_width - len(p):] = torch.tensor(p)
        prompt_mask[i, p_width - len(p):] = 1
        completion_ids[i, :len(c)] = torch.tensor(c)
        completion_mask[i, :len(c)] = 1
    advantages = torch.tensor([s["advantage"] for s in batch])
    total = completion_mask.sum()
    micro = [{"prompt_ids": prompt_ids[rows], "prompt_mask": prompt_mask[rows],
              "completion_ids": completion_ids[rows], "completion_mask": completion_mask[rows],
              "advantages": advantages[rows], "num_items_in_batch": total}
             for rows in (slice(a, a + args.micro) for a in range(0, n, args.micro))]

    def step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for inputs in micro:
            loss = trainer.compute_loss(model, inputs, num_items_in_batch=total)
            loss.backward()
            loss_sum += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum, float(norm)

    return step


# -- driver ---------------------------------------------------------------------------------------

BUILDERS = {"ours": build_ours, "trl": build_trl}


def worker(args) -> None:
    """``time``: both contenders in this process, steps interleaved (ours, TRL, TRL, ours, ...)
    so machine load hits both alike; ``mem-ours`` / ``mem-trl``: one contender, memory only."""
    import torch

    torch.set_num_threads(args.threads)
    batch = make_batch(args)
    if args.worker.startswith("mem-"):
        result = peak_memory(BUILDERS[args.worker[4:]](args, batch), args.mem_repeats)
    else:
        names = ["ours"] + (["trl"] if args.with_trl else [])
        steps = {n: BUILDERS[n](args, batch) for n in names}
        first = {n: steps[n]() for n in names}  # warm-up; also the losses to compare
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                t = time.perf_counter()
                steps[n]()
                times[n].append(time.perf_counter() - t)
        result = {n: {"step_s": statistics.median(times[n]),
                      "step_s_all": [round(x, 4) for x in times[n]],
                      "first_loss": first[n][0], "first_grad_norm": first[n][1]} for n in names}
        if args.with_trl:
            result["paired_ratio"] = statistics.median(
                a / b for a, b in zip(times["ours"], times["trl"]))
    print("RESULT " + json.dumps(result))


def spawn(args, which: str, **extra) -> dict:
    opts = dict(vars(args), worker=which, **extra)
    cmd = [sys.executable, __file__]
    for k, v in opts.items():
        if isinstance(v, bool):
            cmd += [f"--{k.replace('_', '-')}"] if v else []
        elif v is not None:
            cmd.append(f"--{k.replace('_', '-')}={v}")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
    if which.startswith("mem-"):
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed buffers leave the resident set
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"{which} worker failed (rc {proc.returncode}): {' | '.join(tail)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--micro", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--completion-len", type=int, default=192)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per contender")
    ap.add_argument("--mem-repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=max(1, min(usable_cpus(), 4)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixed-lengths", action="store_true",
                    help="every prompt and completion at full length (no padding anywhere)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--with-trl", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    result: dict = {"sequences": args.sequences, "micro_batch": args.micro,
                    "lengths": "fixed" if args.fixed_lengths else "varied",
                    "model": f"tiny llama hidden {args.hidden}, {args.layers} layers",
                    "threads": args.threads,
                    "time_ratio_vs_trl": None, "peak_mem_ratio_vs_trl": None}  # set below
    try:
        import trl

        result["trl_version"] = trl.__version__
        with_trl = True
    except ImportError as exc:
        result["trl"] = f"unavailable: {exc} (pip install trl==1.16.0)"
        with_trl = False
    try:
        timing = spawn(args, "time", with_trl=with_trl)
    except RuntimeError as exc:  # TRL broke the shared process: measure ours alone
        if not with_trl:
            raise
        result["trl"] = f"unavailable: {exc}"
        with_trl = False
        timing = spawn(args, "time", with_trl=False)
    ours_mem = spawn(args, "mem-ours")
    ours = timing["ours"]
    result.update(ours_step_s=round(ours["step_s"], 4), ours_peak_mb=round(ours_mem["peak_mb"], 2),
                  ours_loss=ours["first_loss"], ours_grad_norm=ours["first_grad_norm"])
    if with_trl:
        theirs = timing["trl"]
        trl_mem = spawn(args, "mem-trl")
        result.update({
            "trl_step_s": round(theirs["step_s"], 4), "trl_peak_mb": round(trl_mem["peak_mb"], 2),
            "trl_loss": theirs["first_loss"], "trl_grad_norm": theirs["first_grad_norm"],
            "loss_abs_diff": abs(ours["first_loss"] - theirs["first_loss"]),
            "grad_norm_rel_diff": abs(ours["first_grad_norm"] - theirs["first_grad_norm"])
            / max(abs(theirs["first_grad_norm"]), 1e-12),
            "ours_step_s_all": ours["step_s_all"], "trl_step_s_all": theirs["step_s_all"],
            "time_ratio_vs_trl": round(timing["paired_ratio"], 3),
            "peak_mem_ratio_vs_trl": round(ours_mem["peak_mb"] / max(trl_mem["peak_mb"], 1e-6), 3),
            "memory_probe": "VmHWM rise over one warm step" if ours_mem["hwm_reset"]
            and trl_mem["hwm_reset"] else "VmHWM (not resettable: includes setup)"})
    for key, value in result.items():
        print(f"{key:24s} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
