"""vLLM against transformers on the same requests, on CPU or GPU: speed, logprobs, weight pushes.

One run, in this order:

1. throughput: the same batch of chat requests (``--batch`` prompts, ``--max-new-tokens``,
   temperature 0.6, logprobs) through the ``vllm`` backend and through the ``hf`` backend
   (transformers, this package's batched sampler); tokens per second of each, and their ratio;
2. logprob agreement: every sampled token's vLLM logprob against one fresh transformers forward
   pass (``sequence_logprobs``, the trainer's computation) at temperature 0 (greedy), 0.6 and 1.0
   with top_p = 1, and at 0.6 with top_p = 0.9; judged (at most ``--tolerance``) where the
   backend says its logprobs are exact (``logprobs_exact``: every case with the engine in this
   process);
3. push: every matrix of the transformers model is scaled by 1.01 and pushed
   (``WeightSync.push``, checked by the probe after the push), then the original weights are pushed
   back; ``push_changes_output`` is true when the first push changed the engine's greedy
   logprobs and the second brought them back (to 1e-5).

Usage: python benchmarks/vllm_check.py [--model smollm2-135m|HF_DIR] [--batch 8]
The last line printed is one JSON object (``vllm_vs_hf_throughput``, ``logprob_max_abs_diff``,
``push_changes_output``, ``push_s``, ...); exit status 0 when ``ok``, 1 otherwise, 2 when vLLM or
transformers is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TEXTS = ["Write a haiku about rain.", "What is 17 times 23?", "Name three rivers in Europe.",
         "Explain what a prime number is.", "Give me a tip for learning chess.",
         "Describe a cat in one sentence.", "List four primary colors.", "Tell a short joke."]


def timed_generate(policy, reqs) -> tuple[list, float]:
    t0 = time.perf_counter()
    gens = policy.generate(reqs)
    return gens, time.perf_counter() - t0


def requests(policy, n: int, temperature: float, top_p: float, tokens: int, seed: int):
    from spadekit.policy.base import GenerationRequest, SamplingParams

    return [GenerationRequest(prompt_ids=policy.render([{"role": "user",
                                                          "content": TEXTS[i % len(TEXTS)]}]),
                              params=SamplingParams(temperature=temperature, top_p=top_p,
                                                    max_new_tokens=tokens, seed=seed + i))
            for i in range(n)]


def agreement(engine, model, n: int, temperature: float, top_p: float, tokens: int) -> dict:
    from spadekit.policy.base import SamplingParams
    from spadekit.policy.hf import sequence_logprobs

    gens = engine.generate(requests(engine, n, temperature, top_p, tokens, 100))
    diffs = [abs(a - b) for g in gens for a, b in zip(
        sequence_logprobs(model, g.prompt_ids, g.token_ids, temperature), g.logprobs)]
    return {"temperature": temperature, "top_p": top_p, "tokens": len(diffs),
            "max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
            "judged": engine.logprobs_exact(SamplingParams(temperature=temperature,
                                                           top_p=top_p))}


def greedy(engine) -> list[float]:
    (g,) = engine.generate(requests(engine, 1, 0.0, 1.0, 8, 0))
    return g.logprobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    report: dict = {"model": args.model, "batch": args.batch,
                    "max_new_tokens": args.max_new_tokens}
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError as exc:
        print(json.dumps({**report, "ok": False, "error": f"missing: {exc}"}))
        return 2
    from spadekit.policy import load_policy
    from spadekit.train.weight_sync import WeightSync

    report["vllm"] = vllm.__version__
    report["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    hf = load_policy(args.model if args.model == "smollm2-135m" else f"hf:{args.model}")
    t0 = time.perf_counter()
    engine = load_policy(f"vllm:{args.model}", seed=0)
    report["engine_start_s"] = round(time.perf_counter() - t0, 1)
    report["push_route"] = engine.weights.route

    # 1. throughput on the same requests (a warm-up batch first on each side)
    for pol in (engine, hf):
        pol.generate(requests(pol, 2, 0.6, 1.0, 8, 0))
    v_gens, v_s = timed_generate(engine, requests(engine, args.batch, 0.6, 1.0,
                                                  args.max_new_tokens, 1))
    h_gens, h_s = timed_generate(hf, requests(hf, args.batch, 0.6, 1.0, args.max_new_tokens, 1))
    v_tok = sum(len(g.token_ids) for g in v_gens)
    h_tok = sum(len(g.token_ids) for g in h_gens)
    report.update(vllm_tokens_per_s=round(v_tok / v_s, 1), hf_tokens_per_s=round(h_tok / h_s, 1),
                  vllm_tokens=v_tok, hf_tokens=h_tok,
                  vllm_vs_hf_throughput=round((v_tok / v_s) / (h_tok / h_s), 2))

    # 2. logprob agreement with a fresh forward pass
    checks = [agreement(engine, hf.model, args.batch, t, p, 32)
              for t, p in ((0.0, 1.0), (0.6, 1.0), (1.0, 1.0), (0.6, 0.9))]
    report["checks"] = checks
    judged = [c["max_abs_diff"] for c in checks if c["judged"]]
    report["logprob_max_abs_diff"] = max(judged)
    report["top_p_0.9_max_abs_diff"] = checks[-1]["max_abs_diff"]
    report["logprobs_mode"] = engine.logprobs_mode

    # 3. a push that changes the engine, and a push back
    original = {k: v.detach().clone() for k, v in hf.model.state_dict().items()}
    before = greedy(engine)
    with torch.no_grad():
        for p in hf.model.parameters():
            if p.ndim == 2:
                p.mul_(1.01)
    sync = WeightSync(engine)  # the second push is checked against the first's reading
    stats = sync.push(hf.model)
    changed = max(abs(a - b) for a, b in zip(before, greedy(engine)))
    hf.model.load_state_dict(original)
    back = sync.push(hf.model)
    restored = max(abs(a - b) for a, b in zip(before, greedy(engine)))
    report.update(push_s=round(stats["seconds"], 2), push_verify_s=round(stats["verify_s"], 2),
                  push_mb=round(stats["bytes"] / 2**20, 1),
                  push_probe_max_abs_diff=stats["probe_max_abs_diff"],
                  push_back_s=round(back["seconds"], 2), push_change=changed,
                  push_back_verdict=back.get("probe_verdict"),
                  push_restore_diff=restored,
                  push_changes_output=bool(changed > 1e-3 and restored <= 1e-5))
    report["tolerance"] = args.tolerance
    report["ok"] = bool(report["logprob_max_abs_diff"] <= args.tolerance
                        and report["push_changes_output"])
    for c in checks:
        print(f"T={c['temperature']} top_p={c['top_p']}: {c['tokens']} tokens, max |diff| "
              f"{c['max_abs_diff']:.2e}{'' if c['judged'] else ' (not judged)'}")
    print(f"vLLM {report['vllm_tokens_per_s']} tok/s, transformers {report['hf_tokens_per_s']} "
          f"tok/s: x{report['vllm_vs_hf_throughput']}; push {report['push_s']} s")
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
