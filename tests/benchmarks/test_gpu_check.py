"""``benchmarks/gpu_check.py`` runs on a CPU (issue 26): every check of the GPU script is exercised
here on its tiny Qwen2 model, so the day a GPU is at hand the script is known to run.

The checks are real (a real trainer step, real generation, real DDP and FSDP in two gloo
processes); only the figures are CPU figures, which the JSON says (``"device": "cpu"``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_every_check_on_a_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"),
                           "--size", "tiny", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == last
    assert last["device"] == "cpu" and last["size"] == "tiny"
    assert last["errors"] == [], {k: last[k].get("error") for k in last["errors"]}
    grpo = last["grpo_step"]
    assert grpo["tokens_per_second"] > 0 and grpo["padded_tokens"] > 0
    assert grpo["grpo_vs_plain"] > 0
    gen = last["generation"]
    assert all(gen[f"batch_{b}"]["tokens_per_second"] > 0 for b in (1, 8, 64))
    # the trainer's logprobs of what generation sampled agree with what generation saw
    drift = last["logprob_drift"]
    assert drift["fp32"]["max_abs_diff"] < 1e-3 and drift["fp32"]["tokens"] > 0
    assert math.isfinite(drift["bf16"]["max_abs_diff"])
    dist = last["distributed"]
    for strategy in ("ddp", "fsdp"):
        assert dist[strategy]["world_size"] == 2 and dist[strategy]["same_first_loss"], dist
    planner = last["planner"]
    assert planner["all_within_bound"] and planner["calls"]
    assert sum(c["rows"] for c in planner["calls"]) == 20  # every planned prompt generated
