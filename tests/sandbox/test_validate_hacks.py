"""The designer's reward cannot be hacked through the validator, real sandboxes.

Each hostile program of ``tests/data/hacks/`` is a plain program a designer could write that
the validator of 2767866 admitted: a lottery without a solution, one that pays 0.99 for any
answer, one that pays for any action outside the old garbage grammar, one that pays any action
from its sixth instance on, one that pays once it sees several instances stepping in turn, a
tool-use one accepting any ``<answer>`` but ``done``, one whose module-level random object
is shared by its instances, and one paying the example reply its own observation prints. A coin
to call validates, with a chance return near one half. Each is refused now; the ``honest_*`` controls and the
reference-style ``global_rng.py`` (module ``random`` seeded in ``reset``) still validate, and
``global_rng.py`` plays the same episodes interleaved in one worker as alone (per-instance
random streams in the worker). A worker's total for one lockstep turn is measured and bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("validate_cases")

from spadekit.sandbox.batch import start_many, step_many  # noqa: E402
from spadekit.sandbox.validate import Validator, ValidatorSettings  # noqa: E402
from validate_cases import expect  # noqa: E402

HACKS = Path(__file__).resolve().parents[1] / "data" / "hacks"


def hack(name: str) -> str:
    return (HACKS / name).read_text()


REFUSED = {
    "lottery.py": {("solution", "no_solution")},
    "lottery_with_solution.py": {("solution", "solution_fails")},
    "pays_099.py": {("action_dependent", "action_independent")},
    "outside_grammar.py": {("action_dependent", "action_independent")},
    "any_answer_tool.py": {("action_dependent", "action_independent")},
    # paid only when interleaved: the replay differs from the episode played alone, or the
    # garbage of the lockstep batch is paid (which one depends on the drawn order)
    "instance_counter.py": {("lockstep", "nondeterministic"),
                            ("action_dependent", "action_independent")},
    "batch_detector.py": {("lockstep", "nondeterministic"),
                          ("action_dependent", "action_independent")},
    "shared_rng_object.py": {("lockstep", "nondeterministic")},
    # the example reply it prints is paid 0.8: the blind-reply baseline
    "pays_the_example.py": {("action_dependent", "action_independent")},
}


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("seed", [1, 2])
def test_hostile_program_is_refused(pool, name, seed):
    report = Validator(pool, seed=seed).validate(hack(name))
    assert not report.ok and (report.stage, report.reason) in REFUSED[name], \
        f"{name}: {report.stage}/{report.reason}: {report.message}"


@pytest.mark.parametrize("name", ["honest_vault.py", "honest_tool.py", "global_rng.py"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_honest_controls_validate(pool, name, seed):
    report = Validator(pool, seed=seed).validate(hack(name))
    expect(report, True, "done", "ok")
    d = report.details
    assert d["solution_returns"] == [1.0] * 6  # 3 fixed seeds + 3 drawn
    assert d["solution_mean_return"] - max(d["garbage_mean_return"],
                                           d["random_mean_return"]) >= d["action_margin"]
    assert d["lockstep"]["instances"] >= 8


def test_action_independent_report_records_the_measured_figures(pool):
    report = Validator(pool, seed=4).validate(hack("pays_099.py"))
    expect(report, False, "action_dependent", "action_independent")
    d = report.details
    assert d["solution_returns"] == [1.0] * 6 and d["action_margin"] == 0.5
    assert d["garbage_mean_return"] == pytest.approx(0.99)
    assert len(d["garbage_returns"]) == 9 and len(d["random_returns"]) == 9  # 3 per drawn seed
    assert "0.99" in report.message


def test_margin_is_a_setting(pool):
    # both margins: the random policy's is its own (random_margin)
    lenient = Validator(pool, ValidatorSettings(action_margin=0.005, random_margin=0.005),
                        seed=4).validate(hack("pays_099.py"))
    expect(lenient, True, "done", "ok")
    # its riddle has one answer on every seed: another seed's solution wins it, which is its
    # chance return (the watch's constant_answer judges such a program in play)
    assert lenient.details["chance_return"] == 1.0
    assert lenient.details["blind_reply"].startswith("replaying another seed's solution")
    half = Validator(pool, ValidatorSettings(action_margin=0.005), seed=4)
    expect(half.validate(hack("pays_099.py")), False, "action_dependent", "action_independent")


def test_without_require_solution_the_absolute_criterion_applies(pool):
    settings = ValidatorSettings(require_solution=False)
    report = Validator(pool, settings, seed=1).validate(hack("lottery.py"))
    expect(report, True, "done", "ok")  # pays at most 0.2: the old contract, for imports
    assert report.details["solution"] == "absent"


def test_solution_must_win_on_drawn_seeds_too(pool):
    # wins on the fixed seeds 0, 1, 2 only: the drawn seeds find it out
    code = hack("honest_vault.py").replace(
        "    def solution(self):\n",
        "    def solution(self):\n        if self.seed not in (0, 1, 2):\n"
        "            return ['\\\\boxed{1}']\n").replace(
        "        self.rng = random.Random(seed)\n",
        "        self.rng = random.Random(seed)\n        self.seed = seed\n")
    report = Validator(pool, seed=1).validate(code)
    expect(report, False, "solution", "solution_fails")
    assert report.details["seed"] not in (0, 1, 2)


def _play(sb, episodes):
    """Lockstep play with the batch primitives (as RolloutEngine runs a group)."""
    started = start_many([(sb, 12, seed, None) for seed, _ in episodes])
    envs = [s[0] for s in started]
    traces = [[s[1]] for s in started]
    for turn in range(len(episodes[0][1])):
        for i, result in enumerate(step_many([(env, acts[turn]) for env, (_, acts)
                                              in zip(envs, episodes)])):
            traces[i].append(result[:4])
    return traces


@pytest.mark.parametrize("held", [False, True], ids=["module_functions", "from_import"])
def test_reference_style_random_is_per_instance_in_play(pool, held):
    actions = ["\\boxed{50}", "\\boxed{20}", "\\boxed{70}", "\\boxed{33}"]
    episodes = [(seed, actions) for seed in (11, 12, 13, 11)]
    code = hack("global_rng.py")
    if held:  # holds the shared generator's own method: the worker's complete swap
        code = code.replace("import random\n", "import random\nfrom random import randint\n"
                            ).replace("clicks = random.randint(1, 6)", "clicks = randint(1, 6)")
        assert "clicks = randint(1, 6)" in code
    sb = pool.acquire(code)
    try:
        alone = [_play(sb, [ep])[0] for ep in episodes]
        together = _play(sb, episodes)
    finally:
        pool.release(sb)
    assert together == alone
    assert together[0] == together[3]  # same seed, same episode, whatever ran in between


def test_instances_that_never_seed_start_alike(pool):
    code = '''
import random


class DrawEnv:
    def reset(self, seed=None, options=None):
        return "draw %d" % random.randint(0, 10 ** 9), {}

    def step(self, action):
        return "again %d" % random.randint(0, 10 ** 9), 0.0, False, False, {}
'''
    sb = pool.acquire(code)
    try:
        first = _play(sb, [(None, ["a", "b"])])
        many = _play(sb, [(None, ["a", "b"])] * 3)
    finally:
        pool.release(sb)
    assert many == first * 3


SLOW = '''
import time


class SlowEnv:
    def reset(self, seed=None, options=None):
        self.code = (seed or 0) % 90 + 10
        return "Send the code as \\\\boxed{n}.", {}

    def step(self, action):
        time.sleep(0.06)
        if action.strip() == "\\\\boxed{%d}" % self.code:
            return "Open.", 1.0, True, False, {}
        return "No.", 0.0, False, False, {}

    def solution(self):
        return ["\\\\boxed{%d}" % self.code]
'''


def test_turn_seconds_are_the_workers_total(pool):
    a, b = pool.acquire(SLOW), pool.acquire(SLOW)
    try:
        envs = [s[0] for s in start_many([(a, 12, 1, None)] * 3 + [(b, 12, 2, None)])]
        seconds, totals = [], []
        step_many([(env, "x") for env in envs], seconds, totals)
    finally:
        pool.release(a)
        pool.release(b)
    assert len(totals) == 4 and totals[0] == totals[1] == totals[2]
    assert totals[0] == pytest.approx(sum(seconds[:3])) and totals[0] >= 0.18
    assert totals[3] == pytest.approx(seconds[3]) and totals[3] < totals[0]


def test_local_session_exposes_turn_seconds(pool):
    from spadekit.rollout.engine import LocalPoolBackend

    with LocalPoolBackend(pool).session() as session:
        started = session.start([("s", SLOW, 12, seed) for seed in (1, 2)])
        session.step([(s[0], "x") for s in started])
        assert len(session.turn_seconds) == 2 and session.turn_seconds[0] >= 0.12
        assert session.turn_seconds[0] == pytest.approx(sum(session.step_seconds))


def test_slow_lockstep_turn_is_refused(pool):
    # 0.06 s a step is fast alone; a batch of >= 8 instances holds the worker ~0.5 s a turn
    settings = ValidatorSettings(turn_budget_s=0.3, max_turns=3, slow_steps=2)
    report = Validator(pool, settings, seed=1).validate(SLOW)
    expect(report, False, "lockstep", "slow")
    assert report.details["slow_turns"] and min(report.details["slow_turns"]) > 0.3
    fast_enough = ValidatorSettings(turn_budget_s=30.0, max_turns=3)
    expect(Validator(pool, fast_enough, seed=1).validate(SLOW), True, "done", "ok")


def test_the_example_reply_is_measured_as_a_blind_reply(pool):
    """The random policy replies the printed example now and then; replied every turn it is
    a policy of its own, and its mean return is the program's chance return."""
    report = Validator(pool, seed=4).validate(hack("pays_the_example.py"))
    expect(report, False, "action_dependent", "action_independent")
    d = report.details
    assert d["printed_reply"] == "replying \\boxed{door 5} (an action the program prints) every turn"
    assert d["printed_mean_return"] >= 0.8 and d["chance_return"] == d["printed_mean_return"]
    assert d["random_mean_return"] < 0.75  # what the random policy alone would have let in
    # a first pass over the printed actions and the solved seeds' solutions (at least 6
    # episodes each), then the leaders on 16 fresh seeds each: every episode its own seed
    pick, measure = d["seeds"]["blind"]["pick"], d["seeds"]["blind"]["measure"]
    assert len(pick) >= 6 * 2 and len(measure) >= 16 and len(measure) % 16 == 0
    assert len(set(pick) | set(measure)) == len(pick) + len(measure)
    assert report.message.startswith(d["printed_reply"] + " scores a mean return of 0.")
    off = Validator(pool, ValidatorSettings(blind_episodes=0), seed=4).validate(
        hack("pays_the_example.py"))
    assert off.ok and off.details["printed_mean_return"] == 0.0, off.message


def test_the_chance_return_is_the_best_blind_baseline(pool):
    report = Validator(pool, seed=1).validate(hack("honest_vault.py"))
    d = report.details
    assert d["chance_return"] == max(d["blind_mean_return"], d["garbage_mean_return"],
                                     d["random_mean_return"])


def test_a_guess_it_does_not_print_is_measured_through_other_seeds_solutions(pool):
    """``\\boxed{side n}`` prints no option, so no printed action wins; another seed's
    solution, replayed, calls the coin blind and wins about half the time: that is the chance
    return, and what ``reward.above_chance`` subtracts (an agent calling at random earns 0)."""
    from spadekit.selfplay.rewards import EnvStats, RewardConfig, designer_signal

    report = Validator(pool, seed=4).validate(hack("coin_call.py"))
    expect(report, True, "done", "ok")
    d = report.details
    assert d["blind_reply"].startswith("replaying another seed's solution (\\boxed{side ")
    assert 0.25 <= d["chance_return"] == d["blind_mean_return"] <= 0.75
    guesser = EnvStats([0.5] * 8, [0.5] * 8, chance=d["chance_return"])
    assert designer_signal("blend", guesser) == pytest.approx(0.6)  # the reference's band
    assert designer_signal("blend", guesser, RewardConfig(above_chance=True)) < 0.2
