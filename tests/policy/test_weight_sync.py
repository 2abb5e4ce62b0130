"""Weight sync (``spadekit.train.weight_sync``): a trained tiny model's weights pushed into a
separate generation copy, with and without LoRA (merged by peft's ``merge_adapter``); the copy
then generates exactly what the trained policy generates, and the trained model is bit for bit
what it was. Pushes to a real ``vllm serve``: ``test_vllm_server.py``. CPU, seconds."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from spadekit.selfplay.advantages import Sample  # noqa: E402
from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.train.weight_sync import (WeightSyncError, push_weights,  # noqa: E402
                                        trainer_weights)
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.trainer import PolicyTrainer  # noqa: E402


def samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(4):
        ids = torch.randint(0, 256, (20,), generator=g).tolist()
        out.append(Sample(role="agent", group_id=f"env{i % 2}", token_ids=ids,
                          loss_mask=[0] * 8 + [1] * 12, behaviour_logprobs=None,
                          advantage=1.0 if i % 2 else -1.0))
    return out


def trained(peft: bool):
    policy = load_policy("tiny")
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=peft, learning_rate=1e-2))
    assert trainer.train_step(samples())["optimizer_steps"] == 1
    return policy, trainer, before


def requests() -> list[GenerationRequest]:
    prompts = [[1, 72, 105, 10], [1, 87, 111, 114, 108, 100, 10, 2], [1, 65, 10]]
    temps = [1.0, 0.7, 0.0]
    return [GenerationRequest(prompt_ids=p, params=SamplingParams(
        temperature=t, max_new_tokens=12, seed=100 + k)) for k, (p, t) in
        enumerate(zip(prompts, temps))]


def assert_same_generations(a, b, tol: float) -> None:
    for req in requests():  # one at a time: the same batch composition on both sides
        ga, gb = a.generate([req])[0], b.generate([req])[0]
        assert ga.token_ids == gb.token_ids
        assert ga.logprobs == pytest.approx(gb.logprobs, abs=tol, rel=0)


def merged_state(trainer: PolicyTrainer) -> dict:
    """The reference merge: peft's own merge_and_unload on a copy."""
    return copy.deepcopy(trainer.model).merge_and_unload().state_dict()


# -- (a) colocated ------------------------------------------------------------------------------

def test_colocated_full_finetune_push_is_exact():
    policy, trainer, before = trained(peft=False)
    gen = load_policy("tiny")
    with trainer_weights(trainer) as weights:
        stats = push_weights(gen, weights, version=trainer.step)
    assert stats["tensors"] == 20 and stats["bytes"] > 0 and gen.weights_version == 1
    want, got = policy.model.state_dict(), gen.model.state_dict()
    assert set(want) == set(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert any(not torch.equal(want[k], before[k]) for k in want)  # training changed something
    assert_same_generations(policy, gen, tol=0.0)


def test_colocated_lora_push_is_merged():
    policy, trainer, before = trained(peft=True)
    ref = merged_state(trainer)
    assert any(not torch.equal(ref[k], before[k]) for k in ref)  # the adapter is not a no-op
    gen = load_policy("tiny")
    push_weights(gen, trainer, chunk_mb=0.05)  # a trainer goes through trainer_weights; chunks
    got = gen.model.state_dict()
    assert set(got) == set(ref)
    assert max(float((ref[k] - got[k]).abs().max()) for k in ref) <= 1e-6
    # the trained model is untouched: adapters still in, still active, base weights unmerged
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.get_base_model().state_dict()
               .items() if ".base_layer." not in k and "lora_" not in k)
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules())
    assert_same_generations(policy, gen, tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lora_sync_leaves_the_trained_model_bit_identical(dtype):
    """merge_adapter then unmerge_adapter rounds (W + BA) - BA: the sync copies the unmerged
    weights back, so training goes on from exactly the weights it had."""
    policy = load_policy("tiny")
    policy.model.to(dtype)
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=True, learning_rate=1e-2))
    trainer.train_step(samples())
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with trainer_weights(trainer) as weights:
        merged = {n: t.clone() for n, t in weights}
    after = trainer.model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)
    ref = merged_state(trainer)
    assert any(not torch.equal(merged[k], before["base_model.model." + k.replace(
        ".weight", ".base_layer.weight")]) for k in merged if "q_proj" in k)  # really merged
    assert all(torch.equal(merged[k], ref[k]) for k in merged)  # what peft's own merge gives


def test_a_merge_that_fails_half_way_leaves_the_trained_model_bit_identical(monkeypatch):
    """Out of memory in the 7th LoRA layer's merge: the layers merged before it are undone and
    the model is exactly what it was; the error reaches the caller."""
    policy = load_policy("tiny")
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=True, learning_rate=1e-2))
    trainer.train_step(samples())
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    layers = [m for m in trainer.model.modules() if hasattr(m, "lora_A") and hasattr(m, "merge")]
    assert len(layers) > 7

    def out_of_memory(*args, **kwargs):
        raise MemoryError("simulated: no room for the merged weight")

    monkeypatch.setattr(layers[6], "merge", out_of_memory)
    with pytest.raises(MemoryError):
        with trainer_weights(trainer):
            pass
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules())
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_load_weights_refuses_bad_names_and_shapes_atomically():
    gen = load_policy("tiny")
    before = {k: v.clone() for k, v in gen.model.state_dict().items()}
    good = ("model.norm.weight", torch.zeros(64))
    with pytest.raises(WeightSyncError, match="unknown names.*no.such"):
        gen.load_weights([good, ("no.such.weight", torch.zeros(3))])
    with pytest.raises(WeightSyncError, match="shape mismatches"):
        gen.load_weights([good, ("model.layers.0.mlp.up_proj.weight", torch.zeros(2, 2))])
    assert all(torch.equal(v, before[k]) for k, v in gen.model.state_dict().items())
    with pytest.raises(WeightSyncError, match="no load_weights"):
        push_weights(object(), {"x": torch.zeros(1)})
    assert issubclass(WeightSyncError, SpadekitError)
    # dtype cast on copy; a tied alias updates both names
    assert gen.load_weights({"lm_head.weight": torch.ones(260, 64, dtype=torch.float64)}) == 1
    assert torch.equal(gen.model.model.embed_tokens.weight, torch.ones(260, 64))


# -- (c) names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("peft", [False, True])
def test_trainer_weights_names_are_hf_state_dict_names(tmp_path, peft):
    from transformers import AutoModelForCausalLM

    policy = load_policy("tiny")
    policy.model.save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=peft))
    with trainer_weights(trainer) as weights:
        names = dict(weights)
        assert len(names) == len(weights)  # each name once
    assert set(names) == set(hf) - {"lm_head.weight"}  # the tied head comes once, as embed
    assert all(tuple(names[k].shape) == tuple(hf[k].shape) for k in names)
