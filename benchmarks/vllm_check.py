"""GPU check of the vllm backend: VLLMPolicy's logprobs against a transformers forward pass.

Needs a CUDA GPU, vllm and transformers; no network with the default ``--model tiny`` (a small
random Llama, built here and saved to a temporary directory; its output layer is scaled so that
the next-token distributions are far from uniform and a temperature mistake shows).

What it checks, each against ``spadekit.policy.hf.sequence_logprobs`` (one fresh HF forward
pass over prompt + sampled tokens, same dtype, on the GPU):

1. logprobs at temperature 1.0, 0.7 and 0 (greedy), top_p = 1: must match (``processed_logprobs``);
2. temperature 1.0 with top_p = 0.9: exact only in raw mode; reported, not judged;
3. generations that end on an end-of-sequence token keep it as the last token id;
4. ``load_weights``: every parameter of the HF model is perturbed, pushed into vLLM, and the
   logprobs of a new generation must match the perturbed HF model (and differ from before).

Usage: python benchmarks/vllm_check.py [--model tiny|ID_OR_PATH] [--dtype float32]
The last line printed is one JSON object; ``ok`` is true when every judged check passed.
Exit status 0 when ok, 1 otherwise, 2 when vllm or a GPU is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TOLERANCE = {"float32": 2e-3, "bfloat16": 0.15, "float16": 0.05}


def build_tiny(directory: str) -> str:
    """A 2-layer random Llama (head_dim 64, which every vLLM attention backend takes) with the
    byte-level tiny tokenizer and its chat template, saved as a Hugging Face directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from spadekit.policy.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # spread the logits: a far-from-uniform next-token distribution
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def hf_model(path: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except TypeError:  # transformers < 4.56
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch_dtype)
    return model.to("cuda").eval()


def compare(policy, model, prompts, temperature, top_p, max_new_tokens, seed0):
    from spadekit.policy.base import GenerationRequest, SamplingParams
    from spadekit.policy.hf import sequence_logprobs

    reqs = [GenerationRequest(prompt_ids=p, params=SamplingParams(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed0 + i))
        for i, p in enumerate(prompts)]
    gens = policy.generate(reqs)
    diffs, n, eos_kept, eos_total = [], 0, 0, 0
    for g in gens:
        if not g.token_ids:
            continue
        ref = sequence_logprobs(model, g.prompt_ids, g.token_ids, temperature)
        diffs += [abs(a - b) for a, b in zip(ref, g.logprobs)]
        n += len(g.token_ids)
        if g.finish_reason == "stop" and not reqs[0].params.stop:
            eos_total += 1
            eos_kept += g.token_ids[-1] in policy.stop_ids
    return {"temperature": temperature, "top_p": top_p, "tokens": n,
            "max_abs_diff": max(diffs) if diffs else None,
            "mean_abs_diff": sum(diffs) / len(diffs) if diffs else None,
            "mean_logprob": (sum(sum(g.logprobs) for g in gens) / n) if n else None,
            "stopped_on_eos": eos_total, "eos_kept_as_last_token": eos_kept,
            "exact_expected": policy.logprobs_exact(reqs[0].params)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--multiprocessing", action="store_true",
                    help="keep vLLM's V1 engine in its own process (load_weights then goes "
                         "through LLM.apply_model)")
    args = ap.parse_args()
    report: dict = {"model": args.model, "dtype": args.dtype}
    if not args.multiprocessing:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    try:
        import torch
        import vllm
    except ImportError as exc:
        print(json.dumps({**report, "ok": False, "error": f"missing: {exc}"}))
        return 2
    if not torch.cuda.is_available():
        print(json.dumps({**report, "ok": False, "error": "no CUDA GPU"}))
        return 2
    report["vllm"] = getattr(vllm, "__version__", "?")
    report["torch"] = torch.__version__
    from spadekit.policy.vllm_backend import VLLMPolicy

    tmp = tempfile.TemporaryDirectory(prefix="spadekit-vllm-check-")
    path = build_tiny(tmp.name) if args.model == "tiny" else args.model
    t0 = time.time()
    policy = VLLMPolicy(path, dtype=args.dtype, enforce_eager=True, seed=0,
                        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=1024)
    report["engine_start_s"] = round(time.time() - t0, 1)
    report["logprobs_mode"] = policy.logprobs_mode
    model = hf_model(path, args.dtype)
    texts = ["Hello there", "Write a haiku about rain", "2 + 2 =", "The capital of France",
             "Once upon a time", "def fib(n):", "Translate 'cat' to German", "List three colors"]
    prompts = [policy.render([{"role": "user", "content": texts[i % len(texts)] + "!" * (i // 8)}])
               for i in range(args.prompts)]
    tol = TOLERANCE[args.dtype]
    settings = [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0), (1.0, 0.9)]
    report["checks"] = [compare(policy, model, prompts, t, p, args.max_new_tokens, 100)
                        for t, p in settings]
    judged = [c for c in report["checks"] if c["exact_expected"]]
    ok = bool(judged) and all(c["max_abs_diff"] is not None and c["max_abs_diff"] <= tol
                              for c in judged)
    eos_total = sum(c["stopped_on_eos"] for c in report["checks"])
    eos_kept = sum(c["eos_kept_as_last_token"] for c in report["checks"])
    ok = ok and eos_kept == eos_total

    # weight sync: perturb the HF model, push it, compare again
    import torch as _torch

    before = compare(policy, model, prompts[:4], 1.0, 1.0, args.max_new_tokens, 500)
    gen = _torch.Generator(device="cpu").manual_seed(1)
    with _torch.no_grad():
        for _, param in model.named_parameters():
            noise = _torch.randn(param.shape, generator=gen) * 0.05 * param.float().std().item()
            param.add_(noise.to(param.device, param.dtype))
    try:
        t0 = time.time()
        loaded = policy.load_weights((n, p.detach().cpu()) for n, p in model.named_parameters())
        after = compare(policy, model, prompts[:4], 1.0, 1.0, args.max_new_tokens, 500)
        # judged: vLLM now agrees with the perturbed HF model (it would not with stale weights)
        report["load_weights"] = {"loaded": loaded, "seconds": round(time.time() - t0, 2),
                                  "max_abs_diff_after": after["max_abs_diff"],
                                  "mean_logprob_before": before["mean_logprob"],
                                  "mean_logprob_after": after["mean_logprob"]}
        ok = ok and after["max_abs_diff"] is not None and after["max_abs_diff"] <= tol
    except Exception as exc:  # report, do not hide
        report["load_weights"] = {"error": f"{type(exc).__name__}: {exc}"}
        ok = False
    report["tolerance"] = tol
    report["ok"] = ok
    print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
