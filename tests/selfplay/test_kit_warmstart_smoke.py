"""A seeded kit warm start of the bundled SmolLM2-135M gives valid kit programs (issue 39's CI
smoke): the default preset's recipe (``cpu-kit``, the kit grammar on) cut to 24 procedural kit
programs (8 compositions) and 2 epochs, built by the real warm-start cache (pool in the sandbox,
the loop's own kit prompt, a real LoRA SFT), then 8 designs sampled at the loop's temperature
with the loop's prompts and grammar on documents the warm start never saw, each validated by
the real validator. Every one must be a valid kit program: the grammar admits only what loads
(tests/selfplay/test_kit_grammar.py), so an invalid one means the grammar did not reach the
sampler or admitted something it should not. Without the grammar a larger recipe (36
programs, 3 epochs) gave 1 valid of 6 to 8.
"""

from __future__ import annotations

import pytest

from conftest import TIERS


@pytest.mark.timeout(900)  # a hang guard: about 130 s alone on 2 cores, 300 s on a busy machine
def test_a_short_kit_warm_start_writes_valid_kit_programs(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    pytest.importorskip("llguidance")
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
        "stream_key=tests", "generation_model=null", "warmstart.programs=24",
        "warmstart.combos=8", "warmstart.per_combo=3", "warmstart.epochs=2"])
    assert cfg.designer.grammar == "kit" and cfg.designer.temperature == 0.7
    model = warm_cache.warm_model_dir(cfg)
    assert model is not None and (model / "config.json").exists()
    known = load_pool(model.parent / "programs")
    assert 20 <= len(known) <= 24 and all(p.meta.get("gamekit") == "v1" for p in known)
    _train, held = split_documents([(d.id, d.text) for d in load_corpus(cfg.corpus)],
                                   cfg.warmstart.seed)
    policy = load_policy(f"hf:{model}", seed=0)
    with SandboxPool(cfg.sandbox, warm=1) as pool, \
            Validator(pool, cfg.validation.settings(cfg.turn_cap), seed=0) as validator:
        samples = sample_designs(policy, cfg, validator, n=8, seed=0,
                                 skills=skills_for("games"), documents=held,
                                 references=known, known=known)
    summary = summarize(samples)
    assert summary["kit_programs"] == summary["valid"] == 8, summary
    assert all(s.text.startswith("```python\nfrom spadekit.envs.gamekit.v1 import KitEnv")
               for s in samples)
    assert summary["distinct_compositions"] >= 2, summary
