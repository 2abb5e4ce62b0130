"""A short warm start of the bundled SmolLM2-135M makes its designer write valid programs (issue
23's CI check): two procedural programs, the loop's own compact prompt (``cpu-warm``), a real
LoRA SFT of the real model, then a seeded sample at the loop's temperature with the same
prompts, validated by the real validator in the sandbox. The untrained model writes no valid
program with these prompts (``benchmarks/designer.py`` measures 0 of 16); after about 40
seconds of training at least one of the two samples is valid and is the program it learnt.

Costs about four minutes on two cores (training, then 2 x ~800 generated tokens). It does not
pass yet (strict xfail, kept out of the default run): after 8 epochs on the two programs both
seeded samples still fail validation (docs/designer.md, "Where it falls short"). It is the
check issue 23 asks CI to run once the warm start works.
"""

from __future__ import annotations

import random

import pytest


@pytest.mark.slow  # about four minutes
@pytest.mark.xfail(strict=True, reason="measured 2026-12-02: both samples fail validation "
                   "(bad_step_type: observation must be str, got tuple); docs/designer.md")
def test_a_short_warm_start_writes_valid_programs(tmp_path):
    pytest.importorskip("peft")
    from spadekit.policy import load_policy
    from spadekit.policy.base import SamplingParams
    from spadekit.rollout.aids import designer_request
    from spadekit.sandbox.validate import Validator
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.procedural_pool import candidates, split_combos
    from spadekit.selfplay.prompts import build_designer_messages
    from spadekit.selfplay.warmstart import designer_examples
    from spadekit.train.sft import SFTConfig, SFTRun

    cfg = load_config("cpu-warm", overrides=["use_memory=false"])
    docs = [(d.id, d.text) for d in load_corpus(cfg.corpus)][:2]
    programs = candidates(split_combos(0).train[:2], docs, 0, 1, cfg.turn_cap)
    policy = load_policy("smollm2-135m")  # its own copy: the test trains it
    examples = [e for _i, e in designer_examples(policy, cfg, programs, dict(docs),
                                                 random.Random(0))]
    run = SFTRun(policy, SFTConfig(epochs=8, learning_rate=1e-3, lora_r=16, lora_alpha=32,
                                   max_tokens_per_microbatch=1400, grad_accum=1, bf16=True),
                 tmp_path / "sft")
    history = run.fit(examples)
    assert history[-1]["train_loss"] < 0.2 * history[1]["train_loss"] + 0.05
    texts = {d_id: text for d_id, text in docs}
    requests = []
    for program in programs:
        doc = texts[program.meta["procedural"]["doc_id"]]
        messages = build_designer_messages(cfg.setting, program.skill, doc, [], None,
                                           cfg.turn_cap, doc_words=cfg.designer.max_words,
                                           style=cfg.designer.prompt_style)
        requests.append(designer_request(policy, messages, SamplingParams(
            temperature=cfg.designer.temperature, max_new_tokens=cfg.designer.max_new_tokens,
            seed=7), cfg.chat_template.for_role("designer"), ""))
    gens = policy.generate(requests)
    with Validator(settings=cfg.validation.settings(cfg.turn_cap), seed=0) as validator:
        reports = validator.validate_many([g.text for g in gens], seeds=[1, 2])
    valid = [r for r in reports if r.ok]
    assert valid, [(r.reason, r.message[:200]) for r in reports]
    assert {r.program.class_name for r in valid} <= {p.class_name for p in programs}
