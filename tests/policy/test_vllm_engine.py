"""The ``vllm`` backend against the real engine (vLLM's CPU build here): logprobs equal to a fresh
trainer forward pass, weight pushes that change the engine and restores that bring it back,
refused pushes that leave it untouched, and a self-play round generating through it.

One engine for the whole module (``vllm:smollm2-135m``, float32, eager, in this process: about
15 s to start); the transformers model is the session's (``bundled_hf``, conftest.py), put back
on its loaded weights after every push (checked after the module). The logprob checks of every
(temperature, top_p) setting share one batch (``diffs``: one decode loop instead of five, and a
batch mixing sampling settings, which self-play's batches do not). Marked ``extra("vllm")``:
skipped, naming the extra and its install command, where vLLM is not installed (CI's second
phase installs it).

Tolerance: 1e-3 absolute on each token's logprob (float32 on both sides; measured ~2e-5).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.extra("vllm")

from spadekit.selfplay.advantages import Sample  # noqa: E402
from spadekit.policy import load_policy  # noqa: E402
from spadekit.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from spadekit.policy.hf import sequence_logprobs  # noqa: E402
from spadekit.train.weight_sync import WeightSync, WeightSyncError  # noqa: E402

TOL = 1e-3
PROMPTS = ["Write one sentence about rain.", "What is 2 + 2?", "Name three colors."]


@pytest.fixture(scope="module")
def hf(bundled_hf):
    """The trainer's side: the bundled model through transformers (float32, CPU; one per
    session, conftest.py)."""
    return bundled_hf


@pytest.fixture(scope="module")
def engine(hf):
    policy = load_policy("vllm:smollm2-135m", seed=0)
    yield policy
    del policy


@pytest.fixture(scope="module")
def sync(engine):
    """The module's pushes into ``engine``, each checked against the readings of the last."""
    return WeightSync(engine)


@pytest.fixture(scope="module")
def original(bundled_original):
    """The weights as loaded; the module must leave ``hf`` on them (checked after it)."""
    return bundled_original


SETTINGS = [(0.0, 1.0), (0.6, 1.0), (1.0, 1.0), (0.6, 0.9), (0.6, 0.5)]
"""(temperature, top_p) pairs the logprob tests check, all in one batch (``diffs``)."""


def requests(engine, temperature: float, top_p: float = 1.0, tokens: int = 16):
    return [GenerationRequest(prompt_ids=engine.render([{"role": "user", "content": p}]),
                              params=SamplingParams(temperature=temperature, top_p=top_p,
                                                    max_new_tokens=tokens, seed=10 + i))
            for i, p in enumerate(PROMPTS)]


def generations(engine, settings) -> dict[tuple[float, float], list]:
    """``requests`` of every ``(temperature, top_p)`` setting, sent to the engine in one
    ``generate`` call (one batch: one decode loop), by setting."""
    reqs = {s: requests(engine, *s) for s in settings}
    gens = engine.generate([r for s in settings for r in reqs[s]])
    assert len(gens) == len(PROMPTS) * len(settings)
    assert all(g.token_ids and len(g.logprobs) == len(g.token_ids) for g in gens)
    out = {}
    for k, setting in enumerate(settings):
        out[setting] = gens[k * len(PROMPTS):(k + 1) * len(PROMPTS)]
        assert [g.prompt_ids for g in out[setting]] == [r.prompt_ids for r in reqs[setting]]
    return out


def diffs_of(gens, model) -> dict[tuple[float, float], float]:
    """The largest |engine - trainer| logprob per setting of ``generations``."""
    return {(temperature, top_p): max(max(abs(a - b) for a, b in zip(
        sequence_logprobs(model, g.prompt_ids, g.token_ids, temperature), g.logprobs))
        for g in part) for (temperature, top_p), part in gens.items()}


def max_diffs(engine, model, settings) -> dict[tuple[float, float], float]:
    """The largest |engine - trainer| logprob per ``(temperature, top_p)``, from one batch."""
    return diffs_of(generations(engine, settings), model)


def max_diff(engine, model, temperature: float, top_p: float = 1.0) -> float:
    return max_diffs(engine, model, [(temperature, top_p)])[(temperature, top_p)]


@pytest.fixture(scope="module")
def diffs(engine, hf):
    """``max_diffs`` of the engine as loaded, for every setting in ``SETTINGS``."""
    return max_diffs(engine, hf.model, SETTINGS)


def fingerprint(engine) -> list[float]:
    """The engine's greedy logprobs on a fixed prompt: changes when its weights change."""
    (g,) = engine.generate(requests(engine, 0.0, tokens=8)[:1])
    return g.logprobs


def fingerprint_of(gens) -> list[float]:
    """``fingerprint`` read from ``generations`` that include the greedy setting (its first
    request is the fingerprint's, 16 tokens instead of 8: greedy, so the same first 8)."""
    return gens[(0.0, 1.0)][0].logprobs[:8]


def one_update(hf, learning_rate: float = 3e-4):
    """A trainer that took one real optimizer step on the bundled model."""
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    g = torch.Generator().manual_seed(0)
    samples = [Sample(role="agent", group_id=f"e{i % 2}",
                      token_ids=torch.randint(10, 5000, (24,), generator=g).tolist(),
                      loss_mask=[0] * 8 + [1] * 16, behaviour_logprobs=None,
                      advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    trainer = PolicyTrainer(hf, TrainConfig(learning_rate=learning_rate))
    assert trainer.train_step(samples)["optimizer_steps"] == 1
    return trainer


def test_the_bundled_model_is_named_through_vllm(engine, hf):
    assert engine.name == "vllm:smollm2-135m"
    assert engine.capabilities == frozenset({"token_ids", "logprobs"})
    assert engine.logprobs_mode == "processed_logits+normaliser"
    assert engine.tokenizer.get_vocab() == hf.tokenizer.get_vocab()
    assert engine.weights.route.startswith("in-process")


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_logprobs_equal_a_fresh_trainer_forward_pass(engine, diffs, temperature):
    assert engine.logprobs_exact(SamplingParams(temperature=temperature))
    assert diffs[(temperature, 1.0)] <= TOL


@pytest.mark.parametrize("top_p", [0.9, 0.5])
def test_top_p_logprobs_are_the_trainers_too(engine, diffs, top_p):
    """vLLM's own processed logprobs would be the nucleus's (0.1 off at 0.9): the backend
    subtracts the full normaliser recorded before the top-p mask instead."""
    assert engine.logprobs_mode == "processed_logits+normaliser"
    assert engine.logprobs_exact(SamplingParams(temperature=0.6, top_p=top_p))
    assert diffs[(0.6, top_p)] <= TOL


def test_a_push_changes_the_engine_and_a_restore_brings_it_back(engine, sync, hf, original):
    before = fingerprint(engine)
    trainer = one_update(hf)
    try:
        stats = sync.push(trainer, version=7)  # verified against the trainer
        # (trainer_weights: the tied lm_head comes once, as the embeddings)
        assert stats["probe_max_abs_diff"] <= TOL and stats["tensors"] == len(original) - 1
        assert engine.weights_version == 7
        gens = generations(engine, [(0.0, 1.0), (0.6, 1.0)])  # greedy and sampled, one batch
        after = fingerprint_of(gens)
        assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3  # really changed
        assert max(diffs_of(gens, hf.model).values()) <= TOL  # the trainer's, after the update
    finally:
        hf.model.load_state_dict(original)
    sync.push(original, verify=hf.model)
    assert fingerprint(engine) == pytest.approx(before, abs=1e-5)


def test_refused_pushes_change_nothing(engine, sync, hf, original):
    before = fingerprint(engine)
    norm = ("model.norm.weight", torch.ones(576))
    with pytest.raises(WeightSyncError, match="shape mismatches"):
        engine.load_weights([norm, ("model.layers.0.mlp.down_proj.weight", torch.zeros(3, 3))])
    with pytest.raises(WeightSyncError, match="unknown names"):
        engine.load_weights([norm, ("model.layers.99.mlp.up_proj.weight", torch.zeros(3))])
    with pytest.raises(WeightSyncError, match="fused projections"):
        engine.load_weights([("model.layers.0.self_attn.q_proj.weight",
                              original["model.layers.0.self_attn.q_proj.weight"])])
    assert fingerprint(engine) == before  # nothing reached the engine
    version = engine.weights_version
    # a push the engine takes but that is not the trainer's: the check after it fails, and
    # the engine is put back on the weights it had
    wrong = {k: v * 1.02 if v.ndim == 2 else v for k, v in original.items()}
    with pytest.raises(WeightSyncError, match="does not serve the trainer's weights.*restored"):
        sync.push(wrong, verify=hf.model)
    assert fingerprint(engine) == pytest.approx(before, abs=1e-5)
    assert engine.weights_version == version  # the undone push is not counted


def test_a_paper_sized_step_is_told_from_a_dropped_push(engine, sync, hf, original,
                                                       monkeypatch):
    """One step at lr 1e-6 moves the probe by about the old fixed tolerance (2e-3 in float32;
    the old probe's text moved 1.9e-3 and passed): a push that never reached vLLM is caught,
    a real one passes, because the check compares with the old weights too."""
    sync.push(original, verify=hf.model)  # the reading the next check compares with
    try:
        trainer = one_update(hf, learning_rate=1e-6)
        with monkeypatch.context() as m:
            m.setattr(engine, "load_weights", lambda weights, **kw: len(list(weights)))
            with pytest.raises(WeightSyncError, match="does not serve the trainer's weights"):
                sync.push(trainer)
        stats = sync.push(trainer)  # the same step, really pushed
        assert stats["probe_verdict"] == "pass", stats
        assert stats["probe_change"] < 2e-2 and stats["probe_max_abs_diff"] <= TOL
    finally:
        hf.model.load_state_dict(original)
    sync.push(original, verify=hf.model)


def test_a_selfplay_round_generates_through_vllm(engine, sync, hf, original, tmp_path,
                                                monkeypatch):
    """``generation_model=vllm:smollm2-135m``: the agent plays on vLLM, the trainer updates the
    transformers model, and the push after the update is verified (the module's engine is
    reused: one engine per module)."""
    import spadekit.policy.registry as registry
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    real = registry.load_policy
    monkeypatch.setattr(registry, "load_policy", lambda spec, **kw: engine
                        if spec == "vllm:smollm2-135m" else real(spec, **kw))
    designer = ScriptedPolicy(hf.tokenizer, designer_responder(WORDS))
    # one environment of 4 plays: the round's size is not the point, the engine and the push
    cfg = config(tmp_path, rounds=1, model="smollm2-135m", envs_per_round=1,
                 generation_model="vllm:smollm2-135m", tensorboard="false",
                 **{"train.learning_rate": 1e-4, "rollout.max_context_tokens": 2048})
    try:
        with SelfPlay(cfg, tmp_path / "run", policy=hf, designer_policy=designer) as sp:
            assert sp.gen_policy is engine and sp.engine.policy is engine
            (m0,) = sp.run()
        assert m0["agent_episodes"] == 4 and m0["agent_failures"] == 0
        assert m0["weight_sync/tensors"] == len(original) - 1  # the tied head once
        assert m0["weight_sync/probe_max_abs_diff"] <= TOL
        assert max_diff(engine, hf.model, 0.6) <= TOL  # the engine follows the trainer
    finally:
        hf.model.load_state_dict(original)
        sync.push(original, verify=hf.model)


def test_an_async_selfplay_run_trains_vllm_generations_with_no_mismatch(
        engine, sync, hf, original, tmp_path, monkeypatch):
    """``rollout.max_staleness=1`` on vLLM (issue 24): round 1 trains round 0's vLLM-generated
    batch beside its own generation; that batch was generated before any update, so its
    behaviour logprobs are the trainer's: the mismatch KL is at the logprob noise, the
    importance weights are 1, and the ledger balances with round 1's batch in flight."""
    import spadekit.policy.registry as registry
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    real = registry.load_policy
    monkeypatch.setattr(registry, "load_policy", lambda spec, **kw: engine
                        if spec == "vllm:smollm2-135m" else real(spec, **kw))
    designer = ScriptedPolicy(hf.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=2, model="smollm2-135m", envs_per_round=1,
                 generation_model="vllm:smollm2-135m", tensorboard="false",
                 **{"train.learning_rate": 1e-4, "rollout.max_context_tokens": 2048,
                    "rollout.max_staleness": 1})
    try:
        with SelfPlay(cfg, tmp_path / "run", policy=hf, designer_policy=designer) as sp:
            m0, m1 = sp.run()
            ledger = sp.store.ledger(1)
        assert m0["async/samples_trained"] == 0 and m1["async/samples_trained"] == 4
        assert m1["async/staleness_max"] == 0 and m1["train/optimizer_steps"] == 1
        assert m1["train/num_importance_weighted"] == 4
        assert m1["train/mismatch_kl"] < 1e-6 and abs(m1["train/tis_mean"] - 1) < 1e-3
        assert m1["weight_sync/probe_max_abs_diff"] <= TOL
        assert all(r["generated"] == r["trained"] + r["discarded"] + r["in_flight"]
                   for r in ledger) and sum(r["in_flight"] for r in ledger) > 0
    finally:
        hf.model.load_state_dict(original)
        sync.push(original, verify=hf.model)


def test_a_batch_of_seeded_prompts_longer_than_one_step_generates(engine):
    """More seeded prompt tokens than one engine step takes (4,096 on CPU): with vLLM's chunked
    prefill a request cut part-way had its seeded CPU generator rewound, which a CPU generator
    cannot do, and the whole batch failed ("CPU Generator does not use offset"); the backend's
    CPU defaults turn chunking off, so every request generates, and the seeds still decide."""
    prompt = engine.render([{"role": "user", "content": "Count the words: " + "word " * 200}])
    batch = [GenerationRequest(prompt_ids=prompt + engine.tokenizer.encode(f" {i}"),
                               params=SamplingParams(temperature=1.0, max_new_tokens=4,
                                                     seed=100 + i)) for i in range(40)]
    assert sum(len(r.prompt_ids) for r in batch) > 2 * 4096
    first = engine.generate(batch)
    assert all(g.token_ids for g in first)
    again = engine.generate(batch[:3])  # the same seeds alone: the same tokens
    assert [g.token_ids for g in again] == [g.token_ids for g in first[:3]]


def test_another_thread_generates_what_the_calling_thread_does(engine):
    """The session set torch's thread count before the engine was built (``bundled_hf``:
    ``configure_cpu_threads``); vLLM's CPU attention then failed in any thread but the one that
    built it ("Check failed: input->metadata->thread_num == thread_num"). The engine is built
    and stepped on its own thread (``vllm_thread``), so every caller gets the same seeded
    tokens."""
    import threading

    reqs = requests(engine, 0.7, tokens=6)
    here = engine.generate(reqs)
    box: dict = {}

    def other():
        try:
            box["gens"] = engine.generate(reqs)
        except Exception as exc:  # reported below
            box["exc"] = exc

    t = threading.Thread(target=other)
    t.start()
    t.join(120)
    assert "exc" not in box, box.get("exc")
    assert [g.token_ids for g in box["gens"]] == [g.token_ids for g in here]


def _engine_idle(engine) -> bool:
    """No request of anyone left in the engine (asked on its own thread, after its work)."""
    return not engine._thread.call(engine.llm.llm_engine.has_unfinished_requests)


def test_an_interrupted_caller_stops_the_engine_before_the_interrupt_goes_on(engine):
    """Ctrl-C while ``generate`` waits on the engine thread: the batch is aborted at the next
    step and the caller returns only then (nothing is left in the engine, a weight push could
    not race it), long before the batch would have ended; the next generation is unaffected."""
    import dataclasses
    import signal
    import threading
    import time

    short = requests(engine, 0.0, tokens=8)
    before = engine.generate(short)
    long = [dataclasses.replace(r, params=SamplingParams(temperature=1.0, max_new_tokens=3000,
                                                         seed=5)) for r in short]
    # to the main thread itself: a process-wide signal may go to any thread of the session's
    # many, and then the main thread's wait is not interrupted
    timer = threading.Timer(2.0, signal.pthread_kill, (threading.main_thread().ident,
                                                         signal.SIGINT))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    # Python's own Ctrl-C handler, whatever an earlier test of the session left installed
    # (in the full suite one did: the SIGINT then raised nothing)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    timer.start()
    raised = False
    try:
        engine.generate(long)
    except KeyboardInterrupt:
        raised = True
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    elapsed = time.monotonic() - t0
    assert raised, (f"generate returned after {elapsed:.1f} s; the SIGINT handler before "
                    f"this test: {previous!r}; blocked here: {blocked}")
    assert 2.0 <= elapsed < 20, elapsed
    assert _engine_idle(engine)  # nothing left working after the caller got its interrupt
    assert [g.token_ids for g in engine.generate(short)] == [g.token_ids for g in before]



def test_a_kit_grammar_request_is_the_hf_samplers_within_the_grammar(engine, hf):
    """``SamplingParams.grammar`` through vLLM's guidance backend gives what the ``hf``
    sampler gives under the same grammar: greedy, the same kit program token for token, and
    each token's logprob within the grammar (the distribution renormalised over the allowed
    tokens) to the module's tolerance; the reply is inside the kit grammar."""
    pytest.importorskip("llguidance")
    from spadekit.selfplay.kit_grammar import designer_grammar
    from spadekit.selfplay.prompts import build_designer_messages

    doc = ("The harbor lantern burned over the meadow while copper thistle and willow garnet "
           "pebble orchid juniper kelp and basalt lay along the fjord near the delta.")
    messages = build_designer_messages("games", "Spatial_Reasoning", doc, max_turns=3,
                                       style="kit")
    grammar = designer_grammar("kit", "games", "Spatial_Reasoning", doc, 3)
    prompt = engine.render(messages)
    params = SamplingParams(temperature=0.0, max_new_tokens=120, grammar=grammar)
    ours, theirs = (p.generate([GenerationRequest(prompt_ids=prompt, params=params)])[0]
                    for p in (hf, engine))
    assert ours.text.startswith("```python\nfrom spadekit.envs.gamekit.v1 import KitEnv")
    assert theirs.token_ids == ours.token_ids
    assert max(abs(a - b) for a, b in zip(theirs.logprobs, ours.logprobs)) < TOL
