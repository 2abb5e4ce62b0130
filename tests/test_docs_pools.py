"""docs/pools.md's commands, run as written, in order, from one working directory, on a small
real finished run (tiny model, scripted designer: report_run.py) in place of the run directory
the page names. A command that fails fails the test: the page cannot drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from report_run import build_run

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pools.md"
RUN_IN_PAGE = "runs/20261206-134445"


def page_commands() -> list[str]:
    """The lines of the page's ``bash`` blocks, in order."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_page_names_every_step_of_the_issue():
    text = " ".join(page_commands())
    for step in ("spadekit pool export", "sha256sum", "datasets.load_dataset",
                 "spadekit import-reference --release", "spadekit pool register",
                 "examples/trl_pool.py"):
        assert step in text, step


@pytest.mark.extra("trl")
def test_the_commands_of_docs_pools_run_as_written(tmp_path):
    run = build_run(tmp_path / "fixture", rounds=2)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home"), "PYTHONPATH": str(ROOT / "src")}
    py = sys.executable
    for line in page_commands():
        command = line.replace(RUN_IN_PAGE, str(run))
        command = re.sub(r"(^|\(|&& )spadekit ", rf"\1{py} -m spadekit ", command)
        command = re.sub(r"(^|&& )python ", rf"\1{py} ", command)
        command = command.replace("examples/", f"{ROOT}/examples/")
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert (work / "my-pool" / "manifest.jsonl").is_file()
    assert (work / "my-pool-imported" / "pool.jsonl").is_file()
