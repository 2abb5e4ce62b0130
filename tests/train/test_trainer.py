"""``PolicyTrainer`` on the tiny model: it learns a toy task, its gradient does not depend on the
micro-batching and matches a plain full-batch computation, LoRA trains only the adapter (with the
adapter-disabled base as the KL reference), truncated importance sampling and dropped samples,
and exact save/load round trips that survive a killed save. CPU only, seconds each."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from spadekit.selfplay.advantages import Sample, agent_advantages  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.policy.hf import HFPolicy, sequence_logprobs  # noqa: E402
from spadekit.policy.tiny import tiny_model, tiny_tokenizer  # noqa: E402
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.loss import grpo_loss, token_logprobs  # noqa: E402
from spadekit.train.trainer import PolicyTrainer, pack_microbatches  # noqa: E402

TOKENIZER = tiny_tokenizer()


def make_policy(seed: int = 0, hidden: int = 64) -> HFPolicy:
    return HFPolicy(tiny_model(seed, hidden=hidden), TOKENIZER, name="tiny", seed=seed)


def random_samples(seed: int = 0, n: int = 7, designer: bool = True) -> list[Sample]:
    """Sequences of varied length with a prompt, two sampled turns and an observation between."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt, turn, obs = 5 + i % 3, 4 + (3 * i) % 7, 3
        length = prompt + 2 * turn + obs
        ids = torch.randint(0, 256, (length,), generator=g).tolist()
        mask = [0] * prompt + [1] * turn + [0] * obs + [1] * turn
        adv = float(torch.randn((), generator=g))
        out.append(Sample(role="agent", group_id=f"env{i % 2}", token_ids=ids, loss_mask=mask,
                          behaviour_logprobs=None, advantage=adv))
    if designer:
        ids = torch.randint(0, 256, (30,), generator=g).tolist()
        mask = [0] * 10 + [1] * 20
        beh = [0.0] * 10 + (-5.5 + 0.3 * torch.randn(20, generator=g)).tolist()
        out.append(Sample(role="designer", group_id="Logic", token_ids=ids, loss_mask=mask,
                          behaviour_logprobs=beh, advantage=0.7, weight=4.0))
    return out


def grads(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
            if p.grad is not None}


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def reference_gradient(model, samples: list[Sample], cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The batch gradient the plain way: one padded forward with full logits, one grpo_loss."""
    model.zero_grad(set_to_none=True)
    width = max(len(s.token_ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.bool)
    beh = torch.zeros((len(samples), width - 1))
    for b, s in enumerate(samples):
        ids[b, :len(s.token_ids)] = torch.tensor(s.token_ids)
        attn[b, :len(s.token_ids)] = 1
        mask[b, :len(s.token_ids) - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    lp = token_logprobs(logits / cfg.temperature, ids[:, 1:])
    old = lp.detach()
    for b, s in enumerate(samples):
        if s.role in cfg.importance_sampling_roles:
            beh[b, :len(s.token_ids) - 1] = torch.tensor(s.behaviour_logprobs[1:])
        else:
            beh[b] = old[b]
    loss, _ = grpo_loss(lp, old, torch.tensor([s.advantage for s in samples]), mask,
                        sample_weights=torch.tensor([s.weight for s in samples]),
                        behaviour_logprobs=beh, is_cap=cfg.importance_sampling_cap,
                        epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
                        loss_type=cfg.loss_type)
    loss.backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_close(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=tol, rtol=1e-4), \
            (name, float((a[name] - b[name]).abs().max()))


# -- (a) it learns ---------------------------------------------------------------------------

LETTERS = {TOKENIZER.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"}


def test_grpo_learns_a_partial_credit_toy_task():
    """Reward: the share of 8 sampled tokens that are lowercase letters (about 0.1 at first)."""
    policy = make_policy(seed=3)
    trainer = PolicyTrainer(policy, TrainConfig(learning_rate=1e-2, seed=3))
    prompt = policy.render([{"role": "user", "content": "pick a letter"}])
    groups, plays, new_tokens = 2, 8, 8
    means = []
    for step in range(20):
        requests = [GenerationRequest(prompt_ids=prompt, params=SamplingParams(
            temperature=1.0, max_new_tokens=new_tokens, seed=step * 1000 + k))
            for k in range(groups * plays)]
        gens = policy.generate(requests)
        returns = [sum(t in LETTERS for t in g.token_ids) / new_tokens for g in gens]
        means.append(sum(returns) / len(returns))
        by_env = {f"g{j}": returns[j * plays:(j + 1) * plays] for j in range(groups)}
        adv = agent_advantages(by_env)
        samples = [Sample(role="agent", group_id=f"g{j}",
                          token_ids=prompt + gens[j * plays + i].token_ids,
                          loss_mask=[0] * len(prompt) + [1] * gens[j * plays + i].num_tokens,
                          behaviour_logprobs=[0.0] * len(prompt) + gens[j * plays + i].logprobs,
                          advantage=adv[f"g{j}"][i], generated_at_step=step)
                   for j in range(groups) for i in range(plays)]
        stats = trainer.train_step(samples)
        informative = any(a != 0 for s in adv.values() for a in s)
        assert math.isfinite(stats["loss"]) and stats["optimizer_steps"] == int(informative)
        if informative:  # on-policy, one iteration: the ratio is exactly 1
            assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    assert first < 0.3
    assert last > first + 0.3, means


# -- (b) micro-batching ----------------------------------------------------------------------

def test_pack_microbatches_respects_budget_and_rows():
    lengths = [10, 50, 20, 20, 5, 120]
    batches = pack_microbatches(lengths, max_tokens=60, max_rows=3)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
    assert [5] in batches  # longer than the budget: alone


@pytest.mark.parametrize("loss_type", ["token", "sequence"])
def test_gradient_is_independent_of_microbatching(loss_type):
    samples = random_samples(seed=1)
    results = []
    for budget, rows in [(10**6, 64), (40, 2), (1, 1)]:
        cfg = TrainConfig(loss_type=loss_type, max_tokens_per_microbatch=budget,
                          per_device_train_batch_size=rows, logprob_chunk_size=7)
        trainer = PolicyTrainer(make_policy(seed=2), cfg)
        stats = trainer.compute_gradients(samples)
        assert stats["num_importance_weighted"] == 1
        results.append((stats, grads(trainer)))
    assert results[0][0]["num_microbatches"] == 1
    assert results[2][0]["num_microbatches"] == len(samples)
    for stats, g in results[1:]:
        assert_close(g, results[0][1])
        # other micro-batch splits sum in another order: relative, float32 accumulation
        assert stats["loss"] == pytest.approx(results[0][0]["loss"], rel=1e-5, abs=1e-6)
    # ... and equals the plain full-batch computation (full logits, attention mask, one loss)
    model = tiny_model(seed=2)
    assert_close(results[1][1], reference_gradient(model, samples, TrainConfig(
        loss_type=loss_type)))


def test_parameter_update_is_independent_of_microbatching():
    samples = random_samples(seed=4)
    after = []
    for budget, rows in [(10**6, 64), (30, 1)]:
        trainer = PolicyTrainer(make_policy(seed=5), TrainConfig(
            learning_rate=1e-3, max_tokens_per_microbatch=budget,
            per_device_train_batch_size=rows))
        trainer.train_step(samples)
        after.append(params(trainer.model))
    assert_close(after[0], after[1])


def test_plain_forward_path_matches_split_head(monkeypatch):
    """Models with post-processed logits take the full forward; same gradient."""
    import spadekit.train.trainer as mod

    samples = random_samples(seed=6)
    cfg = TrainConfig(temperature=0.6)
    a = PolicyTrainer(make_policy(seed=7), cfg)
    a.compute_gradients(samples)
    monkeypatch.setattr(mod, "split_head", lambda model: None)
    b = PolicyTrainer(make_policy(seed=7), cfg)
    assert b._split is None
    b.compute_gradients(samples)
    assert_close(grads(a), grads(b))


@pytest.mark.parametrize("use_peft", [False, True])
def test_gradient_checkpointing_gives_the_same_gradient(use_peft):
    samples = random_samples(seed=30)
    out = []
    for checkpointing in (False, True):
        trainer = PolicyTrainer(make_policy(seed=31), TrainConfig(
            use_peft=use_peft, gradient_checkpointing=checkpointing, seed=1))
        with torch.no_grad():  # a non-zero adapter, so its gradient is not trivially shaped
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        trainer.compute_gradients(samples)
        out.append(grads(trainer))
    assert_close(out[0], out[1])


def test_zero_advantage_rows_are_skipped_but_normalise():
    samples = random_samples(seed=8, designer=False)
    zero = [Sample(role="agent", group_id="flat", token_ids=s.token_ids, loss_mask=s.loss_mask,
                   behaviour_logprobs=None, advantage=0.0) for s in samples[:3]]
    a = PolicyTrainer(make_policy(seed=9), TrainConfig())
    stats = a.compute_gradients(samples + zero)
    assert stats["skipped_zero_advantage"] == 3
    ref = reference_gradient(tiny_model(seed=9), samples + zero, TrainConfig())
    assert_close(grads(a), ref)


def test_num_iterations_makes_several_clipped_steps():
    samples = random_samples(seed=10, designer=False)
    trainer = PolicyTrainer(make_policy(seed=11), TrainConfig(learning_rate=5e-2,
                                                              num_iterations=3))
    stats = trainer.train_step(samples)
    assert stats["optimizer_steps"] == 3 and trainer.step == 3
    assert stats["ratio_mean"] != pytest.approx(1.0, abs=1e-4)  # later passes move off 1
    assert stats["clip_frac"] > 0


# -- (c) LoRA and the reference --------------------------------------------------------------

def test_lora_trains_only_the_adapter_and_kl_uses_the_disabled_base():
    policy = make_policy(seed=12)
    base_model = policy.model
    before = params(base_model)
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=True, beta=0.05, learning_rate=1e-2))
    assert policy.model is base_model  # the policy generates with the injected adapter
    wrapped = params(base_model)
    samples = random_samples(seed=13, designer=False)
    prompt, completion = samples[0].token_ids[:5], samples[0].token_ids[5:]
    lp_before = sequence_logprobs(policy.model, prompt, completion)
    first = trainer.train_step(samples)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # adapter B starts at zero
    for _ in range(4):
        last = trainer.train_step(samples)
    assert last["kl"] > 1e-5
    now = params(base_model)
    lora = {n for n in now if "lora_" in n}
    assert lora and all(not torch.equal(now[n], wrapped[n]) for n in lora if "lora_B" in n)
    for n in now.keys() - lora:  # base weights bit-identical to before the adapter went in
        assert torch.equal(now[n], before[n.replace(".base_layer", "")]), n
    lp_after = sequence_logprobs(policy.model, prompt, completion)
    assert max(abs(a - b) for a, b in zip(lp_before, lp_after)) > 1e-4  # generation sees it
    with trainer.model.disable_adapter():
        lp_ref = sequence_logprobs(policy.model, prompt, completion)
    assert lp_ref == pytest.approx(sequence_logprobs(tiny_model(seed=12), prompt, completion),
                                   abs=1e-5)


def test_full_finetune_reference_is_a_frozen_copy():
    trainer = PolicyTrainer(make_policy(seed=14), TrainConfig(beta=0.05, learning_rate=1e-2))
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    ref_before = params(trainer.ref_model)
    samples = random_samples(seed=15, designer=False)
    assert trainer.train_step(samples)["kl"] == pytest.approx(0.0, abs=1e-7)
    for _ in range(3):
        kl = trainer.train_step(samples)["kl"]
    assert kl > 1e-5
    assert_close(params(trainer.ref_model), ref_before, tol=0.0)


# -- (d) truncated importance sampling, dropped samples ---------------------------------------

def _designer_from(sample: Sample, model, shift: float, weight: float = 1.0) -> Sample:
    """``sample`` as a designer sample whose behaviour logprobs are ``old - shift``."""
    old = sequence_logprobs(model, sample.token_ids[:1], sample.token_ids[1:])
    beh = [0.0] + [lp - shift for lp in old]
    return Sample(role="designer", group_id="Logic", token_ids=sample.token_ids,
                  loss_mask=sample.loss_mask, behaviour_logprobs=beh,
                  advantage=sample.advantage, weight=weight)


@pytest.mark.parametrize("ratio, expected", [(0.5, 0.5), (10.0, 2.0)])
def test_truncated_importance_weight_scales_the_gradient(ratio, expected):
    base = random_samples(seed=16, n=1, designer=False)[0]
    plain = PolicyTrainer(make_policy(seed=17), TrainConfig())
    plain.compute_gradients([base])
    tis = PolicyTrainer(make_policy(seed=17), TrainConfig())
    designer = _designer_from(base, tis.model, shift=math.log(ratio))
    stats = tis.compute_gradients([designer])
    assert stats["num_importance_weighted"] == 1
    assert stats["tis_mean"] == pytest.approx(expected, rel=1e-4)
    assert stats["tis_capped_frac"] == (1.0 if ratio > 2 else 0.0)
    assert_close(grads(tis), {n: expected * g for n, g in grads(plain).items()}, tol=1e-6)


def test_samples_without_logprobs_or_truncated_are_dropped_and_counted():
    samples = random_samples(seed=18)
    no_lp = Sample(role="designer", group_id="Logic", token_ids=samples[0].token_ids,
                   loss_mask=samples[0].loss_mask, behaviour_logprobs=None, advantage=1.0)
    truncated = Sample(role="agent", group_id="env0", token_ids=samples[1].token_ids,
                       loss_mask=samples[1].loss_mask, behaviour_logprobs=None, advantage=2.0)
    truncated.truncated = True  # set by the caller for truncated episodes
    empty = Sample(role="agent", group_id="env0", token_ids=[1, 2, 3], loss_mask=[1, 0, 0],
                   behaviour_logprobs=None, advantage=1.0)
    cfg = TrainConfig(mask_truncated_completions=True)
    a = PolicyTrainer(make_policy(seed=19), cfg)
    stats = a.train_step(samples + [no_lp, truncated, empty])
    assert (stats["dropped_no_logprobs"], stats["dropped_truncated"],
            stats["dropped_empty"]) == (1, 1, 1)
    assert stats["num_samples"] == len(samples) + 3
    assert stats["num_samples_trained"] == len(samples)
    b = PolicyTrainer(make_policy(seed=19), cfg)
    stats_b = b.train_step(samples)
    assert stats_b["loss"] == pytest.approx(stats["loss"], abs=1e-7)
    assert_close(params(a.model), params(b.model), tol=0.0)
    nothing = PolicyTrainer(make_policy(seed=19), cfg).train_step([no_lp])
    assert nothing["optimizer_steps"] == 0 and nothing["dropped_no_logprobs"] == 1


def test_out_of_vocabulary_ids_are_rejected():
    trainer = PolicyTrainer(make_policy(seed=0), TrainConfig())
    bad = Sample(role="agent", group_id="e", token_ids=[1, 99999], loss_mask=[0, 1],
                 behaviour_logprobs=None, advantage=1.0)
    with pytest.raises(ValueError, match="vocabulary"):
        trainer.train_step([bad])


# -- (e) checkpoints ---------------------------------------------------------------------------

def _state(trainer):
    return params(trainer.model), trainer.optimizer.state_dict()


def _assert_same_optimizer(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, value in a["state"][k].items():
            assert torch.equal(value, b["state"][k][name]), (k, name)


@pytest.mark.parametrize("use_peft", [False, True])
def test_save_load_round_trip_is_exact(tmp_path, use_peft):
    import random

    cfg = TrainConfig(learning_rate=1e-2, use_peft=use_peft, seed=21)
    batch1, batch2 = random_samples(seed=22), random_samples(seed=23)
    a = PolicyTrainer(make_policy(seed=20), cfg)
    a.train_step(batch1)
    a.save(tmp_path / "ckpt")
    files = {p.name for p in (tmp_path / "ckpt" / "model").iterdir()}
    if use_peft:
        assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    else:
        assert "model.safetensors" in files
    assert "tokenizer.json" in files
    draws_a = (torch.rand(3), random.random())
    stats_a = a.train_step(batch2)
    params_a, opt_a = _state(a)

    # other weights: all must come from the file (with LoRA the base is the same model and the
    # adapter, trained away from its initial value, comes from the file)
    b = PolicyTrainer(make_policy(seed=20 if use_peft else 99), cfg)
    if use_peft:
        lora_b = [n for n in params(b.model) if "lora_B" in n]
        assert all(torch.count_nonzero(params(b.model)[n]) == 0 for n in lora_b)
    state = b.load(tmp_path / "ckpt")
    assert state["step"] == 1 and b.step == 1
    draws_b = (torch.rand(3), random.random())
    assert torch.equal(draws_a[0], draws_b[0]) and draws_a[1] == draws_b[1]
    stats_b = b.train_step(batch2)
    params_b, opt_b = _state(b)
    for key in ("loss", "grad_norm", "clip_frac", "tis_mean", "step"):
        assert stats_a[key] == stats_b[key], key
    assert_close(params_a, params_b, tol=0.0)
    _assert_same_optimizer(opt_a, opt_b)


KILL_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from spadekit.policy.hf import HFPolicy
    from spadekit.policy.tiny import tiny_model, tiny_tokenizer
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer
    trainer = PolicyTrainer(HFPolicy(tiny_model(5), tiny_tokenizer()), TrainConfig())
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    real_save = torch.save
    def dying_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        os._exit(17)  # killed mid-checkpoint, after the weights and part of the state
    torch.save = dying_save
    trainer.save(sys.argv[1])
""")


def test_killed_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    trainer = PolicyTrainer(make_policy(seed=24), TrainConfig(learning_rate=1e-2))
    trainer.train_step(random_samples(seed=25))
    trainer.save(ckpt)
    saved = params(trainer.model)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(ckpt)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    leftovers = list(tmp_path.glob(".ckpt.tmp-*"))
    assert leftovers, "the killed save should have left its temp dir"
    fresh = PolicyTrainer(make_policy(seed=26), TrainConfig(learning_rate=1e-2))
    assert fresh.load(ckpt)["step"] == 1
    assert_close(params(fresh.model), saved, tol=0.0)
    fresh.save(ckpt)  # the next save clears the debris
    assert not list(tmp_path.glob(".ckpt.tmp-*"))
    # a save that died between its two renames: the previous checkpoint is found aside
    os.rename(ckpt, tmp_path / ".ckpt.old-deadbeef")
    again = PolicyTrainer(make_policy(seed=27), TrainConfig(learning_rate=1e-2))
    assert again.load(ckpt)["step"] == 1
    assert_close(params(again.model), saved, tol=0.0)


def test_incomplete_checkpoint_is_refused(tmp_path):
    (tmp_path / "half").mkdir()
    trainer = PolicyTrainer(make_policy(seed=0), TrainConfig())
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        trainer.load(tmp_path / "half")


def test_config_defaults_and_validation():
    cfg = TrainConfig()
    assert (cfg.learning_rate, cfg.weight_decay, cfg.adam_beta1, cfg.adam_beta2) == \
        (1e-6, 0.1, 0.9, 0.98)
    assert (cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type) == (0.2, 0.28, 0.0, "token")
    assert cfg.importance_sampling_cap == 2.0 and cfg.num_iterations == 1
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError):
        TrainConfig(loss_type="dapo")
    for tiny in (2.2e-311, 1e-5, 0.00999, 0.0):  # the PPO ratio overflows at 1e-5
        with pytest.raises(ValueError, match="temperature"):
            TrainConfig(temperature=tiny)
    assert TrainConfig(temperature=0.01).temperature == 0.01
    with pytest.raises(ValueError):
        TrainConfig.from_dict({"learning_rte": 1.0})
