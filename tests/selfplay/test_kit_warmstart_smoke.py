"""A seeded kit warm start of the bundled SmolLM2-135M gives valid kit programs (issue 39's CI
smoke): the default preset's recipe (``cpu-kit``) cut to 36 procedural kit programs (12
compositions), built by the real warm-start cache (pool in the sandbox, the loop's own kit
prompt, a real LoRA SFT), then 8 designs sampled at the loop's temperature with the loop's
prompts on documents the warm start never saw, each validated by the real validator. The
untrained model writes none (``benchmarks/designer.py``: 0 of 32); the trained one must write
at least one valid kit program, and every valid one honours its skill. Measured: 1 of 6 valid
with this recipe (24 programs: 0 of 6), and 1 or more of 8 in the one suite run; about three
minutes on two cores. That margin is too thin for CI: another CPU's numerics draw other samples,
and 0 of 8 would fail a correct build. It is marked ``slow`` (run it with ``-m slow``) until a
recipe that fits three minutes gives several valid programs; issue 39 stays open for it.
"""

from __future__ import annotations

import pytest

from conftest import TIERS


@pytest.mark.slow  # not yet in the default run: see the module docstring
def test_a_short_kit_warm_start_writes_valid_kit_programs(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    import torch

    from spadekit.envs.skills import skills_for
    from spadekit.policy.registry import load_policy
    from spadekit.runs.pool import load_pool
    from spadekit.sandbox import SandboxPool
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay import warm_cache
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.designer_eval import sample_designs, summarize
    from spadekit.selfplay.procedural_pool import split_documents

    torch.set_num_threads(2)
    monkeypatch.setattr(warm_cache, "_cache_root", lambda: tmp_path / "warmstart")
    cfg = load_config("cpu-kit", overrides=[
        "stream_key=tests", "generation_model=null", "warmstart.programs=36",
        "warmstart.combos=12", "warmstart.per_combo=3", "warmstart.epochs=3",
        "warmstart.learning_rate=8e-4",
        "designer.temperature=0.7", "rollout.temperature=0.7"])
    model = warm_cache.warm_model_dir(cfg)
    assert model is not None and (model / "config.json").exists()
    known = load_pool(model.parent / "programs")
    assert 30 <= len(known) <= 36 and all(p.meta.get("gamekit") == "v1" for p in known)
    _train, held = split_documents([(d.id, d.text) for d in load_corpus(cfg.corpus)],
                                   cfg.warmstart.seed)
    policy = load_policy(f"hf:{model}", seed=0)
    with SandboxPool(cfg.sandbox, warm=1) as pool, \
            Validator(pool, cfg.validation.settings(cfg.turn_cap), seed=0) as validator:
        samples = sample_designs(policy, cfg, validator, n=8, seed=0,
                                 skills=skills_for("games"), documents=held,
                                 references=known, known=known)
    summary = summarize(samples)
    assert summary["kit_programs"] == summary["valid"] >= 1, summary
    assert summary["skill_honoured_share"] == 1.0, summary
