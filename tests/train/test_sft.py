"""The warm start's supervised fine-tuning (issue 23): completion-only loss, a held-out loss,
LoRA merged at export, and a killed run that resumes to the same weights as an uninterrupted
one. The tiny model really trains."""

from __future__ import annotations

import math

import pytest
import torch

from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.train.sft import SFTConfig, SFTExample, SFTRun, completion_loss


def _examples(tok, n=12):
    out = []
    for i in range(n):
        prompt = tok.encode(f"question {i} about item {i * 7}:")
        answer = tok.encode(f" the answer is {i % 3} and done")
        out.append(SFTExample(prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return out


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_the_loss_counts_completion_tokens_only():
    policy = load_policy("tiny")
    ex = _examples(policy.tokenizer, 1)[0]
    loss, n = completion_loss(policy.model, [ex], 0)
    assert n == sum(ex.loss_mask[1:])
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ex.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    manual = -sum(float(logp[t - 1, ex.token_ids[t]]) for t in range(1, len(ex.token_ids))
                  if ex.loss_mask[t])
    assert float(loss.detach()) == pytest.approx(manual, rel=1e-4)
    # another prompt changes nothing but the context: same count of loss tokens
    other = SFTExample([1] * 3 + ex.token_ids[3:], ex.loss_mask)
    assert completion_loss(policy.model, [other], 0)[1] == n


def test_training_lowers_train_and_held_out_loss(tmp_path):
    policy = load_policy("tiny")
    exs = _examples(policy.tokenizer)
    run = SFTRun(policy, SFTConfig(epochs=3, learning_rate=3e-3, use_peft=False,
                                   grad_accum=1, max_tokens_per_microbatch=64), tmp_path)
    history = run.fit(exs[:10], exs[10:])
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]
    held = [h["held_out_loss"] for h in history]
    assert held[-1] < 0.7 * held[0]
    assert history[-1]["train_loss"] < history[1]["train_loss"]


def _interrupted(tmp_path, cfg, exs, stop_at):
    class Stop(Exception):
        pass

    def progress(done, _total, _loss):
        if done == stop_at:
            raise Stop

    run = SFTRun(load_policy("tiny"), cfg, tmp_path)
    with pytest.raises(Stop):
        run.fit(exs[:10], exs[10:], progress)
    resumed = SFTRun(load_policy("tiny"), cfg, tmp_path)
    assert resumed.resumed
    history = resumed.fit(exs[:10], exs[10:])
    return resumed, history


@pytest.mark.parametrize("use_peft", [False, True])
def test_a_killed_run_resumes_to_the_same_weights(tmp_path, use_peft):
    cfg = SFTConfig(epochs=2, learning_rate=3e-3, use_peft=use_peft, lora_r=4, lora_alpha=8,
                    grad_accum=2, max_tokens_per_microbatch=64, save_every=2)
    policy = load_policy("tiny")
    exs = _examples(policy.tokenizer)
    straight = SFTRun(policy, cfg, tmp_path / "a")
    h_a = straight.fit(exs[:10], exs[10:])
    again = SFTRun(load_policy("tiny"), cfg, tmp_path / "b")
    h_b = again.fit(exs[:10], exs[10:])
    # two uninterrupted runs agree bitwise (else "equal after resume" could not fail)
    wa, wb = _weights(straight.model), _weights(again.model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and h_a == h_b
    for stop_at in (3, 4):  # mid-epoch after a save (3) and right on a save (4)
        resumed, h_c = _interrupted(tmp_path / f"c{stop_at}", cfg, exs, stop_at)
        wc = _weights(resumed.model)
        assert all(torch.equal(wa[k], wc[k]) for k in wa), stop_at
        assert [h["held_out_loss"] for h in h_c] == [h["held_out_loss"] for h in h_a]


def test_lora_is_merged_at_export_and_loads_as_a_model(tmp_path):
    policy = load_policy("tiny")
    exs = _examples(policy.tokenizer)
    run = SFTRun(policy, SFTConfig(epochs=1, learning_rate=5e-3, lora_r=4, lora_alpha=8,
                                   max_tokens_per_microbatch=64), tmp_path)
    run.fit(exs)
    ids = torch.tensor([exs[0].token_ids])
    with torch.no_grad():
        trained = run.model(input_ids=ids).logits
    path = run.export()
    assert (path / "warmstart.json").exists() and not (tmp_path / "model.tmp").exists()
    loaded = load_policy(f"hf:{path}")
    with torch.no_grad():
        again = loaded.model(input_ids=ids).logits
    assert torch.allclose(trained.float(), again.float(), atol=1e-4)
    base = load_policy("tiny")
    with torch.no_grad():
        before = base.model(input_ids=ids).logits
    assert not torch.allclose(before.float(), again.float(), atol=1e-4)


def test_other_settings_do_not_resume_a_state(tmp_path):
    policy = load_policy("tiny")
    exs = _examples(policy.tokenizer)
    SFTRun(policy, SFTConfig(epochs=1, use_peft=False, max_tokens_per_microbatch=64),
           tmp_path).fit(exs)
    with pytest.raises(ConfigError, match="other SFT settings"):
        SFTRun(load_policy("tiny"), SFTConfig(epochs=2, use_peft=False,
                                              max_tokens_per_microbatch=64), tmp_path)


def test_bad_examples_and_settings_are_refused():
    with pytest.raises(ValueError, match="as many mask entries"):
        SFTExample([1, 2, 3], [0, 1])
    with pytest.raises(ValueError, match="at least one loss token"):
        SFTExample([1, 2, 3], [1, 0, 0])
    with pytest.raises(ConfigError, match="sft.epochs"):
        SFTConfig(epochs=0)
    with pytest.raises(ConfigError, match="learning_rate"):
        SFTConfig(learning_rate=math.nan)
