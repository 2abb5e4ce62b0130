"""A run whose generation engine is separate from the trained model: its weights follow the
trainer after every update (``--set generation_model=...``), in this process (an ``hf`` copy,
standing in for colocated vLLM on a GPU; over HTTP to a real ``vllm serve``:
``test_vllm_server.py``), and engines that cannot follow, or give no logprobs, are refused
before the run."""

from __future__ import annotations

import dataclasses

import pytest

from spadekit.common.errors import SpadekitError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

from test_selfplay import WORDS, config, designer_responder


def weights_equal(a, b) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return all(sa[k].equal(sb[k]) for k in sb)


def test_colocated_generation_copy_follows_the_trainer(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    cfg = config(tmp_path, rounds=2, generation_model="tiny", tensorboard="false")
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        gen = sp.gen_policy
        assert gen is not None and gen is not policy and sp.engine.policy is gen
        assert "agent" in sp.trainer.config.importance_sampling_roles
        m0, m1 = sp.run()
        assert m1["weight_sync/tensors"] > 0 and m1["weight_sync/bytes"] > 0
        assert sum(m["train/optimizer_steps"] for m in (m0, m1)) >= 1
        assert weights_equal(gen, policy)  # the engine plays with the trained weights
        assert m1["agent_episodes"] == 8 and m1["agent_failures"] == 0


class NoLogprobs(ScriptedPolicy):
    """A policy that gives token ids but no logprobs (as a server without them does)."""

    capabilities = frozenset({"token_ids"})

    def generate(self, requests):
        return [dataclasses.replace(g, logprobs=None) for g in super().generate(requests)]


def backend(monkeypatch, name, make):
    """``name:...`` loads ``make(tiny tokenizer)`` for this test (the registry's real path)."""
    import spadekit.policy.registry as registry

    monkeypatch.setitem(registry._BACKENDS, name, lambda spec, **kw: make(
        load_policy("tiny").tokenizer))


def test_a_generation_engine_that_cannot_follow_is_refused_before_the_run(tmp_path,
                                                                          monkeypatch):
    from spadekit.selfplay.loop import SelfPlay

    backend(monkeypatch, "fixed", lambda tok: ScriptedPolicy(tok, lambda *_: "1"))
    cfg = config(tmp_path, rounds=1, generation_model="fixed:x")  # no load_weights
    with pytest.raises(SpadekitError, match="cannot take weight updates"):
        SelfPlay(cfg, tmp_path / "run", policy=load_policy("tiny"))


def test_an_engine_without_logprobs_is_refused_for_training_by_name(tmp_path, monkeypatch):
    """Importance weights need the engine's logprobs; an engine that returns none is refused
    at startup (it used to be accepted, and its samples weighted by p_old)."""
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.loop import SelfPlay

    backend(monkeypatch, "nolp", lambda tok: NoLogprobs(tok, lambda *_: "1"))
    spec = "nolp:x"
    with pytest.raises(ConfigError, match="no logprobs") as err:
        SelfPlay(config(tmp_path, rounds=1, generation_model=spec), tmp_path / "run",
                 policy=load_policy("tiny"))
    assert spec in str(err.value)
    assert not (tmp_path / "run").exists()


def test_samples_without_behaviour_logprobs_are_dropped_and_counted_never_zero_filled(pool):
    from spadekit.selfplay.advantages import Sample
    from spadekit.envs import library
    from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    tiny = load_policy("tiny")
    program = library.program(library.get("games_code_breaker"))
    engine = RolloutEngine(NoLogprobs(tiny.tokenizer, lambda *_: "1 2 3 4"), pool,
                           RolloutConfig(max_turns=2, max_new_tokens=6, seed=1))
    trajs = engine.run([EpisodeSpec(program, seed=s) for s in range(2)])
    assert all(tr.num_sampled > 0 and tr.logprobs is None for tr in trajs)
    assert engine.stats["trajectories_without_logprobs"] == 2
    samples = [Sample(role="agent", group_id="e", token_ids=tr.token_ids, loss_mask=tr.loss_mask,
                      behaviour_logprobs=tr.logprobs, advantage=a)
               for tr, a in zip(trajs, (1.0, -1.0))]
    trainer = PolicyTrainer(load_policy("tiny"), TrainConfig(
        importance_sampling_roles=("designer", "agent")))
    stats = trainer.train_step(samples)
    assert stats["dropped_no_logprobs"] == 2 and stats["num_samples_trained"] == 0
    assert stats["optimizer_steps"] == 0
