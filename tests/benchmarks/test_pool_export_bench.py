"""``benchmarks/pool_export.py`` runs end to end at a small size and ends with its JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.extra("trl")
def test_the_pool_export_benchmark_reads_back_what_it_exported():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pool_export.py"),
                           "--programs", "30", "--repeat", "1"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["programs"] == result["read_back"] == 30
    assert result["release_vs_bare"] > 0 and result["load_dataset_s"] is not None
