"""Asynchronous rollouts across a resume that has to fall back.

A resume whose newest checkpoint is damaged loads an older one: the trainer's weights go back
some updates, so the pipeline's versions and ledger must go back with them (they are kept with
each checkpoint pointer), the batch queued then counts as discarded, and what the lost rounds
queued is dropped. Also: a run the pipeline refuses leaves no run directory behind. Real parts:
the tiny model really training, a real ``hf`` generation copy, real sandboxes, a real database.
"""

from __future__ import annotations

import pytest

from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.runs.store import RunStore
from spadekit.selfplay.pipeline import Pipeline
from spadekit.selfplay.setup import ResumeError
from spadekit.selfplay.staleness import Batch, LedgerError

from test_async_rollouts import _run, _sample
from test_selfplay import WORDS, config, designer_responder

ASYNC = {"generation_model": "tiny", "tensorboard": "false", "rollout.max_staleness": 1}


def _balanced(rows) -> bool:
    return bool(rows) and all(
        r["generated"] == r["trained"] + r["discarded"] + r["in_flight"] for r in rows)


# -- the pipeline's state, unit --------------------------------------------------------------------


def test_load_state_none_keeps_the_defaults_and_damage_is_typed(tmp_path):
    with RunStore(tmp_path / "r", create=True) as store:
        pipe = Pipeline(store, 1)
        pipe.load_state(None)
        assert pipe.state() == Pipeline(store, 1).state()
        for bad in ([1], {"trainer": 1, "generator": 2}, {"trainer": True, "generator": 0},
                    {"trainer": -1, "generator": 0}, {"trainer": 1, "generator": 0, "x": 1}):
            with pytest.raises(LedgerError):
                pipe.load_state(bad)
        with pytest.raises(LedgerError, match="no pipeline state"):
            pipe.fall_back(None, 3)


def test_fall_back_discards_what_was_in_flight_and_drops_the_queue(tmp_path):
    """The checkpoint's state had 6 tokens of version 1 in flight; the queue now holds a batch
    of a lost round. After the fallback: those 6 tokens are discarded, the queue is empty, and
    the ledger balances against it."""
    with RunStore(tmp_path / "r", create=True) as store:
        then = Pipeline(store, 1)
        then.versions.trainer = then.versions.generator = 1
        then.ledger.add("generated", 0, 4)
        then.ledger.add("trained", 0, 4)
        then.ledger.add("generated", 1, 6)  # round 1's batch, queued at the checkpoint
        saved = then.state()
        now = Pipeline(store, 1)
        with store.round(2):
            now.enqueue(Batch(2, 2, [_sample(5)], 2, 2))
        assert store.queued_steps() == [2]
        dropped = now.fall_back(saved, 2)
        assert dropped == [2] and store.queued_steps() == []
        assert now.versions.trainer == 1 and now.versions.generator == 1
        rows = {r["version"]: r for r in now.ledger.check(now.queued())}
        assert rows[1]["discarded"] == 6 and rows[1]["in_flight"] == 0
        assert rows[0]["trained"] == 4
        assert store.get_state("pipeline") == now.state()


# -- the loop --------------------------------------------------------------------------------------


def test_each_checkpoint_pointer_keeps_the_pipeline_state_of_its_round(tmp_path):
    sp, _policy = _run(tmp_path, 3, **{"rollout.max_staleness": 1})
    with sp:
        sp.run()
        pointers = sp.store.checkpoints()
        assert pointers[-1]["meta"]["pipeline"] == sp.store.get_state("pipeline")
        versions = [p["meta"]["pipeline"]["trainer"] for p in pointers]
        assert versions == sorted(versions) and versions[-1] == 2


def test_a_fallback_resume_rolls_the_pipeline_back_with_the_weights(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    sp, _policy = _run(tmp_path, 3, **{"rollout.max_staleness": 1})
    with sp:
        sp.run()
        run = sp.run_dir
        assert [p["step"] for p in sp.store.checkpoints()] == [1, 2]
        at_1 = sp.store.checkpoints()[0]["meta"]["pipeline"]
        assert sp.store.queued_steps() == [2]
    for weights in (run / "checkpoints" / "step-2").rglob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path, rounds=1, **ASYNC), run, policy=policy,
                  designer_policy=designer, resume=True) as again:
        assert again.next_step == 3
        assert again.pipeline.versions.trainer == at_1["trainer"] == 1
        assert again.store.queued_steps() == []  # round 2's batch came from a lost round
        events = again.store.events("pipeline_fallback")
        assert len(events) == 1 and events[0]["data"]["dropped_steps"] == [2]
        assert events[0]["data"]["loaded"] == 1
        (m3,) = again.run()
        assert m3["async/samples_trained"] == 0  # nothing was left to train
        assert m3["async/policy_version"] == 1  # the weights' own version
        rows = again.store.ledger(3)
        assert _balanced(rows)
        # round 1's batch was queued at the checkpoint, trained only by the lost round 2
        book = at_1["ledger"]
        lost = sum(book["generated"].values()) - sum(book["trained"].values())
        assert lost > 0
        assert m3["async/tokens_discarded"] == lost  # nothing of round 3 was cancelled
        assert again.store.queued_steps() == [3]


def test_a_damaged_stored_pipeline_state_is_a_resume_error(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    sp, _policy = _run(tmp_path, 2, **{"rollout.max_staleness": 1})
    with sp:
        sp.run()
        run = sp.run_dir
        sp.store.put_state("pipeline", {"trainer": 0, "generator": 5})
    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with pytest.raises(ResumeError, match="ahead of the trainer"):
        SelfPlay(config(tmp_path, rounds=1, **ASYNC), run, policy=policy,
                 designer_policy=designer, resume=True)


def test_a_refused_async_run_writes_nothing(tmp_path):
    """The designer would sample from the model being trained: ConfigError, and no run
    directory (no database, no config) is left behind."""
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny", seed=0)
    with pytest.raises(ConfigError, match="designer would sample"):
        SelfPlay(config(tmp_path, rounds=1, **ASYNC), tmp_path / "run", policy=policy,
                 designer_policy=policy)
    assert not (tmp_path / "run" / "run.sqlite").exists()
    assert not (tmp_path / "run" / "config.yaml").exists()
