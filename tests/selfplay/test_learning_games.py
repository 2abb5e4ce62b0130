"""The learning benchmark's games and its skill figures (issue 17).

``tests/data/limit_bid.py`` (one turn) and ``tests/data/hidden_limit.py`` (two turns: reveal,
then bid) are what ``benchmarks/learning.py`` trains on by default, so they must be valid
environments (the real validator, in the real sandbox), their solutions must score 1, and the
two-turn game must not pay a shortcut: ``\\boxed{reveal 2}`` is a reveal, not a blind bid of 2
(an earlier version read it as a bid, and the bundled model learned that instead of the skill).
``first_verb`` and ``game_figures`` are how the benchmark shows what was learned (which move an
episode opened with), so they are tested on real trajectories' shapes here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from spadekit.sandbox.validate import Validator, ValidatorSettings

DATA = Path(__file__).parents[1] / "data"
BENCH = Path(__file__).parents[2] / "benchmarks" / "learning.py"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_learning_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["limit_bid", "hidden_limit"])
def test_the_benchmark_games_are_valid_environments(pool, name):
    report = Validator(pool=pool, settings=ValidatorSettings(seeds=(1, 2, 3))).validate(
        (DATA / f"{name}.py").read_text())
    assert report.ok, report.message
    assert report.details["solution"] == "replayed"


def play(env, seed, actions):
    env.reset(seed=seed)
    total, steps = 0.0, []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        steps.append((obs, terminated, truncated))
        if terminated or truncated:
            break
    return total, steps


def test_hidden_limit_pays_the_two_step_skill_and_no_shortcut():
    game = load(DATA / "hidden_limit.py")
    env = game.HiddenLimitEnv()
    for seed in range(20):
        env.reset(seed=seed)
        limit = env.limit
        assert play(env, seed, env.solution())[0] == 1.0
        # a reveal with a number after it is still a reveal: the game goes on, nothing is paid
        total, steps = play(env, seed, ["\\boxed{reveal 2}"])
        assert total == 0.0 and steps[0][1:] == (False, False)
        assert f"The limit is {limit}" in steps[0][0]
        # ... and the next bid is scored against the limit it showed
        assert play(env, seed, ["\\boxed{reveal 2}", f"\\boxed{{bid {limit}}}"])[0] == 1.0
        # once shown, the limit is in the observation, and any number in the box is the bid
        assert f"\\boxed{{{limit}}}" in steps[0][0]
        assert play(env, seed, ["\\boxed{reveal}", f"\\boxed{{reveal {limit}}}"])[0] == 1.0
        # a blind bid of 2 earns only 2 / limit; a second bare reveal ends it unpaid
        assert play(env, seed, ["\\boxed{2}"])[0] == pytest.approx(2 / limit)
        total, steps = play(env, seed, ["\\boxed{reveal}", "\\boxed{reveal}"])
        assert total == 0.0 and steps[-1][2] is True
        assert play(env, seed, ["\\boxed{guess 99}"])[0] == 0.0


def turn(action):
    return SimpleNamespace(action=action)


def test_first_moves_read_the_box_the_game_reads():
    bench = load(BENCH)
    assert bench.first_verb("\\boxed{reveal 2}") == "reveal"
    assert bench.first_verb("\\boxed{ 7}") == "<number>"
    assert bench.first_verb("\\boxed{Pack 1 2}") == "pack"
    assert bench.first_verb("no box at all") == "<no box>"
    # the games read the last box: an empty one after a copied instruction is what counts
    assert bench.first_verb("\\boxed{reveal} to see it, or bid in \\boxed{}") == "<other>"
    trajs = [SimpleNamespace(episode_return=r, turns=[turn(a) for a in actions],
                             stop_reason="terminated", failure=None)
             for r, actions in [(1.0, ["\\boxed{reveal}", "\\boxed{5}"]),
                                (0.4, ["\\boxed{2}"]), (0.0, ["\\boxed{reveal}", "x"]),
                                (0.0, [])]]
    figures = bench.game_figures(trajs)
    assert figures["mean_return"] == pytest.approx(0.35)
    assert figures["win_rate"] == 0.5 and figures["full_score_share"] == 0.25
    assert figures["multi_turn_share"] == 0.5 and figures["turns"] == 1.25
    assert figures["first_moves"] == {"reveal": 2, "<number>": 1, "<no turn>": 1}
    assert figures["stop_reasons"] == {"terminated": 4} and figures["first_failure"] is None
