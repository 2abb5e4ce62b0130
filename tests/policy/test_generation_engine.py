"""A run whose generation engine is separate from the trained model: its weights follow the
trainer after every update (``--set generation_model=...``), in this process (an ``hf`` copy,
standing in for colocated vLLM on a GPU) and over HTTP (a ``spadekit serve`` model server with
weight updates enabled, the path a vLLM-backed server takes)."""

from __future__ import annotations

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


def test_server_generation_engine_gets_every_update(tmp_path, monkeypatch):
    from spadekit.policy.serve import serve
    from spadekit.selfplay.loop import SelfPlay

    served = load_policy("tiny")
    monkeypatch.setenv("SPADEKIT_WEIGHTS_TOKEN", "s3cret-token")
    with serve(served, allow_weight_updates=True, weights_token="s3cret-token") as srv:
        policy = load_policy("tiny")
        designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
        cfg = config(tmp_path, rounds=1, generation_model=f"openai:tiny@{srv.url}",
                     tensorboard="false")
        with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
            (m0,) = sp.run()
            assert m0["agent_episodes"] == 8 and m0["agent_failures"] == 0
            assert m0["weight_sync/tensors"] > 0
            assert weights_equal(served, policy)  # the server holds the trained weights


def test_a_generation_engine_that_cannot_follow_is_refused_before_the_run(tmp_path):
    from spadekit.policy.serve import serve
    from spadekit.selfplay.loop import SelfPlay

    with serve(load_policy("tiny")) as srv:  # weight updates not enabled
        cfg = config(tmp_path, rounds=1, generation_model=f"openai:tiny@{srv.url}")
        with pytest.raises(SpadekitError, match="weight"):
            SelfPlay(cfg, tmp_path / "run", policy=load_policy("tiny"))


def test_an_engine_without_logprobs_is_refused_for_training_by_name(tmp_path, monkeypatch):
    """Issue 12 defect 7: importance weights need the engine's logprobs; an engine that returns
    none is refused at startup (it used to be accepted, and its samples weighted by p_old)."""
    from spadekit.common.errors import ConfigError
    from spadekit.policy.serve import serve
    from spadekit.selfplay.loop import SelfPlay

    monkeypatch.setenv("SPADEKIT_WEIGHTS_TOKEN", "s3cret-token")
    with serve(load_policy("tiny"), logprobs=False, allow_weight_updates=True,
               weights_token="s3cret-token") as srv:
        spec = f"openai:tiny@{srv.url}"
        with pytest.raises(ConfigError, match="no logprobs") as err:
            SelfPlay(config(tmp_path, rounds=1, generation_model=spec), tmp_path / "run",
                     policy=load_policy("tiny"))
        assert spec in str(err.value)
    assert not (tmp_path / "run").exists()


def test_samples_without_behaviour_logprobs_are_dropped_and_counted_never_zero_filled(pool):
    from spadekit.selfplay.advantages import Sample
    from spadekit.envs import library
    from spadekit.policy.serve import serve
    from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
    from spadekit.train.config import TrainConfig
    from spadekit.train.trainer import PolicyTrainer

    tiny = load_policy("tiny")
    program = library.program(library.get("games_code_breaker"))
    with serve(tiny, logprobs=False) as srv:
        engine_policy = load_policy(f"openai:tiny@{srv.url}", tokenizer=tiny.tokenizer)
        engine = RolloutEngine(engine_policy, pool, RolloutConfig(max_turns=2, max_new_tokens=6,
                                                                  seed=1))
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
