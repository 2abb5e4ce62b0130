"""The slime adapter (``spadekit.integrations.slime``), on CPU without slime.

Samples come from real spadekit parts: agent samples from a ``RolloutEngine`` run of library
programs with the tiny model (multi-turn, so loss masks have holes), designer samples from two
rounds of ``RoundProducer`` (the tiny agent plus a scripted designer that writes library
programs; round 1 trains round 0's designs, with the logprobs stored at design time).

slime itself is never imported: the thin glue is exercised against stand-in modules that carry
only the names and fields read from slime v0.3.0 (``slime/utils/types.py``,
``slime/rollout/base_types.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import random
import subprocess
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from spadekit.selfplay.advantages import Sample, agent_advantages
from spadekit.selfplay.config import load_config
from spadekit.envs import library
from spadekit.envs.program import EnvProgram
from spadekit.integrations import slime as sl
from spadekit.policy.base import GenerationRequest, SamplingParams
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from spadekit.train.loss import clipped_surrogate, grpo_loss
from test_selfplay import designer_responder  # noqa: E402 (tests/ is on sys.path)

SRC = str(Path(__file__).resolve().parents[2] / "src")
GAMES = ["games_code_breaker", "games_modular_search", "games_sequence_rule"]
GAME_SOURCES = [library.source(name) for name in GAMES]  # what the scripted designer writes


def lib(name: str) -> EnvProgram:
    return library.program(library.get(name))


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


@pytest.fixture(scope="module")
def spool():
    """One sandbox pool of the strongest tier that works here (the adapter is tier-blind)."""
    from conftest import TEST_CONFIG, TIERS
    from spadekit.sandbox import SandboxConfig, SandboxPool

    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    p = SandboxPool(SandboxConfig(tier=TIERS[0], **TEST_CONFIG), warm=2)
    yield p
    p.close()


@pytest.fixture(scope="module")
def agent_samples(spool, tiny):
    """Real multi-turn plays of library programs by the tiny model, as GRPO agent samples."""
    engine = RolloutEngine(tiny, spool, RolloutConfig(max_turns=3, max_new_tokens=16, seed=7,
                                                     temperature=1.0))
    specs = [EpisodeSpec(lib(name), seed=s, tag={"env": name}) for name in GAMES[:2]
             for s in range(3)]
    trajs = [t for t in engine.run(specs) if t.failure is None]
    groups: dict[str, list] = {}
    for t in trajs:
        groups.setdefault(t.spec.tag["env"], []).append(t)
    advs = agent_advantages({k: [t.episode_return + 0.01 * i for i, t in enumerate(v)]
                             for k, v in groups.items()})
    out = []
    for env, group in groups.items():
        for t, a in zip(group, advs[env]):
            out.append(Sample(role="agent", group_id=env, token_ids=t.token_ids,
                              loss_mask=t.loss_mask, behaviour_logprobs=t.logprobs, advantage=a,
                              truncated=t.truncated and not t.terminated))
    assert len(out) >= 4
    return out, trajs


def producer_config(**extra):
    sets = ["model=tiny", "envs_per_round=2", "num_generations=3", "hint_generations=2",
            "regen_interval=1", "bootstrap=null", "memory_seed_library=false",
            "rollout.max_turns=12", "rollout.max_new_tokens=12", "rollout.temperature=1.0",
            "designer.temperature=1.0", "rollout.max_context_tokens=16384",
            "designer.max_new_tokens=16384", "sandbox.step_timeout=3.0", "dedup_threshold=1.01",
            "tensorboard=false"]
    sets += [f"{k}={v}" for k, v in extra.items()]
    return load_config(preset=None, overrides=sets)


@pytest.fixture(scope="module")
def produced(tmp_path_factory, tiny):
    """Two rounds through RoundProducer: round 1 carries round 0's designer samples."""
    run = tmp_path_factory.mktemp("slime") / "run"
    designer = ScriptedPolicy(tiny.tokenizer, designer_responder(GAME_SOURCES))
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    with sl.RoundProducer(producer_config(), run, policy=tiny, designer_policy=designer) as p:
        s0, m0 = p.produce()
        s1, m1 = p.produce()
        assert p.next_step == 2 and p.store.latest_complete_step() == 1
    after = tiny.model.state_dict()
    assert all(before[k].equal(after[k]) for k in before), "the producer must not train"
    return {"run": run, "rounds": [(s0, m0), (s1, m1)], "designer": designer}


# -- import hygiene ---------------------------------------------------------------------------

def test_module_imports_without_slime_ray_sglang_or_torch():
    code = ("import sys; import spadekit.integrations.slime as m; "
            "bad = [k for k in sys.modules if k.split('.')[0] in "
            "('slime', 'ray', 'sglang', 'torch', 'transformers', 'train')]; "
            "print(bad); assert not bad, bad; assert callable(m.generate_rollout)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr


# -- conversion ---------------------------------------------------------------------------------

def _spans(mask):
    spans, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_agent_sample_fields_align_with_holes(agent_samples):
    samples, trajs = agent_samples
    with_holes = 0
    for i, s in enumerate(samples):
        d = sl.to_slime_sample(s, index=i, step=5)
        start = s.loss_mask.index(1)
        tr = next(t for t in trajs if t.token_ids is s.token_ids)
        assert start >= tr.prompt_len  # the response starts at the first sampled token
        assert d["tokens"] == s.token_ids
        assert d["response_length"] == len(s.token_ids) - start
        assert len(d["loss_mask"]) == len(d["rollout_log_probs"]) == d["response_length"]
        assert d["loss_mask"][0] == 1 and sum(d["loss_mask"]) == s.num_loss_tokens
        for j, m in enumerate(d["loss_mask"]):  # response token j is tokens[start + j]
            assert m == s.loss_mask[start + j]
            assert d["rollout_log_probs"][j] == s.behaviour_logprobs[start + j]
            if m:
                assert s.behaviour_logprobs[start + j] < 0 or s.behaviour_logprobs[start + j] == 0
        if len(_spans(d["loss_mask"])) > 1:
            with_holes += 1
            gap = _spans(d["loss_mask"])[1][0] - 1  # an observation token inside the response
            assert d["loss_mask"][gap] == 0
        assert d["reward"] == pytest.approx(s.advantage)
        assert d["index"] == d["group_id"] == d["group_index"] == i
        assert d["status"] == ("truncated" if s.truncated else "completed")
        meta = d["train_metadata"]
        assert meta == {"role": "agent", "spade_group": s.group_id, "weight": 1.0,
                        "advantage": s.advantage, "reward_scale": 1.0, "generated_at_step": 0,
                        "prompt_length": start, "inert": False, "delayed_by": 5}
        json.dumps(d)  # plain data: travels through Ray as is
    assert with_holes >= 1, "expected at least one multi-turn sample with observation holes"


def test_round_trip_is_exact(agent_samples, produced):
    designer = [s for s in produced["rounds"][1][0] if s.role == "designer"]
    for i, s in enumerate(agent_samples[0] + designer):
        back = sl.from_slime_sample(sl.to_slime_sample(s, index=i))
        start = s.loss_mask.index(1)
        expected = dataclasses.replace(
            s, behaviour_logprobs=[0.0] * start + list(s.behaviour_logprobs[start:]))
        assert back == expected


def test_truncated_status_and_missing_logprobs(tiny, spool):
    engine = RolloutEngine(tiny, spool, RolloutConfig(max_turns=1, max_new_tokens=8, seed=1))
    tr = engine.run([EpisodeSpec(lib("games_code_breaker"), seed=0)])[0]
    assert tr.failure is None and tr.truncated and not tr.terminated
    s = Sample(role="agent", group_id="g", token_ids=tr.token_ids, loss_mask=tr.loss_mask,
               behaviour_logprobs=tr.logprobs, advantage=0.5, truncated=True)
    d = sl.to_slime_sample(s, 0)
    assert d["status"] == sl.STATUS_TRUNCATED
    assert sl.from_slime_sample(d).truncated
    bare = dataclasses.replace(s, behaviour_logprobs=None)
    with pytest.raises(ValueError, match="logprobs"):
        sl.to_slime_sample(bare, 0)
    assert sl.to_slime_sample(bare, 0, require_logprobs=False)["rollout_log_probs"] is None
    with pytest.raises(ValueError, match="without loss tokens"):
        sl.to_slime_sample(dataclasses.replace(s, loss_mask=[0] * len(s.loss_mask)), 0)


def test_designer_samples_carry_weight_delay_and_stored_logprobs(produced):
    (s0, m0), (s1, m1) = produced["rounds"]
    assert m0["valid"] == 2 and not [s for s in s0 if s.role == "designer"]
    designer = [s for s in s1 if s.role == "designer"]
    assert len(designer) == 2 and s1[:2] == designer  # designer samples come first
    n_agent = len([s for s in s1 if s.role == "agent"])
    for i, s in enumerate(designer):
        assert s.behaviour_logprobs is not None and s.generated_at_step == 0
        assert s.weight == pytest.approx(min(n_agent / 2 * 1, 50.0))
        d = sl.to_slime_sample(s, i, step=1)
        assert d["reward"] == pytest.approx(s.advantage * s.weight)
        assert d["train_metadata"]["delayed_by"] == 1
        assert d["train_metadata"]["role"] == "designer"
        assert d["train_metadata"]["weight"] == s.weight
        start = s.loss_mask.index(1)
        assert d["rollout_log_probs"] == s.behaviour_logprobs[start:]


# -- padding ------------------------------------------------------------------------------------

def _fake(n, rng, loss_tokens=None):
    out = []
    for i in range(n):
        length = rng.randint(3, 9)
        mask = [1] + [rng.choice([0, 1]) for _ in range(length - 1)]
        if loss_tokens == 0:
            mask = [0] * length
        out.append({"index": i, "group_index": i, "group_id": i, "tokens": list(range(length + 4)),
                    "response_length": length, "loss_mask": mask,
                    "rollout_log_probs": [-1.0] * length, "reward": rng.uniform(-2, 2),
                    "status": "completed", "remove_sample": False, "metadata": {},
                    "train_metadata": {"role": "agent", "reward_scale": 1.0}})
    return out


def _losses(batch, ratios):
    """Linear surrogate per response token: -reward * ratio (ratios fixed per original sample;
    inert copies get arbitrary values, which their zero mask must hide)."""
    return [[-b["reward"] * r for r in ratios.get(b["index"], [7.0] * b["response_length"])]
            if not b["train_metadata"].get("inert") else [123.0] * b["response_length"]
            for b in batch]


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("n,gbs", [(5, 8), (8, 8), (11, 4), (1, 6)])
def test_padding_preserves_each_steps_objective(n, gbs, per_token):
    rng = random.Random(n * 100 + gbs)
    real = _fake(n, rng)
    ratios = {s["index"]: [rng.uniform(0.85, 1.2) for _ in range(s["response_length"])]
              for s in real}
    batch, info = sl.pad_to_global_batch(real, gbs, per_token_loss=per_token)
    assert len(batch) % gbs == 0 and info["n_real"] == n
    assert info["n_pad"] == len(batch) - n and info["steps"] == len(batch) // gbs
    assert [b["index"] for b in batch] == list(range(len(batch)))
    assert all(b["group_id"] == b["index"] for b in batch)
    pads = batch[n:]
    assert all(sum(p["loss_mask"]) == 0 and p["reward"] == 0 and p["remove_sample"]
               and p["train_metadata"]["inert"] for p in pads)
    # ratios were keyed by the original index, which equals the position for real samples
    padded = sl.slime_step_losses(batch, _losses(batch, ratios), gbs, per_token_loss=per_token)
    full = n // gbs
    expected = sl.slime_step_losses(real[:full * gbs], _losses(real[:full * gbs], ratios), gbs,
                                    per_token_loss=per_token)
    if n % gbs:  # the partial step, trained alone at its natural size
        tail = [dict(t, index=i) for i, t in enumerate(real[full * gbs:])]
        tail_losses = _losses(tail, {k - full * gbs: v for k, v in ratios.items()
                                     if k >= full * gbs})
        expected += sl.slime_step_losses(tail, tail_losses, len(tail), per_token_loss=per_token)
    assert padded == pytest.approx(expected, rel=1e-12, abs=1e-12)
    # without padding slime would drop the partial step entirely
    assert len(sl.slime_step_losses(real, _losses(real, ratios), gbs,
                                    per_token_loss=per_token)) == full


def test_padding_trim_and_edge_cases():
    rng = random.Random(3)
    real = _fake(10, rng)
    batch, info = sl.pad_to_global_batch(real, 4, overflow="trim")
    assert len(batch) == 4 and info["n_trimmed"] == 6 and info["n_pad"] == 0
    assert [b["reward"] for b in batch] == [r["reward"] for r in real[:4]]
    assert real[0]["index"] == 0 and len(real) == 10  # input untouched
    with pytest.raises(ValueError):
        sl.pad_to_global_batch([], 4)
    zero = _fake(2, rng, loss_tokens=0)  # per-token normaliser counts them as one token each
    batch, info = sl.pad_to_global_batch(zero, 4, per_token_loss=True)
    assert info["reward_scale"] == pytest.approx((2 + 2) / 2)


# -- the weight as advantage scaling --------------------------------------------------------

def _batch_tensors(samples, seed, spread):
    """[B, T] tensors over the samples' full sequences: current and old logprobs near the
    behaviour logprobs; ``spread`` sets how far the ratios move (inside or past the clip)."""
    g = torch.Generator().manual_seed(seed)
    width = max(len(s.token_ids) for s in samples)
    mask = torch.zeros(len(samples), width)
    beh = torch.zeros(len(samples), width, dtype=torch.float64)
    for b, s in enumerate(samples):
        mask[b, :len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
        beh[b, :len(s.token_ids)] = torch.tensor(s.behaviour_logprobs, dtype=torch.float64)
    old = beh + 0.05 * torch.randn(beh.shape, generator=g, dtype=torch.float64)
    cur = (old + spread * torch.randn(beh.shape, generator=g, dtype=torch.float64))
    return cur.requires_grad_(), old, beh, mask.bool()


def _mixed(agent_samples, produced):
    """The real designer samples (their real weight and stored logprobs) with nonzero
    advantages of both signs set by hand (whatever the round's rewards were), then the agent's."""
    designer = [s for s in produced["rounds"][1][0] if s.role == "designer"]
    designer = [dataclasses.replace(s, advantage=a) for s, a in zip(designer, (0.3, -0.2))]
    return designer + agent_samples[0]


@pytest.mark.parametrize("spread", [0.02, 0.6])  # inside the clip range / far past it
def test_weight_folded_into_advantage_equals_spadekit_weighted_loss(agent_samples, produced,
                                                                    spread):
    samples = _mixed(agent_samples, produced)
    cur, old, beh, mask = _batch_tensors(samples, 11, spread)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float64)
    w = torch.tensor([s.weight for s in samples], dtype=torch.float64)
    assert float(w.max()) > 1
    ref, stats = grpo_loss(cur, old, adv, mask, sample_weights=w, behaviour_logprobs=beh)
    (g_ref,) = torch.autograd.grad(ref, cur)
    folded, stats2 = grpo_loss(cur, old, adv * w, mask, behaviour_logprobs=beh)
    (g_fold,) = torch.autograd.grad(folded, cur)
    assert float(folded.detach()) == pytest.approx(float(ref.detach()), rel=1e-12, abs=1e-14)
    assert torch.allclose(g_fold, g_ref, rtol=1e-12, atol=1e-15)
    assert stats["clip_frac"] == stats2["clip_frac"]
    ratio = torch.exp(cur.detach() - old)
    outside = ((ratio < 0.8) | (ratio > 1.28)) & mask
    share = float(outside.sum()) / float(mask.sum())
    assert share > 0.3 if spread > 0.1 else share == 0.0  # past / inside the clip range
    assert stats["clip_frac"] > 0 if spread > 0.1 else stats["clip_frac"] == 0


@pytest.mark.parametrize("per_token,loss_type", [(True, "token"), (False, "sequence")])
def test_padded_slime_objective_equals_spadekit_grpo_loss(agent_samples, produced, per_token,
                                                          loss_type):
    """spadekit samples -> slime dicts -> padded global batch -> slime's reduction of the clipped
    surrogate with TIS equals spadekit's own ``grpo_loss`` (weights, clip-higher, TIS 2.0)."""
    samples = _mixed(agent_samples, produced)
    cur, old, beh, mask = _batch_tensors(samples, 5, 0.3)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float64)
    w = torch.tensor([s.weight for s in samples], dtype=torch.float64)
    ref, _ = grpo_loss(cur, old, adv, mask, sample_weights=w, behaviour_logprobs=beh,
                       loss_type=loss_type)
    gbs = len(samples) + 3
    dicts = [sl.to_slime_sample(s, i) for i, s in enumerate(samples)]
    batch, info = sl.pad_to_global_batch(dicts, gbs, per_token_loss=per_token)
    assert info["steps"] == 1 and info["n_pad"] == 3
    token_losses = []
    for d in batch:
        b = d["index"] if not d["train_metadata"]["inert"] else 0
        start = len(d["tokens"]) - d["response_length"]
        sl_ = slice(start, len(d["tokens"]))
        reward = torch.full((1, d["response_length"]), d["reward"], dtype=torch.float64)
        m = torch.ones(1, d["response_length"], dtype=torch.bool)
        per_tok, _ = clipped_surrogate(cur[b:b + 1, sl_].detach(), old[b:b + 1, sl_], reward, m)
        rollout = torch.tensor([d["rollout_log_probs"]], dtype=torch.float64)
        tis = torch.clamp(torch.exp(old[b:b + 1, sl_] - rollout), 0.0, 2.0)  # --use-tis
        token_losses.append((per_tok * tis)[0].tolist())
    (got,) = sl.slime_step_losses(batch, token_losses, gbs, per_token_loss=per_token)
    assert got == pytest.approx(float(ref.detach()), rel=1e-9)


# -- the round as slime samples, the data source and the glue --------------------------------

def _recording_designer(tokenizer, prompts: list) -> ScriptedPolicy:
    """The scripted designer of GAME_SOURCES that also keeps each designer prompt's text."""
    respond = designer_responder(GAME_SOURCES)

    def recording(ids, text):
        if "You write privileged hints" not in text:
            prompts.append(text)
        return respond(ids, text)

    return ScriptedPolicy(tokenizer, recording)


def test_producer_applies_the_schedule_and_grounds_on_the_corpus(tmp_path, tiny):
    """The producer's round is the loop's: a ``schedule`` entry moves ``envs_per_round`` from
    its round on (the old producer had its own round and ignored it), and the designer is
    grounded on the run's pinned corpus."""
    prompts: list = []
    cfg = producer_config(schedule="[{from_round: 1, set: {envs_per_round: 1}}]")
    with sl.RoundProducer(cfg, tmp_path / "run", policy=tiny,
                          designer_policy=_recording_designer(tiny.tokenizer, prompts)) as p:
        _s0, m0 = p.produce()
        n0 = len(prompts)
        _s1, m1 = p.produce()
    assert (m0["designed"], m1["designed"]) == (2, 1) and len(prompts) == n0 + 1 == 3
    assert m1["schedule/envs_per_round"] == 1 and "schedule/changed" in m1
    assert all("<document>" in text for text in prompts)
    from spadekit.selfplay.corpus_pin import PIN_NAME

    assert (tmp_path / "run" / PIN_NAME).is_file()  # the corpus pin, as a selfplay run has


def test_producer_honours_grounding_false(tmp_path, tiny):
    """``grounding=false`` (the no-grounding ablation): no document in the designer's prompt
    (the old producer always loaded the corpus and grounded on it)."""
    prompts: list = []
    cfg = producer_config(grounding="false")
    with sl.RoundProducer(cfg, tmp_path / "run", policy=tiny,
                          designer_policy=_recording_designer(tiny.tokenizer, prompts)) as p:
        _s0, m0 = p.produce()
    assert m0["designed"] == 2 and len(prompts) == 2
    assert all("<document>" not in text and "No grounding document" in text
               for text in prompts)
    from spadekit.selfplay.corpus_pin import PIN_NAME

    assert not (tmp_path / "run" / PIN_NAME).exists()  # no corpus loaded


def test_produce_round_pads_and_orders(tmp_path, tiny):
    designer = ScriptedPolicy(tiny.tokenizer, designer_responder(GAME_SOURCES))
    with sl.RoundProducer(producer_config(), tmp_path / "run", policy=tiny,
                          designer_policy=designer) as p:
        sl.produce_round(p, global_batch_size=64)
        batch, metrics = sl.produce_round(p, global_batch_size=64, per_token_loss=True)
    roles = [b["train_metadata"]["role"] for b in batch if not b["train_metadata"]["inert"]]
    assert roles[:2] == ["designer", "designer"] and set(roles[2:]) == {"agent"}
    assert len(batch) == 64 and metrics["slime/n_pad"] == 64 - len(roles)
    assert metrics["slime/designer_samples"] == 2 and metrics["step"] == 1
    assert all(b["train_metadata"]["delayed_by"] == (1 if r == "designer" else 0)
               for b, r in zip(batch, roles))
    # the run directory is an ordinary spadekit run: reopening resumes at the next round
    with sl.RoundProducer(producer_config(), tmp_path / "run", policy=tiny,
                          designer_policy=designer) as p:
        assert p.next_step == 2


def test_producer_refuses_a_policy_without_token_ids(tmp_path):
    class TextOnly:
        name = "text-only"
        capabilities = frozenset({"logprobs"})

    from spadekit.common.errors import ConfigError

    with pytest.raises(ConfigError, match="token_ids"):
        sl.RoundProducer(producer_config(), tmp_path / "run", policy=TextOnly())
    assert not (tmp_path / "run").exists()


def test_producer_refuses_asynchronous_rollouts(tmp_path, tiny):
    """slime schedules its own rollouts: a config with ``rollout.max_staleness >= 1`` (which
    needs a generation engine of spadekit's) is refused before anything is written."""
    from spadekit.common.errors import ConfigError

    cfg = producer_config(**{"generation_model": "tiny", "rollout.max_staleness": 1})
    with pytest.raises(ConfigError, match="generation_model is not used under slime"):
        sl.RoundProducer(cfg, tmp_path / "run", policy=tiny)
    assert not (tmp_path / "run").exists()


@pytest.fixture()
def fake_slime(monkeypatch):
    """Stand-ins with only what the glue touches, as read in slime v0.3.0."""
    types_mod = types.ModuleType("slime.utils.types")

    @dataclasses.dataclass
    class FakeSample:
        class Status(enum.Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        group_index: int | None = None
        index: int | None = None
        group_id: int | None = None
        prompt: str = ""
        tokens: list = dataclasses.field(default_factory=list)
        response: str = ""
        response_length: int = 0
        label: str | None = None
        reward: float | None = None
        loss_mask: list | None = None
        rollout_log_probs: list | None = None
        remove_sample: bool = False
        status: Status = Status.PENDING
        metadata: dict = dataclasses.field(default_factory=dict)
        train_metadata: dict | None = None

    types_mod.Sample = FakeSample
    base = types.ModuleType("slime.rollout.base_types")

    @dataclasses.dataclass
    class RolloutFnTrainOutput:
        samples: list
        metrics: dict | None = None

    @dataclasses.dataclass
    class RolloutFnEvalOutput:
        data: dict
        metrics: dict | None = None

    base.RolloutFnTrainOutput, base.RolloutFnEvalOutput = RolloutFnTrainOutput, RolloutFnEvalOutput
    for name in ("slime", "slime.utils", "slime.rollout"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.utils.types", types_mod)
    monkeypatch.setitem(sys.modules, "slime.rollout.base_types", base)
    return FakeSample


def _slime_args(tmp_path, **extra):
    import argparse

    parser = sl.add_spadekit_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--spadekit-run-dir", str(tmp_path / "run"), "--spadekit-preset",
                              "cpu-tiny"])
    base = dict(global_batch_size=32, calculate_per_token_loss=True, advantage_estimator="grpo",
                rewards_normalization=False, grpo_std_normalization=False,
                normalize_advantages=False, kl_coef=0.0, use_tis=True, entropy_coef=0.0,
                kl_loss_coef=0.0, rollout_temperature=1.0, save=str(tmp_path / "ckpt"),
                load=str(tmp_path / "ckpt"))
    for k, v in {**base, **extra}.items():
        setattr(args, k, v)
    return args


def test_glue_returns_slime_samples(tmp_path, tiny, fake_slime):
    args = _slime_args(tmp_path)
    designer = ScriptedPolicy(tiny.tokenizer, designer_responder(GAME_SOURCES))
    producer = sl.RoundProducer(producer_config(), args.spadekit_run_dir, policy=tiny,
                                designer_policy=designer)
    source = sl.SpadekitDataSource(args, producer=producer)
    try:
        out = sl.generate_rollout(args, 0, source, evaluation=False)
        assert isinstance(out.samples, list) and all(len(g) == 1 for g in out.samples)
        flat = [g[0] for g in out.samples]
        assert len(flat) == 32 and all(isinstance(s, fake_slime) for s in flat)
        real = [s for s in flat if not s.train_metadata["inert"]]
        assert all(len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
                   for s in flat)
        assert {s.status for s in flat} <= {fake_slime.Status.COMPLETED,
                                             fake_slime.Status.TRUNCATED}
        back = sl.from_slime_sample(real[0])
        assert back.role == "agent" and back.token_ids == real[0].tokens
        assert out.metrics["spadekit/slime/rollout_id"] == 0
        assert sl.generate_rollout(args, 0, source, evaluation=True).data == {}
        assert source.get_samples(4) == [] and len(source) == 0
        source.save(0)
        pointer = json.loads((tmp_path / "ckpt" / "rollout" / "spadekit_state_0.json")
                             .read_text())
        assert pointer["next_step"] == 1 and pointer["run_dir"] == str(tmp_path / "run")
        with pytest.raises(RuntimeError):
            source.add_samples([[flat[0]]])
    finally:
        producer.close()
    args2 = _slime_args(tmp_path, spadekit_run_dir=None)
    sl.SpadekitDataSource(args2).load(0)
    assert args2.spadekit_run_dir == str(tmp_path / "run")


def test_slime_flag_checks(tmp_path):
    config = producer_config()
    assert sl.check_slime_args(_slime_args(tmp_path), config) == []
    bad = _slime_args(tmp_path, rewards_normalization=True, use_tis=False,
                      calculate_per_token_loss=False, rollout_temperature=0.6)
    problems = " | ".join(sl.check_slime_args(bad, config))
    for text in ("--disable-rewards-normalization", "--use-tis", "--calculate-per-token-loss",
                 "--rollout-temperature"):
        assert text in problems


def test_sglang_router_policy_speaks_generate(tiny):
    tok = tiny.tokenizer
    seen = []
    answer_ids = tok.encode("\\boxed{42}", add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            n = body["sampling_params"]["max_new_tokens"]
            ids = answer_ids[:n]
            out = {"text": tok.decode(ids), "meta_info": {
                "output_token_logprobs": [[-0.5 - i, t, None] for i, t in enumerate(ids)],
                "finish_reason": {"type": "length" if n < len(answer_ids) else "stop"}}}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        policy = sl.SGLangRouterPolicy(f"http://127.0.0.1:{server.server_port}", tok)
        msgs = [{"role": "user", "content": "Guess."}]
        full, cut = policy.generate([
            GenerationRequest(messages=msgs, params=SamplingParams(temperature=0.6, seed=3)),
            GenerationRequest(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=3))])
        policy.close()
    finally:
        server.shutdown()
    assert {path for path, _ in seen} == {"/generate"} and len(seen) == 2
    body = next(b for _, b in seen if b["input_ids"] != [1, 2, 3])
    assert body["return_logprob"] is True
    assert body["input_ids"] == policy.render(msgs) and full.prompt_ids == body["input_ids"]
    sp = body["sampling_params"]
    assert sp["temperature"] == 0.6 and sp["sampling_seed"] == 3 and sp["no_stop_trim"]
    assert tok.convert_tokens_to_ids("<|im_end|>") in sp["stop_token_ids"]
    assert full.token_ids == answer_ids and full.finish_reason == "stop"
    assert full.logprobs == [-0.5 - i for i in range(len(answer_ids))]
    assert full.text == "\\boxed{42}"
    assert cut.token_ids == answer_ids[:3] and cut.finish_reason == "length"
