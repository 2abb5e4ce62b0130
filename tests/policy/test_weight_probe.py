"""The check after a weight push at paper settings (``spadekit.policy.weight_probe``, kept by
``spadekit.train.weight_sync.WeightSync``): one optimizer step at lr 1e-6 moves the tiny model's
probe by ~4e-5, under any fixed tolerance, so the check compares the engine with the trainer's
old AND new logprobs. A dropped push is caught, a real one passes, an update below the noise is
called indistinct (and counted), a failed check puts an ``hf`` engine back (a ``vllm serve``:
``test_vllm_server.py``), an engine that could not be put back is refused before anything is
sent, and FSDP-sharded weights are checked (inside the gathered context) or refused up front
instead of skipped. ``judge`` itself is property-tested. CPU, seconds."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.weight_probe import SEPARATION, judge  # noqa: E402
from spadekit.train.weight_sync import WeightSync, WeightSyncError, push_weights  # noqa: E402
from spadekit.train.config import TrainConfig  # noqa: E402
from spadekit.train.trainer import PolicyTrainer  # noqa: E402

from test_weight_sync import samples  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


def paper_trainer(dtype=torch.float32) -> PolicyTrainer:
    policy = load_policy("tiny")
    policy.model.to(dtype)
    return PolicyTrainer(policy, TrainConfig(learning_rate=1e-6))  # the paper's rate


def engine(dtype=torch.float32):
    gen = load_policy("tiny")
    gen.model.to(dtype)
    return gen


def state(policy) -> dict:
    return {k: v.clone() for k, v in policy.model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def drop_pushes(gen) -> list:
    """Make ``gen`` accept pushes and change nothing (a lost push that reports success)."""
    dropped = []

    def load_weights(weights, version=None):
        items = list(weights.items() if isinstance(weights, dict) else weights)
        dropped.append(len(items))
        gen.weights_version = gen.weights_version + 1 if version is None else version
        return len(items)

    gen.load_weights = load_weights
    return dropped


def test_a_dropped_push_at_a_paper_learning_rate_is_caught():
    trainer, gen = paper_trainer(), engine()
    sync = WeightSync(gen)
    sync.push(trainer)  # the first reading: what the next check compares with
    trainer.train_step(samples())
    dropped = drop_pushes(gen)
    with pytest.raises(WeightSyncError, match="not closer to the new weights") as err:
        sync.push(trainer)
    assert dropped and "restored" in err.value.message
    assert err.value.details["probe_max_abs_diff"] < 2e-3  # what the old tolerance let pass


def test_a_real_push_at_a_paper_learning_rate_passes():
    trainer, gen = paper_trainer(), engine()
    sync = WeightSync(gen)
    sync.push(trainer)
    for _ in range(2):  # push after push
        trainer.train_step(samples())
        stats = sync.push(trainer)
        assert stats["probe_verdict"] == "pass" and stats["probe_indistinct"] == 0
        assert stats["probe_change"] >= SEPARATION * stats["probe_noise"]
        assert stats["probe_change"] < 1e-3  # a paper-sized step: far under the tolerance
        assert stats["probe_dist_old"] - stats["probe_max_abs_diff"] >= stats["probe_change"] / 2
    assert same(state(gen), state(trainer.policy))


def test_bfloat16_smollm2_at_a_paper_learning_rate_tells_a_dropped_push_from_a_real_one():
    """In bfloat16 one step at lr 1e-6 moves the bundled model's probe by ~0.1, under the old
    half-precision tolerance (0.15): the dropped push is caught because the engine's reading did
    not move at all, the real one passes."""
    from test_vllm_engine import one_update

    trained = load_policy("smollm2-135m", dtype="bfloat16")
    gen = load_policy("smollm2-135m", dtype="bfloat16")
    sync = WeightSync(gen)
    sync.push(trained.model)
    trainer = one_update(trained, learning_rate=1e-6)
    real = gen.load_weights
    drop_pushes(gen)
    with pytest.raises(WeightSyncError, match="bit for bit.*did not arrive"):
        sync.push(trainer)
    gen.load_weights = real
    stats = sync.push(trainer)
    assert stats["probe_verdict"] == "pass" and 1e-2 < stats["probe_change"] < 0.15, stats


def test_an_update_below_the_noise_is_indistinct_and_counted():
    trainer, gen = paper_trainer(), engine()
    sync = WeightSync(gen)
    first = sync.push(trainer)
    again = sync.push(trainer)  # the same weights: nothing could show
    assert (first["probe_verdict"], again["probe_verdict"]) == ("indistinct", "indistinct")
    assert "look alike" in again["probe_reason"] and again["probe_change"] == 0
    assert (first["probe_indistinct_total"], again["probe_indistinct_total"]) == (1, 2)
    trainer.train_step(samples())
    assert sync.push(trainer)["probe_indistinct_total"] == 2  # a pass is not counted


def test_an_unchecked_push_leaves_no_old_reading():
    trainer, gen = paper_trainer(), engine()
    sync = WeightSync(gen)
    sync.push(trainer)
    trainer.train_step(samples())
    sync.push(trainer, verify=False)  # the engine moved unchecked
    trainer.train_step(samples())
    assert sync.push(trainer)["probe_reason"].startswith("no earlier reading")


def test_an_hf_engine_is_put_back_after_a_failed_check():
    trainer, gen = paper_trainer(), engine()
    sync = WeightSync(gen)
    sync.push(trainer)
    before, version = state(gen), gen.weights_version
    wrong = {k: v * 1.02 if v.ndim == 2 else v for k, v in state(trainer.policy).items()}
    with pytest.raises(WeightSyncError, match="previous weights were restored"):
        sync.push(wrong, verify=trainer)
    assert same(state(gen), before) and gen.weights_version == version
    trainer.train_step(samples())
    assert sync.push(trainer)["probe_verdict"] == "pass"  # the old reading still holds


class NoUndo:
    """An engine that takes pushes and returns logprobs but cannot be put back."""

    capabilities = frozenset({"token_ids", "logprobs"})

    def __init__(self):
        self.inner = load_policy("tiny")
        self.tokenizer, self.name, self.calls = self.inner.tokenizer, "no-undo", 0

    def generate(self, requests):
        return self.inner.generate(requests)

    def load_weights(self, weights):
        self.calls += 1
        return len(list(weights))


def test_an_engine_that_cannot_be_put_back_is_refused_before_the_push():
    trainer, gen = paper_trainer(), NoUndo()
    with pytest.raises(WeightSyncError, match="could not be undone.*nothing was pushed"):
        push_weights(gen, trainer)
    assert gen.calls == 0
    push_weights(gen, trainer, verify=False)  # unchecked, on request
    assert gen.calls == 1


class StaleEngine:
    """Serves frozen weights with 1e-5 of numeric noise; acknowledges pushes, applies none."""

    name, capabilities = "stale", frozenset({"logprobs", "token_ids"})

    def __init__(self, model, tokenizer):
        import random

        self.model, self.tokenizer, self.weights_version = model, tokenizer, 0
        self.rng = random.Random(0)

    def generate(self, reqs):
        from spadekit.policy.base import Generation

        out = []
        for r in reqs:
            with torch.inference_mode():
                lp = torch.log_softmax(self.model(input_ids=torch.tensor(
                    [r.prompt_ids])).logits[0, -1].float(), -1)
            t = int(lp.argmax())
            out.append(Generation(prompt_ids=list(r.prompt_ids), token_ids=[t],
                                  logprobs=[float(lp[t]) + self.rng.uniform(-1e-5, 1e-5)],
                                  text="", finish_reason="length"))
        return out

    def load_weights(self, weights):
        self.weights_version += 1
        return 0

    def restore_weights(self):
        pass


def test_a_run_of_small_dropped_pushes_is_caught():
    """A stale engine's distance from the trainer grows with every dropped push; read as
    noise, it would call every later dropped push indistinct. Pushes each too small to see
    are judged together against the last verified reading, and fail once they add up."""
    import copy

    from spadekit.policy.tiny import tiny_model, tiny_tokenizer

    trainer = tiny_model(0)
    g = torch.Generator().manual_seed(1)
    direction = {n: torch.randn(p.shape, generator=g) for n, p in trainer.named_parameters()}

    def step(scale):
        with torch.no_grad():
            for n, p in trainer.named_parameters():
                p.add_(direction[n] * scale)

    eng = StaleEngine(copy.deepcopy(trainer), tiny_tokenizer())
    sync = WeightSync(eng)
    sync.push([], verify=trainer)  # the first push lands
    step(1e-4)
    eng.model = copy.deepcopy(trainer)  # so does the second
    assert sync.push([], verify=trainer)["probe_verdict"] == "pass"
    with pytest.raises(WeightSyncError, match="did not arrive"):
        for _ in range(12):  # twelve pushes, acknowledged, never applied
            step(5e-6)
            sync.push([], verify=trainer)


FSDP = r"""
import os, sys, types, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.fsdp import fully_shard
from spadekit.policy import load_policy
from spadekit.train.weight_sync import WeightSyncError, push_weights
trained, gen = load_policy("tiny"), load_policy("tiny")
weights = {k: v.clone() for k, v in trained.model.state_dict().items()}
model = trained.model
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
trainer = types.SimpleNamespace(policy=trained, dist=types.SimpleNamespace(enabled=True,
                                                                          strategy="fsdp"))
calls = []
real = gen.load_weights
gen.load_weights = lambda w, version=None: calls.append(1) or real(w, version=version)
try:
    push_weights(gen, weights, verify=trainer)
    print("PUSHED-SHARDED")
except WeightSyncError as exc:
    print("REFUSED", len(calls), "gathered_for_generation" in exc.message)
units = [m for m in model.modules() if hasattr(m, "unshard")]
for m in units:
    m.unshard()  # what trainer.gathered_for_generation() does
stats = push_weights(gen, weights, verify=trainer)
print("CHECKED", stats.get("probe_verdict"), len(calls))
dist.destroy_process_group()
"""


def test_fsdp_weights_are_checked_when_gathered_and_refused_when_sharded():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", FSDP, str(port)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": SRC})
    lines = [ln for ln in out.stdout.splitlines() if ln.split()[:1] and ln.split()[0].isupper()]
    assert lines == ["REFUSED 0 True", "CHECKED indistinct 1"], out.stdout + out.stderr[-2000:]


# -- the verdict --------------------------------------------------------------------------------

VOCAB = 6
rows = st.lists(st.floats(-8, 0, allow_nan=False, width=32), min_size=VOCAB, max_size=VOCAB)


def _full(values):
    return torch.tensor(values, dtype=torch.float32).log_softmax(-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.data(),
       st.floats(1e-7, 1e-2), st.floats(0, 1))
def test_an_engine_on_the_new_weights_never_fails(new_rows, data, noise, jitter):
    """An engine reading the new logprobs (within a quarter of the noise it was credited
    with) passes or is indistinct, whatever the old weights were."""
    new = _full(new_rows)
    old = _full(data.draw(st.lists(rows, min_size=len(new_rows), max_size=len(new_rows))))
    tokens = [data.draw(st.integers(0, VOCAB - 1)) for _ in new_rows]
    lps = [float(new[j, t]) + jitter * noise / 4 * (-1) ** j for j, t in enumerate(tokens)]
    out = judge(tokens, lps, new, old, noise=noise, tolerance=1.0, previous=None)
    assert out["verdict"] in ("pass", "indistinct"), out


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.data(), st.floats(1e-7, 1e-2))
def test_an_engine_on_the_old_weights_never_passes(new_rows, data, noise):
    """A stale engine (the old logprobs) fails wherever the update spans the separation, and is
    at most indistinct elsewhere; with its reading unchanged bit for bit it fails as soon as
    the update reaches ``move``."""
    new = _full(new_rows)
    old = _full(data.draw(st.lists(rows, min_size=len(new_rows), max_size=len(new_rows))))
    tokens = [data.draw(st.integers(0, VOCAB - 1)) for _ in new_rows]
    lps = [float(old[j, t]) for j, t in enumerate(tokens)]
    out = judge(tokens, lps, new, old, noise=noise, tolerance=100.0)
    assert out["verdict"] != "pass"
    if out["change"] >= SEPARATION * noise:
        assert out["verdict"] == "fail"
    unmoved = judge(tokens, lps, new, old, noise=1e3, tolerance=100.0,
                    previous=(list(tokens), list(lps)), move=1e-3)
    assert unmoved["verdict"] == ("fail" if out["change"] >= 1e-3 else "indistinct")


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.data(), st.floats(1e-7, 1e-2),
       st.floats(0, 1), st.integers(1, 50))
def test_after_indistinct_checks_an_engine_on_the_new_weights_never_fails(
        new_rows, data, noise, jitter, unverified):
    """Judged against the last verified reading (any), an engine on the new logprobs (within a
    quarter of its noise) passes or is indistinct, however many checks were indistinct."""
    new = _full(new_rows)
    shape = st.lists(rows, min_size=len(new_rows), max_size=len(new_rows))
    old, verified = _full(data.draw(shape)), _full(data.draw(shape))
    tokens = [data.draw(st.integers(0, VOCAB - 1)) for _ in new_rows]
    lps = [float(new[j, t]) + jitter * noise / 4 * (-1) ** j for j, t in enumerate(tokens)]
    out = judge(tokens, lps, new, old, noise=noise, tolerance=1.0, verified=verified,
                unverified=unverified)
    assert out["verdict"] in ("pass", "indistinct"), out


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.data(), st.floats(1e-7, 1e-2),
       st.integers(1, 50))
def test_an_engine_that_dropped_every_push_since_its_verified_reading_never_passes(
        new_rows, data, noise, unverified):
    """An engine still on the last verified weights, while each update since was too small to
    see (here: none since the previous check), fails once the updates together span the
    separation, and is indistinct before."""
    new = _full(new_rows)
    verified = _full(data.draw(st.lists(rows, min_size=len(new_rows), max_size=len(new_rows))))
    tokens = [data.draw(st.integers(0, VOCAB - 1)) for _ in new_rows]
    lps = [float(verified[j, t]) for j, t in enumerate(tokens)]
    out = judge(tokens, lps, new, new, noise=noise, tolerance=100.0, verified=verified,
                unverified=unverified)
    assert out["verdict"] == ("fail" if out["cumulative"] >= SEPARATION * noise
                              else "indistinct"), out


def test_the_verdict_refuses_what_it_cannot_read():
    new = _full([[0.0] * VOCAB])
    assert judge([-1], [math.nan], new, None, noise=None, tolerance=1)["verdict"] == "fail"
    far = judge([0], [float(new[0, 0]) - 0.5], new, new, noise=1e-6, tolerance=0.1)
    assert far["verdict"] == "fail" and "tolerance" in far["reason"]
    assert judge([0], [float(new[0, 0])], new, None, noise=None,
                 tolerance=0.1)["verdict"] == "indistinct"
