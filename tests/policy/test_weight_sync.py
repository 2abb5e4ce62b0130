"""Weight sync (``spadekit.policy.weight_sync``): a trained tiny model's weights pushed into a
separate generation copy (in process) and into ``spadekit serve`` (over HTTP), with and without
LoRA; the copy then generates exactly what the trained policy generates. CPU, seconds."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import save  # noqa: E402

from spadekit.selfplay.advantages import Sample  # noqa: E402
from spadekit.common.errors import SpadekitError  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.policy.openai_backend import OpenAIPolicy  # noqa: E402
from spadekit.policy.serve import serve  # noqa: E402
from spadekit.policy.weight_sync import (TOKEN_HEADER, WEIGHTS_PATH, WeightSyncError,  # noqa: E402
                                         push_weights, trainer_weights)
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.trainer import PolicyTrainer  # noqa: E402

TOKEN = "s3cret-token"


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
    stats = push_weights(gen, trainer_weights(trainer), version=trainer.step)
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
    assert_same_generations(policy, gen, tol=1e-5)


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


# -- (b) server ---------------------------------------------------------------------------------

def _post(url: str, body: bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/octet-stream"}
    if token is not None:
        headers[TOKEN_HEADER] = token
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server():
    served = load_policy("tiny")
    with serve(served, allow_weight_updates=True, weights_token=TOKEN) as srv:
        yield srv, served


def client(url: str, token: str | None = TOKEN) -> OpenAIPolicy:
    return OpenAIPolicy("tiny", base_url=url, tokenizer=load_policy("tiny").tokenizer,
                        weights_token=token)


@pytest.mark.parametrize("peft", [False, True])
def test_server_push_then_generate_matches_trained(server, peft):
    srv, served = server
    policy, trainer, _ = trained(peft=peft)
    with client(srv.url) as remote:
        assert {"token_ids", "logprobs"} <= remote.capabilities
        stats = push_weights(remote, trainer_weights(trainer), version=41 + int(peft),
                             chunk_mb=None if not peft else 0.05)
        assert stats["loaded"] == 20 and remote.weights_version == 41 + int(peft)
        assert stats["chunks"] == 1 if not peft else stats["chunks"] > 1  # staged upload
        want = merged_state(trainer) if peft else policy.model.state_dict()
        got = served.model.state_dict()
        assert max(float((want[k] - got[k]).abs().max()) for k in want) <= 1e-6
        assert_same_generations(policy, remote, tol=1e-5 if peft else 0.0)
    with urllib.request.urlopen(srv.url + "/spadekit/weights", timeout=10) as resp:
        info = json.loads(resp.read())
    assert info["weight_updates"] is True and info["version"] == 41 + int(peft)
    with urllib.request.urlopen(srv.url[:-3] + "/health", timeout=10) as resp:
        assert json.loads(resp.read())["weight_updates"] is True


def test_server_refusals(server):
    srv, served = server
    url = srv.url[:-3] + WEIGHTS_PATH
    before = {k: v.clone() for k, v in served.model.state_dict().items()}
    good = {"model.norm.weight": torch.full((64,), 3.0)}
    assert _post(url, save(good), None)[0] == 403
    assert _post(url, save(good), "wrong")[0] == 403
    with client(srv.url, token="wrong") as remote, pytest.raises(WeightSyncError) as err:
        remote.load_weights(good)
    assert err.value.status == 403 and "token" in err.value.message.lower()
    status, body = _post(url, b"not a safetensors file", TOKEN)
    assert status == 400 and "safetensors" in body["error"]["message"]
    status, body = _post(url, save({**good, "no.such.weight": torch.zeros(2)}), TOKEN)
    assert status == 400 and "no.such.weight" in body["error"]["message"]
    with client(srv.url) as remote, pytest.raises(WeightSyncError, match="unknown names"):
        push_weights(remote, {**good, "model.layers.9.x.weight": torch.zeros(2)}, chunk_mb=1e-4)
    after = served.model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)  # atomic: nothing applied


def test_server_without_weight_updates_refuses():
    with serve(load_policy("tiny")) as srv:
        url = srv.url[:-3] + WEIGHTS_PATH
        assert _post(url, save({"model.norm.weight": torch.ones(64)}), TOKEN)[0] == 403
        with client(srv.url) as remote, pytest.raises(WeightSyncError, match="does not accept"):
            remote.load_weights({"model.norm.weight": torch.ones(64)})
    with pytest.raises(SpadekitError, match="needs a shared secret"):
        serve(load_policy("tiny"), allow_weight_updates=True, weights_token="")


# -- (c) names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("peft", [False, True])
def test_trainer_weights_names_are_hf_state_dict_names(tmp_path, peft):
    from transformers import AutoModelForCausalLM

    policy = load_policy("tiny")
    policy.model.save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    trainer = PolicyTrainer(policy, TrainConfig(use_peft=peft))
    names = dict(trainer_weights(trainer))
    assert len(names) == len(list(trainer_weights(trainer)))  # each name once
    assert set(names) == set(hf) - {"lm_head.weight"}  # the tied head comes once, as embed
    assert all(tuple(names[k].shape) == tuple(hf[k].shape) for k in names)
