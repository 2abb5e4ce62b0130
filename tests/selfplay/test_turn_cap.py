"""One turn cap from the config to the designer's prompt, the validator and play (issue 12,
defect 2): a program states its cap in its first observation, and that statement is the same
during validation and during play; a program's own smaller ``max_turns`` is respected.
Real sandboxes, the real tiny model as the agent, a scripted designer."""

from __future__ import annotations

import re

import pytest

from spadekit.selfplay.config import load_config
from spadekit.envs.program import EnvProgram
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from spadekit.sandbox.validate import Validator, ValidatorSettings

from test_selfplay import config

# States its cap, never ends on its own before it: the runner's cap is what ends an episode.
SAYS_CAP = r'''
import random
import re

class SaysCapEnv:
    """Guess the word; the first observation states the turn cap."""

    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = int(max_turns)

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Reply \\boxed{word}. You have %d turns." % self.max_turns, {}

    def step(self, action):
        self.t += 1
        m = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if m and m[-1] == "solve":
            return "Solved.", 1.0, True, False, {}
        score = round(0.5 * sum(c.isalpha() for c in action) / max(len(action), 1), 4)
        return "Scored %.2f." % score, score, False, self.t >= self.max_turns, {}

    def solution(self):
        return ["\\boxed{solve}"]
'''
# Ignores the cap it is given: its own two turns hold, and the runner plays no more than that.
OWN_TWO = SAYS_CAP.replace("SaysCapEnv", "OwnTwoEnv").replace(
    "self.max_turns = int(max_turns)", "self.max_turns = 2")
NO_END = SAYS_CAP.replace("SaysCapEnv", "NoEndEnv").replace(
    "self.t >= self.max_turns, {}", "False, {}")
CAP = re.compile(r"You have (\d+) turns")


def test_one_cap_reaches_the_prompt_the_validator_and_play(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    prompts = []

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: Answer with one short lowercase word that names the goal."
        prompts.append(text)
        program = (SAYS_CAP, OWN_TWO)[(len(prompts) - 1) % 2]
        return f"```python\n{program}\n```"

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, respond)
    # the presets' shape: env_max_turns below rollout.max_turns (12 and 25 there)
    cfg = config(tmp_path, rounds=1, env_max_turns=3, **{"rollout.max_turns": 25})
    assert cfg.turn_cap == 3
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        (m0,) = sp.run()
        assert m0["valid"] == 2
        assert all("max_turns=3" in p for p in prompts) and not any("max_turns=25" in p
                                                                    for p in prompts)
        envs = {sp.store.get_program(e["sha256"]).class_name: e for e in sp.store.environments()}
        assert envs["SaysCapEnv"]["validation"]["details"]["max_turns"] == 3
        for name, cap in (("SaysCapEnv", 3), ("OwnTwoEnv", 2)):
            ids = sp.store.episode_ids(env_sha=envs[name]["sha256"])
            assert len(ids) == 6  # 4 plays + 2 hinted plays
            for eid in ids:
                ep = sp.store.get_episode(eid)
                first = ep["messages"][1]["content"]
                assert CAP.search(first).group(1) == str(cap), (name, first)
                assert 1 <= len(ep["turns"]) <= cap


def test_validation_and_play_see_the_same_first_observation(pool):
    """The validator and the rollout engine construct the program with the same cap, so the
    observation the validator checked is the one the agent reads."""
    program = EnvProgram(code=SAYS_CAP)
    report = Validator(pool, ValidatorSettings(max_turns=5)).validate(program)
    assert report.ok, report.message
    sb = pool.acquire(program.code)
    try:  # what the validator's construction gives
        seen_at_validation = sb.new_env(max_turns=report.details["max_turns"]).reset(seed=1)[0]
    finally:
        pool.release(sb)
    policy = load_policy("tiny")
    engine = RolloutEngine(policy, pool, RolloutConfig(max_turns=25, max_new_tokens=4, seed=0))
    (tr,) = engine.run([EpisodeSpec(program, seed=1, max_turns=5)])
    assert tr.messages[1]["content"] == seen_at_validation == (
        "Reply \\boxed{word}. You have 5 turns.")
    assert tr.max_turns == 5 and len(tr.turns) == 5 and tr.stop_reason == "truncated"


def test_the_spec_cap_the_config_cap_and_a_smaller_own_cap(pool):
    policy = load_policy("tiny")
    engine = RolloutEngine(policy, pool, RolloutConfig(max_turns=4, max_new_tokens=4, seed=0))
    plain, capped, own = engine.run([EpisodeSpec(EnvProgram(code=NO_END), seed=0),
                                     EpisodeSpec(EnvProgram(code=NO_END), seed=0, max_turns=2),
                                     EpisodeSpec(EnvProgram(code=OWN_TWO), seed=0,
                                                 max_turns=9)])
    assert (plain.max_turns, len(plain.turns), plain.stop_reason) == (4, 4, "max_turns")
    assert "You have 4 turns" in plain.messages[1]["content"]
    assert (capped.max_turns, len(capped.turns)) == (2, 2)
    assert "You have 2 turns" in capped.messages[1]["content"]
    assert own.max_turns == 2 and len(own.turns) == 2  # the program's own 2, not the spec's 9
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeSpec(EnvProgram(code=NO_END), seed=0, max_turns=0)


def test_turn_cap_is_the_smaller_of_env_max_turns_and_the_runner_ceiling():
    assert load_config("games-4b").turn_cap == 12
    assert load_config(preset=None, overrides=["env_max_turns=12",
                                               "rollout.max_turns=3"]).turn_cap == 3
    from spadekit.selfplay.budgets import budgets

    assert budgets(load_config(preset=None, overrides=["env_max_turns=7"]))["env_max_turns"] \
        == 7
