"""The run's warm start, built once and cached (``spadekit.selfplay.warm_cache``): which settings
make a new one, when it applies, the fastest engine, and a real run that starts from it (the
tiny model, a real procedural pool validated in the sandbox, a real SFT, the real loop)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spadekit.selfplay.config import load_config
from spadekit.selfplay.warm_cache import (WarmstartConfig, applies, cache_key,
                                          resolve_generation_model, warm_model_dir)


def _cfg(*sets):
    return load_config("cpu-warm", overrides=["stream_key=tests", *sets])


def test_the_key_repeats_and_follows_what_the_examples_depend_on():
    base = cache_key(_cfg())
    assert cache_key(_cfg()) == base  # no clock, no ids: the same settings, the same key
    changed = {
        "warmstart.programs=12": True, "warmstart.epochs=2": True,
        "warmstart.learning_rate=1e-4": True, "warmstart.lora_r=8": True,
        "warmstart.agent_seeds=1": True, "warmstart.lora_layers=null": True, "warmstart.held_out_share=0.2": True,
        "warmstart.seed=4": True, "warmstart.pool=library": True, "model=tiny": True,
        "designer.prompt_style=full": True, "rollout.max_turns=4": True,
        "designer.positive_seeds=1": True, "designer.max_words=50": True,
        "designer.hint_mode=second_call": True, "warmstart.combos=12": True,
        "warmstart.per_combo=2": True, "designer.prompt_style=kit": True,
        # sampling and the later stages do not change the examples: the same warm start
        "designer.temperature=0.9": False, "designer.repair_attempts=1": False,
        "warmstart.seed_memory=false": False, "rounds=5": False,
    }
    for setting, differs in changed.items():
        extra = ["rollout.temperature=0.9"] if setting.startswith("designer.temperature") else []
        assert (cache_key(_cfg(setting, *extra)) != base) is differs, setting


def test_it_applies_to_its_own_model_only():
    assert applies(_cfg())  # cpu-warm: the bundled model, the procedural pool
    assert not applies(_cfg("warmstart.pool=null"))
    assert not applies(_cfg("model=tiny"))  # the recipe was measured on the bundled model
    assert applies(_cfg("model=tiny", "warmstart.model=any"))
    assert warm_model_dir(_cfg("model=tiny")) is None


def test_bad_settings_are_refused():
    from spadekit.common.errors import ConfigError

    for bad in ({"programs": 0}, {"epochs": True}, {"agent_seeds": -1},
                {"learning_rate": float("nan")}, {"held_out_share": 1.0}, {"pool": " "},
                {"lora_layers": 0}, {"combos": 0}, {"combos": True}, {"per_combo": 0}):
        with pytest.raises(ConfigError):
            WarmstartConfig(**bad)
    with pytest.raises(ConfigError, match="prompt_style"):
        _cfg("designer.prompt_style=short")


def test_auto_picks_vllm_for_real_checkpoints_only(tmp_path, monkeypatch):
    import importlib.util

    have = importlib.util.find_spec("vllm") is not None
    assert resolve_generation_model(None, "smollm2-135m") is None
    assert resolve_generation_model("tiny", "smollm2-135m") == "tiny"
    assert resolve_generation_model("auto", "tiny") is None  # built in code: vLLM cannot
    assert resolve_generation_model("auto", "smollm2-135m") == (
        "vllm:smollm2-135m" if have else None)
    (tmp_path / "config.json").write_text("{}")
    assert resolve_generation_model("auto", f"hf:{tmp_path}") == (
        f"vllm:{tmp_path}" if have else None)
    assert resolve_generation_model("auto", f"hf:{tmp_path / 'missing'}") is None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert resolve_generation_model("auto", "smollm2-135m") is None


def test_a_run_starts_from_the_cached_warm_start(tmp_path, monkeypatch):
    """Round 0 of a run with ``warmstart.model=any`` on the tiny model: the warm start is built
    (procedural pool validated, SFT), the run's base is it (config.yaml), the memory holds its
    programs; a second run loads it from the cache without rebuilding; another
    ``warmstart.programs`` builds another one, with that many programs."""
    import yaml

    from spadekit.runs.store import RunStore
    from spadekit.selfplay.loop import SelfPlay

    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    sets = ["model=tiny", "warmstart.model=any", "warmstart.programs=3", "warmstart.epochs=1",
            "rounds=1", "envs_per_round=1", "num_generations=2", "hint_generations=1",
            "bootstrap=null", "rollout.max_new_tokens=8", "designer.max_new_tokens=16",
            "tensorboard=false", "checkpoint_every=100", "validation.lockstep_instances=8",
            "generation_model=null"]  # vLLM has no CPU kernel for the tiny model's heads
    cfg = _cfg(*sets)
    key = cache_key(cfg)
    with SelfPlay(cfg, tmp_path / "run1") as sp:
        sp.run()
    folder = tmp_path / "cache" / "warmstart" / key
    record = json.loads((folder / "warmstart.json").read_text())
    assert record["counts"]["programs"] == 3 and record["counts"]["designer_examples"] == 3
    assert record["history"][-1]["train_loss"] is not None
    stored = yaml.safe_load((tmp_path / "run1" / "config.yaml").read_text())
    assert stored["model"] == f"hf:{folder / 'model'}"
    store = RunStore.open(tmp_path / "run1")
    try:
        seeded = [e["data"] for e in store.events("memory_seeded")]
    finally:
        store.close()
    assert [e["added"] for e in seeded if e["source"].endswith("programs")] == [3]
    marker = (folder / ".spadekit-complete.json").stat().st_mtime_ns
    with SelfPlay(cfg, tmp_path / "run2") as sp:  # the cache: nothing is rebuilt
        assert sp.config.model == f"hf:{folder / 'model'}"
    assert (folder / ".spadekit-complete.json").stat().st_mtime_ns == marker
    other = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, programs=2))
    path = warm_model_dir(other)
    assert path.parent != folder
    assert json.loads((path.parent / "warmstart.json").read_text())["counts"]["programs"] == 2
