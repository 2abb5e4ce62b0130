"""The RLVE baseline: real rlve-gym problems played with scripted replies, and the difficulty ladder
(pure logic, runs without rlve-gym)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import time

import pytest

from spadekit.curriculum.rlve import (ANSWER_MARKERS, INSTALL_HINT, DifficultyLadder,
                                      RLVECurriculum, RLVEEnv, RLVEGenerationError, RLVEProblem,
                                      generate_problem)
from spadekit.common.errors import ConfigError
from spadekit.rollout.engine import Trajectory

needs_rlve = pytest.mark.skipif(importlib.util.find_spec("Gym") is None,
                                reason="rlve-gym is not installed")
THREE = ["Multiplication", "TwoSAT", "Sorting"]


def env_class(name):
    from Gym.environments import identifier2environment
    return identifier2environment[name]


def play(problem: RLVEProblem, reply, **kw):
    env = RLVEEnv(problem, **kw)
    prompt, info = env.reset(seed=0)
    assert prompt == problem.prompt and info["rlve_env"] == problem.env
    obs, reward, terminated, truncated, info = env.step(reply)
    assert obs == "" and terminated is True and truncated is False
    assert isinstance(reward, float) and 0.0 <= reward <= 1.0
    json.dumps(info)  # JSON-safe
    return reward, info


def box(answer) -> str:
    return "Let me think. The answer is \\boxed{" + str(answer) + "}"


def played(specs, rewards):
    """Trajectories as the rollout engine would return them, with the given returns."""
    return [Trajectory(spec=s, episode_return=r, terminated=True, stop_reason="terminated")
            for s, r in zip(specs, rewards)]


# -- the environment ------------------------------------------------------------------------------

@needs_rlve
@pytest.mark.parametrize("name", THREE)
def test_reference_answer_scores_one_and_wrong_scores_zero(name):
    problem = generate_problem(name, 1, 11)
    ref = problem.reference_answer
    assert ref is not None and problem.difficulty == 1 and problem.seed == 11
    reward, info = play(problem, box(ref))
    assert reward == 1.0 and info["correct"] is True
    assert info["verifier"] == {"reward": 1.0, "accuracy": 1, "format_score": 1}
    assert play(problem, f"<answer>{ref}</answer>")[0] == 1.0  # fallback to <answer>
    assert play(problem, box(ref) + " hmm, no: \\boxed{0 0}")[0] == 0.0  # the last box counts
    assert play(problem, "\\boxed{0 0} wait " + box(ref))[0] == 1.0


@needs_rlve
def test_wrong_and_malformed_answers():
    mult = generate_problem("Multiplication", 0, 3)
    reward, info = play(mult, box(int(mult.reference_answer) + 1))
    assert reward == 0.0 and info["verifier"]["format_score"] == 1 and not info["correct"]
    sat = generate_problem("TwoSAT", 0, 3)
    reward, info = play(sat, box("yes"))  # RLVE's format penalty -1 is clipped to 0
    assert reward == 0.0 and info["verifier"]["reward"] == -1.0


@needs_rlve
@pytest.mark.parametrize("reply", [None, 42, b"\\boxed{1}", "", "no box at all", "\\boxed{",
                                   "\\boxed{}", "garbage " * 12_500, box("x" * 100_000),
                                   box("9" * 60_000), "<answer>" + "7" * 100_000 + "</answer>",
                                   box("}{"), "\\boxed{\\boxed{204}}"],
                         ids=["None", "int", "bytes", "empty", "prose", "unclosed", "empty-box",
                              "100kB-prose", "100kB-box", "60kB-digits", "100kB-answer-tag",
                              "inverted-braces", "box-in-box"])
def test_bad_replies_score_zero_without_raising(reply):
    problem = generate_problem("Multiplication", 0, 3)
    reward, info = play(problem, reply)
    assert reward == 0.0 and info["correct"] is False


@needs_rlve
def test_answers_reach_the_verifier_whole(monkeypatch):
    cls = env_class("Multiplication")
    seen = []
    original = cls._process
    monkeypatch.setattr(cls, "_process", lambda self, answer: seen.append(answer)
                        or original(self, answer))
    problem = generate_problem("Multiplication", 0, 3)
    tricky = ["{1, {2}}", "f(x) = {a}", "Assistant: {x}", ANSWER_MARKERS[1] + "{5}"]
    for answer in tricky:
        play(problem, box(answer))
    assert seen == tricky[:3] + ["{5}"]  # our own markers are removed, nothing else
    seen.clear()
    assert play(problem, box("{" + str(problem.reference_answer) + "}"))[0] == 0.0
    assert seen == ["{" + str(problem.reference_answer) + "}"]


@needs_rlve
def test_verifier_failures_become_zero(monkeypatch):
    cls = env_class("Multiplication")
    problem = generate_problem("Multiplication", 0, 3)
    monkeypatch.setattr(cls, "verifier", lambda self, output: 1 / 0)
    reward, info = play(problem, box(problem.reference_answer))
    assert reward == 0.0 and "ZeroDivisionError" in info["error"]
    monkeypatch.setattr(cls, "verifier", lambda self, output: {"reward": float("nan")})
    assert play(problem, box(problem.reference_answer))[0] == 0.0
    monkeypatch.setattr(cls, "verifier", lambda self, output: time.sleep(3))
    t0 = time.perf_counter()
    reward, info = play(problem, box(problem.reference_answer), verify_timeout_s=0.2)
    assert reward == 0.0 and "timed out" in info["error"] and time.perf_counter() - t0 < 2


@needs_rlve
def test_episode_is_single_turn_and_replayable():
    problem = generate_problem("Multiplication", 0, 3)
    env = RLVEEnv(problem)
    env.reset()
    assert env.step(box(problem.reference_answer))[1] == 1.0
    again = env.step(box(problem.reference_answer))
    assert again[1] == 0.0 and again[2] is True and "ended" in again[4]["error"]
    env.reset(seed=99)
    assert env.step(box(problem.reference_answer))[1] == 1.0


@needs_rlve
def test_generation_is_deterministic_and_leaves_global_rngs_alone():
    import numpy as np
    import torch

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    a = generate_problem("TwoSAT", 2, 77)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    b = generate_problem("TwoSAT", 2, 77)
    assert a.prompt == b.prompt and a.reference_answer == b.reference_answer
    assert generate_problem("TwoSAT", 2, 78).prompt != a.prompt


@needs_rlve
@pytest.mark.parametrize("mode", ["false", "raise", "hang"])
def test_generation_failure_is_retried_then_reported(monkeypatch, mode):
    cls = env_class("TwoSAT")
    seeds = []

    def broken(self, seed, parameter=None, timeout_second=10):
        seeds.append(seed)
        if mode == "raise":
            raise RuntimeError("generator exploded")
        if mode == "hang":
            time.sleep(2)
        return False

    monkeypatch.setattr(cls, "generator", broken)
    with pytest.raises(RLVEGenerationError) as err:
        generate_problem("TwoSAT", 0, 5, attempts=3, timeout_s=0.2)
    assert len(seeds) == 3 and seeds[0] == 5 and len(set(seeds)) == 3
    assert len(err.value.details["attempts"]) == 3
    assert {"false": "returned False", "raise": "exploded", "hang": "timed out"}[mode] in \
        err.value.message


@needs_rlve
def test_generation_retries_with_a_derived_seed(monkeypatch):
    cls = env_class("Multiplication")
    original = cls.generator
    monkeypatch.setattr(cls, "generator", lambda self, seed, parameter=None, timeout_second=10:
                        seed != 5 and original(self, seed, parameter, timeout_second))
    problem = generate_problem("Multiplication", 0, 5)
    assert problem.seed != 5 and play(problem, box(problem.reference_answer))[0] == 1.0


@needs_rlve
def test_curriculum_skips_an_environment_that_cannot_generate(monkeypatch):
    monkeypatch.setattr(env_class("TwoSAT"), "generator", lambda self, *a, **k: False)
    cur = RLVECurriculum(THREE + ["AdditionTable"])
    specs = cur.episodes(0, random.Random(0), 3, 2)
    assert len(specs) == 6 and "TwoSAT" not in {s.tag["rlve_env"] for s in specs}
    assert cur.skipped and all(s["env"] == "TwoSAT" for s in cur.skipped)
    assert "returned False" in cur.skipped[0]["reason"]
    specs = cur.episodes(1, random.Random(1), 4, 2)  # replacements keep the budget
    assert len(specs) == 8 and "TwoSAT" not in {s.tag["rlve_env"] for s in specs}
    assert cur.observe(1, played(specs, [1.0] * 4))["rlve/generation_skips"] >= 0


# -- the curriculum ---------------------------------------------------------------------------

@needs_rlve
def test_configuration_errors(monkeypatch):
    assert RLVECurriculum().env_names.__len__() == 400
    with pytest.raises(ConfigError, match="NoSuchEnv"):
        RLVECurriculum(["Multiplication", "NoSuchEnv"])
    with pytest.raises(ConfigError):
        RLVECurriculum(["Multiplication"], threshold=0)
    monkeypatch.setitem(sys.modules, "Gym.environments", None)
    with pytest.raises(ConfigError) as err:
        RLVECurriculum(["Multiplication"])
    assert INSTALL_HINT in str(err.value) and "pip install rlve-gym==0.0.1" in INSTALL_HINT


@needs_rlve
def test_episodes_are_groups_of_playable_problems():
    cur = RLVECurriculum(THREE)
    specs = cur.episodes(0, random.Random(3), 3, 4)
    assert len(specs) == 12
    groups = [specs[i:i + 4] for i in range(0, 12, 4)]
    assert sorted(g[0].tag["rlve_env"] for g in groups) == sorted(THREE)  # no repeats
    for group in groups:
        tag = group[0].tag
        name, diff = tag["rlve_env"], tag["difficulty"]
        assert tag["env"] == f"rlve:{name}:{diff}:{group[0].seed}" and tag["skill"] == name
        assert tag["with_hint"] is False and tag["designed"] is False and diff == 0
        assert all(s.tag == tag and s.program is None and "\\boxed" in s.system for s in group)
        json.dumps(tag)
        for spec in group:
            env = spec.env_factory()
            prompt, _ = env.reset(seed=spec.seed)
            assert prompt == group[0].env_factory().reset()[0]
            assert env.step(box(env.problem.reference_answer))[1] == 1.0


@needs_rlve
def test_rotation_is_fair_and_deterministic():
    names = THREE + ["AdditionTable", "BucketSorting"]
    a, b = RLVECurriculum(names), RLVECurriculum(names)
    seen = []
    for step in range(5):
        sa = a.episodes(step, random.Random(step), 2, 1)
        assert [s.tag for s in sa] == [s.tag for s in b.episodes(step, random.Random(step), 2, 1)]
        seen += [s.tag["rlve_env"] for s in sa]
    assert sorted(seen[:10]) == sorted(names * 2)  # every env once per cycle of 5


@needs_rlve
def test_two_rounds_raise_the_ladder_once_the_window_is_full():
    cur = RLVECurriculum(THREE, window_factor=2)  # window: 2 x 2 = 4 plays at h
    for step, expected_upper in ((0, 0), (1, 1)):
        specs = cur.episodes(step, random.Random(step), 3, 2)
        assert len(specs) == 6 and {s.tag["difficulty"] for s in specs} == {0}
        rewards = []
        for spec in specs:  # the scripted agent always answers correctly
            env = spec.env_factory()
            env.reset(seed=spec.seed)
            rewards.append(env.step(box(env.problem.reference_answer))[1])
        metrics = cur.observe(step, played(specs, rewards))
        assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["rlve/accuracy"] == 1.0
        assert metrics["rlve/envs_raised"] == (3.0 if expected_upper else 0.0)
        assert {lad.upper for lad in cur.ladders.values()} == {expected_upper}
        assert metrics["rlve/mean_upper_bound"] == metrics["rlve/max_upper_bound"] == expected_upper
    specs = cur.episodes(2, random.Random(2), 3, 2)  # now from levels [0, 1]
    assert {s.tag["difficulty"] for s in specs} <= {0, 1}


@needs_rlve
def test_failures_and_partial_rewards_count_as_incorrect():
    cur = RLVECurriculum(["Multiplication"], window_factor=1)
    specs = cur.episodes(0, random.Random(0), 1, 2)
    trajs = played(specs, [1.0, 1.0])
    trajs[1].failure = {"reason": "env_raised"}
    assert cur.observe(0, trajs)["rlve/accuracy"] == 0.5
    assert cur.ladders["Multiplication"].upper == 0
    specs = cur.episodes(1, random.Random(1), 1, 2)
    assert cur.observe(1, played(specs, [0.99, 1.0]))["rlve/envs_raised"] == 0.0


@needs_rlve
def test_state_round_trip_continues_identically():
    a = RLVECurriculum(THREE, window_factor=1)
    specs = a.episodes(0, random.Random(0), 2, 2)
    a.observe(0, played(specs, [1.0, 1.0, 1.0, 0.0]))
    state = json.loads(json.dumps(a.state_dict()))
    b = RLVECurriculum(THREE, window_factor=1)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    for step in (1, 2, 3):
        sa = a.episodes(step, random.Random(step), 2, 2)
        sb = b.episodes(step, random.Random(step), 2, 2)
        assert [s.tag for s in sa] == [s.tag for s in sb]
        rewards = [float(i % 3 != 0) for i in range(len(sa))]
        assert a.observe(step, played(sa, rewards)) == b.observe(step, played(sb, rewards))
    assert a.state_dict() == b.state_dict()


# -- the ladder (no rlve-gym needed) --------------------------------------------------------------

def test_ladder_raises_after_a_full_window_at_threshold():
    lad = DifficultyLadder(num_generations=2)  # window 8 x 2 = 16
    assert lad.window == 16 and lad.upper == 0
    for _ in range(15):
        assert lad.record(0, True) is False
    assert (lad.upper, lad.correct, lad.total) == (0, 15, 15)
    assert lad.record(0, True) is True
    assert (lad.upper, lad.correct, lad.total) == (1, 0, 0)


@pytest.mark.parametrize("correct,raised", [(34, False), (35, False), (36, True), (40, True)])
def test_ladder_threshold_is_inclusive_and_a_failed_window_resets(correct, raised):
    lad = DifficultyLadder(num_generations=5, upper=3)  # window 40; 36/40 = 0.9
    results = [True] * correct + [False] * (40 - correct)
    random.Random(correct).shuffle(results)
    flags = [lad.record(3, ok) for ok in results]
    assert flags[-1] is raised and not any(flags[:-1])
    assert (lad.upper, lad.correct, lad.total) == (3 + raised, 0, 0)


def test_ladder_counts_only_plays_at_the_upper_bound():
    lad = DifficultyLadder(num_generations=1, upper=5)
    for difficulty in (2, 3, 4, 6, -1):
        assert lad.record(difficulty, True) is False
    assert (lad.correct, lad.total, lad.accuracy) == (0, 0, None)
    lad.record(5, False)
    assert (lad.correct, lad.total, lad.accuracy) == (0, 1, 0.0)


def test_ladder_samples_the_last_levels_uniformly():
    rng = random.Random(0)
    for upper, low in ((0, 0), (2, 0), (3, 0), (7, 4)):
        lad = DifficultyLadder(upper=upper)
        draws = [lad.sample(rng) for _ in range(2000)]
        assert set(draws) == set(range(low, upper + 1))
        for level in range(low, upper + 1):  # roughly uniform
            assert abs(draws.count(level) / 2000 - 1 / (upper - low + 1)) < 0.05
    assert {DifficultyLadder(upper=9, levels=2).sample(rng) for _ in range(200)} == {8, 9}


def test_ladder_state_round_trip():
    a = DifficultyLadder(num_generations=2, window_factor=1)
    for ok in (True, True, True, False, True):
        a.record(a.upper, ok)
    b = DifficultyLadder(window_factor=1)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    ra, rb = random.Random(4), random.Random(4)
    for ok in (True, False, True, True, True, True):
        assert a.record(a.upper, ok) == b.record(b.upper, ok)
        assert a.sample(ra) == b.sample(rb)
    assert a.state_dict() == b.state_dict()
