"""The round table says what the agent learned from: the share of non-zero
advantages per round, why an update was empty, and one closing line of what changed."""

from __future__ import annotations

import pytest

from conftest import TIERS
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.selfplay.round_report import empty_update_reason, summary_line
from spadekit.selfplay.loop import SelfPlay
from test_selfplay import WORDS, config, designer_responder

pytestmark = pytest.mark.skipif(not TIERS, reason="no safe sandbox tier works here")

# only the exact word scores (the tiny model never writes it): every play returns 0
ZERO = WORDS[0].replace("LettersEnv", "ZeroEnv").replace(
    'return "Scored %.2f." % score, score, True, False, {}',
    'return "Nothing scores here.", 0.0, True, False, {}')


def _run(tmp_path, programs, rounds):
    designer = ScriptedPolicy(tiny_tokenizer(), designer_responder(programs))
    cfg = config(tmp_path, rounds=rounds)
    with SelfPlay(cfg, tmp_path / "run", policy=load_policy("tiny"),
                  designer_policy=designer) as sp:
        return sp.run()


def test_an_update_with_nothing_to_learn_says_why(tmp_path):
    from spadekit.cli.train import _round_table

    [m] = _run(tmp_path, [ZERO, ZERO.replace("ZeroEnv", "NilEnv").replace(
        "Nothing scores here.", "Nil.")], rounds=1)
    assert m["agent_mean_return"] == 0 and m["agent_nonzero_advantage_share"] == 0
    assert m["train/optimizer_steps"] == 0 and m["train/num_samples"] > 0
    why = empty_update_reason(m)
    assert why is not None and why.startswith("every advantage zero")
    assert "every agent play returned 0" in why
    assert f"empty update: {why}" in str(_round_table(m).caption)


def test_a_learning_round_shows_its_advantage_share_and_no_reason(tmp_path):
    from spadekit.cli.train import _round_table

    history = _run(tmp_path, WORDS, rounds=2)
    for m in history:
        assert 0 < m["agent_nonzero_advantage_share"] <= 1
        assert m["train/optimizer_steps"] > 0 and empty_update_reason(m) is None
        assert "empty update" not in str(_round_table(m).caption)
    line = summary_line(history)
    first, last = history[0], history[-1]
    assert line.startswith("what changed (rounds 0..1): ")
    assert f"agent return {first['agent_mean_return']:.3f} -> {last['agent_mean_return']:.3f}" \
        in line
    assert f"designer valid share {first['valid_share']:.0%} -> {last['valid_share']:.0%}" in line
    assert line.endswith("empty updates 0 of 2")


def test_reasons_for_samples_that_never_reach_the_trainer():
    assert empty_update_reason({}) == "no samples (no episode played, or every episode failed)"
    dropped = {"train/num_samples": 3, "train/num_samples_trained": 0,
               "train/dropped_no_logprobs": 3, "train/optimizer_steps": 0}
    assert empty_update_reason(dropped) == "every sample dropped by the trainer (no_logprobs 3)"
    assert summary_line([]) == "no round was played"
