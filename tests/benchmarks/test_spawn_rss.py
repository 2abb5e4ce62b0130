"""``benchmarks/spawn_rss.py`` runs end to end at a small size and ends with its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_spawn_benchmark_compares_both_ways_and_ends_with_json():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "spawn_rss.py"),
                           "--memory-mb", "64", "--workers", "3", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if "skipped" in out:
        return  # not root, no setpriv or no strong tier: said so, nothing to compare
    for key in ("wall_ms", "caller_sys_ms", "caller_faults"):
        assert out[f"popen_user_{key}"] >= 0 and out[f"setpriv_{key}"] >= 0
        assert out[f"{key}_ratio"] > 0
    assert out["memory_mb"] == 64 and out["workers"] == 3
