"""The default preset trains the designer (issue 22).

``cpu-tiny`` writes 2 programs per round over 3 active skills, so each skill holds at most one
designer sample; centring within the skill alone gave every one of them advantage 0, and the
trainer skipped them (``train/skipped_zero_advantage``). ``designer_advantages`` centres a
skill's single sample on the round's mean over all designer samples instead.

A real run of the preset's shape (rounds, programs, skills, interval, bootstrap, plays) with
the tiny model as the agent that trains, the real sandbox and the real run database; only the
designer is scripted. It writes two honest games with a working ``solution()``: in one a
wrong reply earns half credit on three seeds of four (a mean return near 0.375, in the
plateau's ramp), in the other a wrong reply earns nothing (mean return 0, designer reward 0),
so their designer rewards differ whatever the tiny model says (unless all 4 of the first
game's plays drew a seed divisible by 4: 1 in 256; with credit on even seeds only, 1 in 16,
the suite once met it). Round 1 trains round 0's designer samples: they must reach the update with non-zero
advantages (the ``designer_samples`` event) and be importance-weighted in it (the trainer's
``train/num_importance_weighted``: only rows with a non-zero advantage are computed).
"""

from __future__ import annotations

import pytest

from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.selfplay.config import load_config

SECRET = r'''
import re


class NAMEEnv:
    """Name the secret animal inside \\boxed{}: the exact word wins; on three seeds of four (a
    "warm" round) a wrong one still earns CREDIT."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.word = ("otter", "heron", "lemur")[(seed or 0) % 3]
        self.credit = CREDIT if (seed or 0) % 4 != 0 else 0.0
        return ("Guess the secret animal (otter, heron or lemur) and answer inside "
                "\\boxed{}.", {})

    def step(self, action):
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if found and found[-1].strip().lower() == self.word:
            return "Right.", 1.0, True, False, {}
        return "Wrong: it was " + self.word + ".", self.credit, True, False, {}

    def solution(self):
        return ["\\boxed{%s}" % self.word]
'''
GAMES = [SECRET.replace("NAME", "HalfCredit").replace("CREDIT", "0.5"),
         SECRET.replace("NAME", "NoCredit").replace("CREDIT", "0.0")]
HINT = "HINT: The secret depends on the seed; try each animal in turn over episodes."


def scripted_designer(tokenizer) -> ScriptedPolicy:
    count = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return HINT
        game = GAMES[count["n"] % len(GAMES)]
        count["n"] += 1
        return f"```python\n{game}\n```"

    return ScriptedPolicy(tokenizer, respond)


def test_cpu_tiny_shape_gives_the_designer_gradient(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    # the preset's shape; only the tiny model and the token budgets its tokenizer needs differ
    cfg = load_config("cpu-tiny", overrides=["stream_key=tests",
        "model=tiny", "designer.max_new_tokens=8192", "rollout.max_context_tokens=8192",
        "tensorboard=false", "checkpoint_every=100"])
    assert (cfg.rounds, cfg.envs_per_round, cfg.skills_per_epoch, cfg.regen_interval) == \
        (2, 2, 3, 1)
    policy = load_policy("tiny", seed=0)
    with SelfPlay(cfg, tmp_path / "run", policy=policy,
                  designer_policy=scripted_designer(policy.tokenizer)) as sp:
        results = sp.run()
        events = [e for e in sp.store.events("designer_samples")]
    assert results[0]["valid"] == 2 and results[0]["pooled"] == 2
    # the first round with designer samples is round 1 (round 0's programs, interval 1)
    first = min(e["step"] for e in events)
    assert first == 1
    [event] = [e for e in events if e["step"] == first]
    records = event["data"]["samples"]
    assert len(records) == 2 and len({r["skill"] for r in records}) == 2  # one per skill
    rewards = [r["reward"] for r in records]
    assert rewards[0] != rewards[1]
    mean = sum(rewards) / 2
    for record in records:  # centred on the round's mean (each skill has one sample)
        assert record["advantage"] == pytest.approx(record["reward"] - mean, abs=1e-12)
        assert record["advantage"] != 0 and record["weight"] > 0
    m1 = results[1]
    assert m1["designer_samples"] == 2
    assert m1["train/num_importance_weighted"] == 2  # both designer rows reached the update
