"""Roles as configuration (issue 16): ``designer.model`` makes the designer (and the hint
writer) a frozen policy of its own, through any backend; the run database and the CLI say which
policy and engine played which role; the frozen designer's samples are rewarded, never trained."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from spadekit.selfplay.config import load_config
from spadekit.selfplay.loop import SelfPlay

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _config(**overrides):
    base = {"model": "tiny", "rounds": 2, "envs_per_round": 2, "num_generations": 2,
            "hint_generations": 2, "bootstrap_per_round": 1, "regen_interval": 1,
            "designer.max_new_tokens": 24, "designer.hint_max_new_tokens": 8,
            "rollout.max_new_tokens": 8, "env_max_turns": 2, "tensorboard": False}
    base.update(overrides)
    return load_config("cpu-tiny", overrides=["stream_key=tests",
                                              *(f"{k}={v}" for k, v in base.items())])


def _weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.model.parameters()]


def test_a_frozen_designer_model_designs_and_is_never_trained(tmp_path):
    with SelfPlay(_config(**{"designer.model": "tiny"}), tmp_path / "run") as sp:
        assert sp.designer_policy is not sp.policy  # its own model, loaded from the spec
        assert sp.design.policy is sp.designer_policy
        assert sp.design.hint_policy is sp.designer_policy  # hints too, unless hint_model
        frozen = _weights(sp.designer_policy)
        optimised = {id(p) for g in sp.trainer.optimizer.param_groups for p in g["params"]}
        assert optimised and not optimised & {id(p) for p in
                                              sp.designer_policy.model.parameters()}
        metrics = sp.run()
        roles = sp.store.get_state("roles")
        events = [e["data"] for e in sp.store.events("roles")]
        after_frozen = _weights(sp.designer_policy)
    assert roles["designer"]["trained"] is False and roles["agent"]["trained"] is True
    assert roles["designer"]["engine"] == type(sp.designer_policy).__name__
    assert events and events[0]["designer"] == roles["designer"]
    # round 1 rewards round 0's designer samples, and drops them before the update
    assert metrics[1]["designer_samples"] > 0
    assert metrics[1]["designer_samples_dropped"] == metrics[1]["designer_samples"]
    assert all(torch.equal(a, b) for a, b in zip(frozen, after_frozen))


def test_without_designer_model_the_trained_policy_designs(tmp_path):
    with SelfPlay(_config(rounds=1), tmp_path / "run") as sp:
        assert sp.designer_policy is sp.policy
        roles = sp.store.get_state("roles")
    assert roles["designer"]["trained"] is True
    assert roles["designer"]["policy"] == roles["agent"]["policy"]


def test_the_cli_prints_which_policy_plays_which_role(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "spadekit", "selfplay", "--model", "tiny", "--rounds", "1",
         "--run-dir", str(tmp_path / "run"), "--set", "designer.model=tiny",
         "--set", "designer.max_new_tokens=16", "--set", "rollout.max_new_tokens=8"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "80"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    roles = {x.split(":")[0]: x for x in lines if x.split(":")[0] in ("agent", "designer", "hint")}
    assert set(roles) == {"agent", "designer", "hint"}
    assert roles["agent"].endswith(", trained)")
    assert roles["designer"].endswith(", not trained)")  # a frozen designer model
    # an 80-column terminal: the header's lines fit (none wraps mid-phrase), no source paths
    header = lines[:lines.index(roles["hint"]) + 1]
    assert all(len(x) <= 80 for x in header), header
    logged = [x for x in done.stderr.splitlines() if "round 0" in x]
    assert logged and not any(re.search(r"\w\.py:\d+", x) for x in lines + logged)
