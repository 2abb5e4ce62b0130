"""The ``vllm`` backend without vLLM: the import guard, the mapping to and from vLLM's API
checked against a stand-in ``vllm`` module (``LLM``, ``SamplingParams``) written here, and the
checks a weight push passes before it reaches the engine.

What vLLM itself does (logprob semantics, weight pushes) is tested against the real engine in
``tests/policy/test_vllm_engine.py``.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.policy import GenerationRequest, Policy, PolicyError, SamplingParams, load_policy


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from spadekit.policy.tiny import tiny_tokenizer

    return tiny_tokenizer()


class FakeLogprob:
    def __init__(self, logprob):
        self.logprob = logprob
        self.rank = 1


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    """Records how it was built and called; answers from ``script``: text to emit per prompt."""

    reject_logprobs_mode = False

    def __init__(self, model, **kwargs):
        if self.reject_logprobs_mode and "logprobs_mode" in kwargs:
            raise TypeError("EngineArgs.__init__() got an unexpected keyword argument "
                            "'logprobs_mode'")
        self.model = model
        self.kwargs = kwargs
        self.calls = []
        self.script = []
        self.resets = 0
        self.tok = None
        self.llm_engine = FakeEngine(self)

    def get_tokenizer(self):
        return self.tok

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        outs = []
        for k, (prompt, sp) in enumerate(zip(prompts, sampling_params)):
            ids, reason = self.script[k]
            lps = [{t: FakeLogprob(-0.1 * (j + 1))} for j, t in enumerate(ids)]
            seq = types.SimpleNamespace(token_ids=tuple(ids), logprobs=lps, finish_reason=reason,
                                        text="(vllm text, not used)")
            outs.append(types.SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"],
                                              outputs=[seq]))
        return outs

    def reset_prefix_cache(self):
        self.resets += 1



class FakeEngine:
    """vLLM's step API over ``FakeLLM.generate``: the requests added since the last step are
    answered, all finished, by the next ``step()``."""

    def __init__(self, llm):
        self.llm, self.pending, self.aborted = llm, [], []

    def add_request(self, request_id, prompt, params):
        self.pending.append((request_id, prompt, params))

    def has_unfinished_requests(self):
        return bool(self.pending)

    def abort_request(self, ids):
        self.aborted.extend(ids)
        self.pending = [p for p in self.pending if p[0] not in ids]

    def step(self):
        batch, self.pending = self.pending, []
        outs = self.llm.generate([p for _r, p, _sp in batch], sampling_params=[
            sp for _r, _p, sp in batch], use_tqdm=False)
        for (rid, _p, _sp), out in zip(batch, outs):
            out.request_id, out.finished = rid, True
        return outs


def install_fake_vllm(monkeypatch, mod) -> None:
    """``mod`` as the ``vllm`` package, with the ``vllm.sampling_params.RequestOutputKind`` the
    backend's step loop sets (also used by ``test_special_tokens``)."""
    kinds = types.ModuleType("vllm.sampling_params")
    kinds.RequestOutputKind = types.SimpleNamespace(CUMULATIVE="cumulative",
                                                    FINAL_ONLY="final_only")
    kinds.StructuredOutputsParams = lambda **kw: types.SimpleNamespace(**kw)
    mod.sampling_params = kinds
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", kinds)


@pytest.fixture
def fake_vllm(monkeypatch, tokenizer):
    mod = types.ModuleType("vllm")

    class LLM(FakeLLM):
        def __init__(self, model, **kwargs):
            super().__init__(model, **kwargs)
            self.tok = tokenizer
            mod.built.append(self)

    mod.LLM = LLM
    mod.SamplingParams = FakeSamplingParams
    mod.built = []
    install_fake_vllm(monkeypatch, mod)
    return mod


def test_import_guard(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vllm were not installed
    backend = importlib.reload(importlib.import_module("spadekit.policy.vllm_backend"))
    with pytest.raises(PolicyError, match="pip install vllm"):
        backend.VLLMPolicy("some/model")
    with pytest.raises(PolicyError, match="pip install vllm"):
        load_policy("vllm:some/model")


def test_engine_is_built_with_processed_logprobs(fake_vllm):
    policy = load_policy("vllm:org/model", dtype="float32", gpu_memory_utilization=0.5)
    from spadekit.policy.vllm_backend import _cpu_defaults

    llm = fake_vllm.built[0]
    assert llm.model == "org/model"
    assert llm.kwargs == {"logprobs_mode": "processed_logprobs", **_cpu_defaults(),
                          "dtype": "float32", "gpu_memory_utilization": 0.5,
                          "structured_outputs_config": {"backend": "guidance"}}
    assert isinstance(policy, Policy) and policy.name == "vllm:org/model"
    assert policy.capabilities == frozenset({"token_ids", "logprobs"})
    assert "train" not in policy.capabilities
    assert policy.logprobs_exact(SamplingParams(temperature=0.7))
    assert not policy.logprobs_exact(SamplingParams(temperature=0.7, top_p=0.9))


def test_a_grammar_goes_to_vllms_structured_outputs(fake_vllm):
    policy = load_policy("vllm:org/model")
    grammar = 'start: "yes" | "no"'
    ruled = policy.sampling_params(SamplingParams(grammar=grammar)).kwargs
    assert ruled["structured_outputs"].grammar == grammar
    assert "structured_outputs" not in policy.sampling_params(SamplingParams()).kwargs
    built = load_policy("vllm:org/model", structured_outputs_config={"backend": "xgrammar"})
    assert built.llm.kwargs["structured_outputs_config"] == {"backend": "xgrammar"}


def test_old_vllm_without_logprobs_mode(fake_vllm, monkeypatch):
    monkeypatch.setattr(FakeLLM, "reject_logprobs_mode", True)
    with pytest.warns(UserWarning, match="logprobs_mode"):
        policy = load_policy("vllm:org/model")
    assert "logprobs_mode" not in fake_vllm.built[-1].kwargs
    assert policy.logprobs_mode == "raw_logprobs"
    assert policy.logprobs_exact(SamplingParams(temperature=1.0, top_p=0.5))
    assert not policy.logprobs_exact(SamplingParams(temperature=0.7))


def test_sampling_params_and_outputs(fake_vllm, tokenizer):
    from spadekit.policy.vllm_backend import load_vllm

    policy = load_vllm("vllm:org/model")
    llm = fake_vllm.built[0]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    enc = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    llm.script = [(enc("Hi. More") , "stop"), (enc("abc") + [im_end], "stop"),
                  (enc("xyzw"), "length")]
    messages = [{"role": "user", "content": "hello"}]
    reqs = [GenerationRequest(prompt_ids=[5, 6, 7], params=SamplingParams(
                temperature=0.7, top_p=0.95, max_new_tokens=9, stop=("."), seed=11)),
            GenerationRequest(messages=messages),
            GenerationRequest(prompt_ids=[8], params=SamplingParams(temperature=0,
                                                                    max_new_tokens=4))]
    gens = policy.generate(reqs)

    prompts, params, use_tqdm = llm.calls[0]
    assert use_tqdm is False
    assert prompts[0] == {"prompt_token_ids": [5, 6, 7]}
    assert prompts[1] == {"prompt_token_ids": policy.render(messages)}
    first = params[0].kwargs
    assert first == {"n": 1, "temperature": 0.7, "top_p": 0.95, "max_tokens": 9, "logprobs": 0,
                     "stop": ["."], "seed": 11, "stop_token_ids": sorted(policy.stop_ids),
                     "include_stop_str_in_output": True, "skip_special_tokens": True}
    assert im_end in first["stop_token_ids"]
    assert "stop" not in params[1].kwargs and "seed" not in params[1].kwargs
    assert params[1].kwargs["max_tokens"] == SamplingParams().max_new_tokens
    assert params[2].kwargs["temperature"] == 0.0

    g0, g1, g2 = gens
    assert g0.prompt_ids == [5, 6, 7] and g0.token_ids == enc("Hi. More")
    assert g0.logprobs == pytest.approx([-0.1 * (j + 1) for j in range(len(g0.token_ids))])
    assert (g0.text, g0.finish_reason) == ("Hi.", "stop")  # cut after the stop string
    assert g1.token_ids[-1] == im_end and g1.text == "abc"  # end-of-turn kept as a token
    assert (g2.text, g2.finish_reason) == ("xyzw", "length")


def test_bad_outputs_are_policy_errors(fake_vllm):
    policy = load_policy("vllm:m")
    llm = fake_vllm.built[0]
    llm.script = [([1, 2], "abort")]
    with pytest.raises(PolicyError, match="abort"):
        policy.generate([GenerationRequest(prompt_ids=[3])])
    llm.generate = lambda *a, **k: [types.SimpleNamespace(outputs=[types.SimpleNamespace(
        token_ids=[4], logprobs=[{5: FakeLogprob(-1.0)}], finish_reason="stop")])]
    with pytest.raises(PolicyError, match="sampled token 4"):
        policy.generate([GenerationRequest(prompt_ids=[3])])
    with pytest.raises(PolicyError, match="empty prompt"):
        policy.generate([GenerationRequest(prompt_ids=[])])


def test_pushes_are_checked_before_they_reach_the_engine(tmp_path):
    """Names, shapes and fused groups against the checkpoint's safetensors headers (vLLM's
    reload leaves half-initialised layers behind when a tensor does not fit)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from spadekit.policy.vllm_weights import check_items, checkpoint_shapes
    from spadekit.policy.weight_items import WeightSyncError

    names = {f"model.layers.0.self_attn.{p}_proj.weight": (4, 8) for p in "qkv"}
    names.update({"model.layers.0.mlp.gate_proj.weight": (6, 8),
                  "model.layers.0.mlp.up_proj.weight": (6, 8), "model.norm.weight": (8,)})
    save_file({n: torch.zeros(s) for n, s in names.items()}, str(tmp_path / "model.safetensors"))
    shapes = checkpoint_shapes(tmp_path)
    assert shapes == names and checkpoint_shapes(tmp_path / "missing") == {}
    full = [(n, torch.ones(s)) for n, s in names.items()]
    check_items(full, shapes, "m")  # a whole model is fine
    check_items([("model.norm.weight", torch.ones(8))], shapes, "m")  # so is one norm
    with pytest.raises(WeightSyncError, match="fused.*k_proj"):
        check_items([full[0]], shapes, "m")
    with pytest.raises(WeightSyncError, match="fused.*up_proj"):
        check_items([("model.layers.0.mlp.gate_proj.weight", torch.ones(6, 8))], shapes, "m")
    with pytest.raises(WeightSyncError, match="shape mismatches"):
        check_items([("model.norm.weight", torch.ones(9))], shapes, "m")
    with pytest.raises(WeightSyncError, match="unknown names"):
        check_items([("lm_head.weight", torch.ones(9))], shapes, "m")
    with pytest.raises(WeightSyncError, match="twice"):
        check_items([("model.norm.weight", torch.ones(8))] * 2, shapes, "m")


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z]{1,6}(\.[a-z0-9]{1,4}){0,3}", fullmatch=True),
                       st.lists(st.integers(1, 4), min_size=0, max_size=3), min_size=1,
                       max_size=6))
def test_checkpoint_shapes_reads_what_safetensors_wrote(shapes):
    torch = pytest.importorskip("torch")
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    from spadekit.policy.vllm_weights import checkpoint_shapes

    with tempfile.TemporaryDirectory() as d:
        save_file({n: torch.zeros(s) for n, s in shapes.items()}, str(Path(d) / "a.safetensors"))
        assert checkpoint_shapes(d) == {n: tuple(s) for n, s in shapes.items()}


def test_wrapping_an_existing_engine(fake_vllm, tokenizer):
    from spadekit.policy.vllm_backend import VLLMPolicy

    engine = FakeLLM("x")
    engine.llm_engine.model_config = types.SimpleNamespace(logprobs_mode="processed_logprobs")
    policy = VLLMPolicy(llm=engine, tokenizer=tokenizer)
    assert policy.logprobs_mode == "processed_logprobs" and policy.tokenizer is tokenizer
    assert "load_weights" in policy.explain_capabilities()
