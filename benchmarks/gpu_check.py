"""The GPU check: run once on a GPU machine, record its figures in docs/gpu.md (issue 26).

Usage: python3 benchmarks/gpu_check.py [--size auto|0.5b|tiny] [--out FILE]

Needs only PyTorch, transformers and peft (accelerate optional) and no network: the model is a
Qwen2-architecture model built from a config with random weights (``--size 0.5b``: Qwen2.5-0.5B's
shape, about 494M parameters, bf16), so nothing is downloaded. On a machine without CUDA it runs
the same checks on a tiny model of the same architecture (``--size tiny``, the CI check), so
every code path is exercised before a GPU is ever at hand; ``"device": "cpu"`` in the JSON says
the figures are not GPU figures.

Each check is measured against a baseline in the same run where one exists, and one failing
check is reported with its error and does not stop the others:

- ``grpo_step``: ``spadekit.train.trainer.PolicyTrainer.train_step`` (full weights, bf16) on a
  batch of random sequences: padded tokens per second over three steps after a warm-up, the
  peak device memory of a step, and against it the same model's plain forward + backward of
  the same batch (``grpo_vs_plain``: what the loss machinery costs).
- ``generation``: ``model.generate`` tokens per second at batch 1, 8 and 64 (sampled, every row
  generating ``--new-tokens``), and the batch-64 speedup over batch 1.
- ``logprob_drift``: the logprobs of the sampled tokens as generation saw them
  (``log_softmax(scores / T)``) against the trainer's forward pass of the same sequences
  (``spadekit.train.loss.token_logprobs``), in bf16 and in fp32: max and mean |diff|.
- ``distributed``: one ``PolicyTrainer`` step in two processes (DDP, then FSDP; gloo, both on
  this machine's one device, ``benchmarks/ddp_step.py``) against the one-process step: the
  same first loss is the check.
- ``planner``: the generation planner's memory bound (``spadekit.eval.batching.plan_batches``,
  rows x longest prompt² <= ``DEFAULT_BATCH_CELLS``): prompts of mixed length, each planned call
  measured, peak memory per attention cell, and the largest call's peak.

The last line printed is one JSON object (also written to ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SIZES = {
    # Qwen2.5-0.5B's shape (random weights): 24 layers, 896 wide, GQA 14/2 heads
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 max_position_embeddings=4096, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=1024, tie_word_embeddings=True),
}
SHAPES = {  # batch sizes, sequence lengths and token counts per size
    "0.5b": {"train_rows": 16, "train_len": 1024, "new_tokens": 128, "batches": (1, 8, 64),
             "prompt": 256, "planner_widths": [64, 256, 512, 1024, 2048, 4096] * 4},
    "tiny": {"train_rows": 8, "train_len": 96, "new_tokens": 8, "batches": (1, 8, 64),
             "prompt": 16, "planner_widths": [8, 16, 32, 64, 128] * 4},
}


class _Policy:
    """What ``PolicyTrainer`` needs of a policy: the model (and a tokenizer only to save)."""

    def __init__(self, model: Any) -> None:
        self.model, self.tokenizer = model, None


def _model(size: str, device: Any, dtype: Any, seed: int = 0) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(**SIZES[size], torch_dtype=dtype, attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    return model.to(device)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mb(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _batch(rows: int, length: int, vocab: int, seed: int = 0) -> list:
    import torch

    from spadekit.train.sample import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        n = length // 2 + (i * 37) % (length // 2)
        prompt = n // 3
        out.append(Sample(role="agent", group_id=f"e{i % 4}",
                          token_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                          loss_mask=[0] * prompt + [1] * (n - prompt), behaviour_logprobs=None,
                          advantage=float(torch.randn((), generator=g))))
    return out


def check_grpo_step(size: str, device: Any, dtype: Any) -> dict:
    import torch

    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    shape = SHAPES[size]
    model = _model(size, device, dtype)
    batch = _batch(shape["train_rows"], shape["train_len"], SIZES[size]["vocab_size"])
    trainer = PolicyTrainer(_Policy(model), TrainConfig(
        learning_rate=1e-6, per_device_train_batch_size=4, max_tokens_per_microbatch=8192,
        distributed_strategy="no"))
    trainer.train_step(batch)  # warm-up (kernels, allocator)
    _reset_peak(device)
    times, tokens = [], 0
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        stats = trainer.train_step(batch)
        _sync(device)
        times.append(time.perf_counter() - t0)
        tokens = stats["num_padded_tokens"]
    peak = _peak_mb(device)
    # the baseline: a plain forward + backward (mean logit) of the same padded batch
    width = max(len(s.token_ids) for s in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    for i, s in enumerate(batch):
        ids[i, :len(s.token_ids)] = torch.tensor(s.token_ids)
    plain = []
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        for start in range(0, len(batch), 4):
            model(input_ids=ids[start:start + 4]).logits.float().mean().backward()
        _sync(device)
        plain.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    step = sorted(times)[1]
    return {"step_seconds": round(step, 4), "tokens_per_second": round(tokens / step, 1),
            "padded_tokens": tokens, "peak_mb": peak,
            "plain_forward_backward_seconds": round(sorted(plain)[1], 4),
            "grpo_vs_plain": round(step / max(sorted(plain)[1], 1e-9), 3),
            "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}


def check_generation(size: str, device: Any, dtype: Any) -> dict:
    import torch

    shape = SHAPES[size]
    model = _model(size, device, dtype).eval()
    vocab, new = SIZES[size]["vocab_size"], shape["new_tokens"]
    out: dict[str, Any] = {}
    for rows in shape["batches"]:
        g = torch.Generator().manual_seed(rows)
        ids = torch.randint(0, vocab, (rows, shape["prompt"]), generator=g).to(device)
        kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0,
                      top_p=1.0, pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), **dict(kwargs,
                           max_new_tokens=2, min_new_tokens=2))  # warm-up
            _reset_peak(device)
            _sync(device)
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            _sync(device)
        seconds = time.perf_counter() - t0
        out[f"batch_{rows}"] = {"tokens_per_second": round(rows * new / seconds, 1),
                                "seconds": round(seconds, 3), "peak_mb": _peak_mb(device)}
    first, last = shape["batches"][0], shape["batches"][-1]
    out["speedup_batch_%d_vs_%d" % (last, first)] = round(
        out[f"batch_{last}"]["tokens_per_second"]
        / max(out[f"batch_{first}"]["tokens_per_second"], 1e-9), 2)
    return out


def check_logprob_drift(size: str, device: Any) -> dict:
    import torch

    from spadekit.train.loss import token_logprobs

    shape = SHAPES[size]
    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = _model(size, device, dtype).eval()
        rows, new, temp = 8, shape["new_tokens"], 0.7
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, SIZES[size]["vocab_size"], (rows, shape["prompt"]),
                            generator=g).to(device)
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=True, temperature=temp,
                                 top_p=1.0, top_k=0, pad_token_id=0, eos_token_id=None,
                                 output_logits=True, return_dict_in_generate=True)
            seq = gen.sequences
            sampled = seq[:, ids.shape[1]:]
            logits = torch.stack(gen.logits, dim=1).float() / temp  # what generation saw
            seen = torch.log_softmax(logits, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
            full = model(input_ids=seq).logits[:, ids.shape[1] - 1:-1].float() / temp
            trainer = token_logprobs(full, sampled)  # the trainer's own function
        diff = (seen - trainer).abs()
        out[name] = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                     "tokens": int(diff.numel())}
        del model
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_distributed(device: Any) -> dict:
    """``benchmarks/ddp_step.py`` in one process, then in two (gloo) per strategy."""
    script = str(ROOT / "benchmarks" / "ddp_step.py")
    common = ["--sequences", "8", "--length", "64", "--repeats", "2"]
    base_env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def one(extra_env: dict | None, strategy: str) -> dict:
        env = {**base_env, **(extra_env or {})}
        proc = subprocess.run([sys.executable, script, *common, "--strategy", strategy],
                              env=env, capture_output=True, text=True, timeout=300)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(proc.stderr[-800:] or f"exit {proc.returncode}")
        return json.loads(lines[-1])

    def pair(strategy: str) -> dict:
        port = str(_free_port())
        procs = []
        for rank in (0, 1):
            env = {**base_env, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            procs.append(subprocess.Popen(
                [sys.executable, script, *common, "--strategy", strategy, "--backend", "gloo"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=300) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(next(err for (_, err), p in zip(outs, procs)
                                    if p.returncode)[-800:])
        return json.loads([x for x in outs[0][0].splitlines() if x.startswith("{")][-1])

    single = one(None, "no")
    out: dict[str, Any] = {"single": single}
    for strategy in ("ddp", "fsdp"):
        try:
            result = pair(strategy)
            result["same_first_loss"] = math.isclose(result["first_loss"], single["first_loss"],
                                                     rel_tol=1e-4, abs_tol=1e-6)
            out[strategy] = result
        except Exception as exc:  # reported, not fatal
            out[strategy] = {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
    return out


def check_planner(size: str, device: Any, dtype: Any) -> dict:
    import torch

    from spadekit.common.packing import DEFAULT_BATCH_CELLS, plan_batches

    widths = SHAPES[size]["planner_widths"]
    model = _model(size, device, dtype).eval()
    calls = plan_batches(widths, 64, DEFAULT_BATCH_CELLS)
    rows = []
    for call in calls:
        rows_n, widest = len(call), max(widths[i] for i in call)
        ids = torch.randint(0, SIZES[size]["vocab_size"], (rows_n, widest)).to(device)
        mask = torch.ones_like(ids)
        for j, i in enumerate(call):  # left padding, as the hf backend pads
            mask[j, :widest - widths[i]] = 0
        _reset_peak(device)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
        peak = _peak_mb(device)
        rows.append({"rows": rows_n, "widest": widest, "cells": rows_n * widest ** 2,
                     "peak_mb": peak})
    measured = [r for r in rows if r["peak_mb"] is not None]
    return {"max_cells": DEFAULT_BATCH_CELLS, "calls": rows,
            "all_within_bound": all(r["cells"] <= DEFAULT_BATCH_CELLS or r["rows"] == 1
                                    for r in rows),
            "largest_call_peak_mb": max((r["peak_mb"] for r in measured), default=None)}


def _timed(name: str, fn: Callable[[], dict], results: dict) -> None:
    t0 = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as exc:  # one check failing does not stop the others
        results[name] = {"error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()[-1500:]}
    results[name]["seconds_total"] = round(time.perf_counter() - t0, 2)
    print(f"[{name}] {json.dumps(results[name])[:400]}", flush=True)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=("auto", "0.5b", "tiny"), default="auto")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    size = args.size if args.size != "auto" else ("0.5b" if cuda else "tiny")
    bf16 = cuda and torch.cuda.is_bf16_supported()
    dtype = torch.bfloat16 if bf16 or not cuda else torch.float16
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "size": size,
        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu_memory_gb": round(
            torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None}
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except ImportError:
        results["transformers"] = None
    _timed("grpo_step", lambda: check_grpo_step(size, device, dtype), results)
    _timed("generation", lambda: check_generation(size, device, dtype), results)
    _timed("logprob_drift", lambda: check_logprob_drift(size, device), results)
    _timed("distributed", lambda: check_distributed(device), results)
    _timed("planner", lambda: check_planner(size, device, dtype), results)
    results["errors"] = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    results["minutes"] = round((time.perf_counter() - start) / 60, 2)
    line = json.dumps(results)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
