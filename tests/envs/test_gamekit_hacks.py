"""The cheapest kit programs that would earn reward without being a game lose (real validator,
real sandboxes, default settings; tests/data/kit_hacks/README.md says what each one tries).

Extreme or degenerate parameters fail at the load stage with the kit's own message; a hidden
state that does not change with the seed, and overrides of the kit's machinery (``reset``,
``step``), fail at load too; an opening observation or reminder that shows the secret fails the
interface stage (the kit refuses it at reset, or at the first unknown command); a scoring rule,
verdict or turn structure that pays for anything fails ``action_independent``. A hidden state
that varies only while the kit checks it passes validation, with a chance return of 1
(another seed's solution wins), and is retired by the watch as ``constant_answer``. The honest control, parts and hooks of its own, validates. A look that
gives the answer away is an easy game rather than a broken one: it validates, and the
designer's reward (the plateau on the agent's win rate) is what judges it. A game whose
printed example answer earns partial credit validates with that figure as its chance return;
an agent that copies the example then earns the designer nothing above chance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spadekit.common.streams import RoundStreams
from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore
from spadekit.sandbox.validate import Validator
from spadekit.selfplay.watch import PoolWatch, WatchConfig

HACKS = Path(__file__).resolve().parents[1] / "data" / "kit_hacks"
LOAD = ("load", "load_error")
INTERFACE = ("interface", "env_raised")
PAYS = ("action_dependent", "action_independent")
REFUSED = {
    "tiny_range.py": (LOAD, "KitError: HiddenNumber.high: must be at least low + 19"),
    "one_turn.py": (LOAD, "KitError: HiddenCell.rows: must be an int in [2, 26], got 1"),
    "generous_band.py": (LOAD, "KitError: ScoreBanded.near: must be a number in [0.75, 0.95]"),
    "flat_steep.py": (LOAD, "KitError: ScoreSteep.power: must be an int in [5, 10], got 0"),
    "constant_draw.py": (LOAD, "KitError: Fixed.draw: the hidden state took 1 value(s)"),
    "coin_draw.py": (LOAD, "KitError: Coin.draw: the hidden state took 2 value(s)"),
    "constant_reset.py": (LOAD, "KitError: SameEnv.reset: a kit program does not override"),
    "leak_reset.py": (LOAD, "KitError: DiaryEnv.reset: a kit program does not override"),
    "leak_intro.py": (INTERFACE, "KitError: LogEnv.intro: its text changes with the hidden"),
    "leak_rule.py": (INTERFACE, "KitError: RuleEnv.intro: its text changes with the hidden"),
    "leak_advertised.py": (INTERFACE, "KitError: WhisperEnv.reminder: its text changes"),
    "pays_anything.py": (PAYS, "the random policy scores a mean return of"),
    "pays_near_miss.py": (PAYS, "the random policy scores a mean return of"),
    "pays_for_talk.py": (PAYS, "garbage scores a mean return of"),
}
WATCHED = {"constant_after_check.py": "constant_answer"}
"""Pass validation (with a chance return of 1: another seed's solution wins); retired in play
by the watch."""
VALID = ("honest_override.py", "leak_look.py")
"""The control, and the easy game (see the module docstring)."""
COPIED = ("copy_example.py",)
"""A game whose printed example answer earns partial credit: valid, with that chance return."""


def hack(name: str) -> str:
    return (HACKS / name).read_text()


def test_every_hack_is_listed_here_and_in_the_readme():
    files = sorted(p.name for p in HACKS.glob("*.py"))
    assert files == sorted([*REFUSED, *WATCHED, *VALID, *COPIED])
    readme = (HACKS / "README.md").read_text()
    assert all(f"- {name}:" in readme for name in files)


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("seed", [1, 2])
def test_a_kit_hack_is_refused_by_the_real_validator(pool, name, seed):
    report = Validator(pool, seed=seed).validate(hack(name))
    (stage, reason), message = REFUSED[name]
    assert (report.ok, report.stage, report.reason) == (False, stage, reason), report.message
    assert report.message.startswith(message), report.message


@pytest.mark.parametrize("name", VALID)
def test_the_control_and_the_easy_game_validate(pool, name):
    report = Validator(pool, seed=3).validate(hack(name))
    assert report.ok, report.message
    assert report.details["solution_returns"] == [1.0] * 6


@pytest.mark.parametrize("name", sorted(WATCHED))
def test_a_hack_only_play_shows_is_retired_by_the_watch(tmp_path, pool, name):
    report = Validator(pool, seed=4).validate(hack(name))
    assert report.ok, report.message  # what validation sees is a game
    assert report.details["chance_return"] == 1.0  # whose answer another seed's solution is
    for seed in range(3):
        with RunStore(tmp_path / f"run{seed}", create=True) as store:
            sha = store.add_environment(EnvProgram(code=hack(name)), step=0, validation=report)
            watch = PoolWatch(WatchConfig(spot_checks=1), store, {}, pool, 12, tooluse=False)
            retired, metrics = watch.after_play(0, [], RoundStreams(seed, 0))
            assert retired == {sha} and store.blacklist_reason(sha) == WATCHED[name]


@pytest.mark.parametrize("name", COPIED)
def test_copying_the_printed_answer_earns_the_designer_nothing_above_chance(tmp_path, pool,
                                                                          name):
    """The cheapest agent policy on this game replies the opening observation's example
    answer every turn: under the reference's win rate its plays sit on the plateau; above the
    chance return validation measured, they earn 0, and an agent that wins earns the band."""
    from spadekit.selfplay.rewards import RewardConfig, designer_signal, episode_return
    from spadekit.selfplay.samples import env_stats

    report = Validator(pool, seed=5).validate(hack(name))
    assert report.ok, report.message
    d = report.details
    assert d["chance_return"] == d["blind_mean_return"] >= 0.2
    example = next(a for a in d["advertised"] if a.startswith("\\boxed{answer "))
    program = EnvProgram(code=hack(name))
    sb = pool.acquire(program.code)
    try:  # the copier's real plays, on seeds validation did not use
        copied = []
        for seed in range(100, 116):
            env = sb.new_env(max_turns=6)
            env.reset(seed=seed)
            _obs, reward, terminated, _tr, _info = env.step(example)
            copied.append(episode_return(reward, terminated))
    finally:
        pool.release(sb)
    with RunStore(tmp_path / "run", create=True) as store:
        sha = store.add_environment(program, step=0, validation=report)
        for r in copied:
            store.record_play(sha, 0, with_hint=False, episode_return=r)
            store.record_play(sha, 0, with_hint=True, episode_return=r)
        stats = env_stats(store, {}, sha)
    assert stats.chance == d["chance_return"]
    reference = RewardConfig()
    above = RewardConfig(above_chance=True)
    assert 0.15 < sum(copied) / len(copied) < 0.6
    assert designer_signal("blend", stats, reference) > 0.1   # the reference's plateau pays
    assert designer_signal("blend", stats, above) == 0.0      # nothing above chance
    winner = type(stats)([1.0, 0.5], [1.0, 0.5], chance=stats.chance)
    assert designer_signal("plateau", winner, above) > 0.5    # an agent that plays earns it
