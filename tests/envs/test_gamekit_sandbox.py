"""The game kit under the real validator, in real sandboxes: a kit program imports the kit in a
worker of every isolation tier (and in process), every combination of the parts with default
parameters passes the real validator (default settings: the kit gets no pass), so do the
parts at their extreme settings (each hidden state at its fewest secrets with each scoring rule
at its most generous, the information actions and turn structures at their extremes in turn),
and a bad parameter or an unversioned import is refused at the load stage with the kit's own
message.
"""

from __future__ import annotations

import itertools

import pytest

from conftest import TEST_CONFIG, TIERS
from spadekit.envs.gamekit import kit_version
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.sandbox.validate import Validator

SAMPLE = '''\
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreSteep, BudgetTurns


class LighthouseEnv(KitEnv):
    theme = "a lighthouse keeper counts the ships that passed in the night"
    hidden = HiddenNumber(low=1, high=60)
    info = Probe()
    scoring = ScoreSteep(power=6)
    turns = BudgetTurns(limit=8, looks=4)


HINT = "Probe the middle of the range first, then move toward higher closeness."
'''
HIDDEN = ("HiddenNumber()", "HiddenCode()", "HiddenCell()", "HiddenCause()", "HiddenOrder()")
INFO = ("Probe()", "Reveal()", "Clue()")
SCORING = ("ScoreExact()", "ScoreSteep()", "ScoreBanded()", "ScoreThrifty()")
TURNS = ("OpenTurns()", "BudgetTurns()", "GatedTurns()")
SMALLEST = ("HiddenNumber(low=1, high=20)", "HiddenCode(length=4, symbols='ab')",
            "HiddenCell(rows=3, cols=3)", "HiddenCause(items='ash elm fir oak yew fig')",
            "HiddenOrder(items='ash elm fir oak')")
GENEROUS = ("ScoreExact()", "ScoreSteep(power=5)", "ScoreBanded(near=0.75, partial=0.5)",
            "ScoreThrifty(cost=0.02, floor=0.5)")
EXTREME_INFO = ("Probe(decimals=3)", "Reveal(verb='read')", "Clue(verb='ask')")
EXTREME_TURNS = ("OpenTurns(limit=25)", "BudgetTurns(limit=2, looks=1)",
                 "GatedTurns(limit=5, looks=4)")


def program(hidden: str, info: str, scoring: str, turns: str) -> str:
    """A kit program (raw text, as the designer writes it, hint included)."""
    return (f"from spadekit.envs.gamekit.v1 import *\n\n\nclass SweepEnv(KitEnv):\n"
            f"    theme = \"a keeper's puzzle\"\n    hidden = {hidden}\n    info = {info}\n"
            f"    scoring = {scoring}\n    turns = {turns}\n\n\n"
            f"HINT = \"Use the look before you answer.\"\n")


def _loads_and_wins(pool: SandboxPool) -> None:
    sb = pool.acquire(SAMPLE)
    try:
        assert sb.program["class_name"] == "LighthouseEnv" and sb.program["has_solution"]
        assert not sb.program["has_tools"]
        for seed in (0, 7):
            env = sb.new_env(max_turns=12)
            obs, info = env.reset(seed=seed)
            assert obs.startswith("A lighthouse keeper counts") and info == {}
            actions = env.solution()
            assert len(actions) == 2
            replay = sb.new_env(max_turns=12)
            replay.reset(seed=seed)
            results = [replay.step(a) for a in actions]
            assert results[-1][1:4] == (1.0, True, False)
    finally:
        pool.release(sb)


def test_a_kit_program_imports_the_kit_in_a_worker_of_every_safe_tier(pool):
    _loads_and_wins(pool)


def test_a_kit_program_imports_the_kit_without_isolation_and_in_process():
    weak = SandboxPool(SandboxConfig(tier="weak", allow_unsafe=True, **TEST_CONFIG), warm=0)
    try:
        _loads_and_wins(weak)
    finally:
        weak.close()
    namespace: dict = {}
    exec(compile(SAMPLE, "<kit>", "exec"), namespace)
    env = namespace["LighthouseEnv"]()
    env.reset(seed=0)
    assert kit_version(SAMPLE) == "v1" and env.solution()[-1].startswith("\\boxed{answer ")


@pytest.fixture(scope="module")
def kit_pool():
    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    p = SandboxPool(SandboxConfig(tier=TIERS[0], **TEST_CONFIG), warm=2)
    yield p
    p.close()


def _refusals(pool: SandboxPool, programs: list[tuple], seeds: list[int]) -> list[tuple]:
    validator = Validator(pool)  # default settings
    failed = []
    for k, parts in enumerate(programs):
        for seed in seeds:
            report = validator.validate(program(*parts), seed=1000 * k + seed)
            if not report.ok:
                failed.append((parts, seed, report.stage, report.reason, report.message[:200]))
    return failed


def test_every_combination_of_the_parts_passes_the_real_validator(kit_pool):
    combos = list(itertools.product(HIDDEN, INFO, SCORING, TURNS))
    assert len(combos) == 180
    assert _refusals(kit_pool, combos, [1]) == []


def test_the_parts_at_their_extreme_settings_pass_the_real_validator(kit_pool):
    # every smallest hidden state with every most generous scoring rule; the extreme
    # information actions and turn structures in turn, each used at least six times
    combos = [(h, EXTREME_INFO[k % 3], s, EXTREME_TURNS[(k + k // 3) % 3])
              for k, (h, s) in enumerate(itertools.product(SMALLEST, GENEROUS))]
    assert all(sum(c[i] == x for c in combos) >= 6
               for i, xs in ((1, EXTREME_INFO), (3, EXTREME_TURNS)) for x in xs)
    assert _refusals(kit_pool, combos, [1, 2]) == []


@pytest.mark.parametrize("parts, message", [
    (("HiddenNumber(low=1, high=0)", "Probe()", "ScoreExact()", "OpenTurns()"),
     "KitError: HiddenNumber.high: must be an int in [1, 1000000], got 0"),
    (("HiddenCode()", "Clue()", "ScoreBanded(partial=1.0)", "OpenTurns()"),
     "KitError: ScoreBanded.partial: must be a number in [0.05, 0.5], got 1.0"),
    (("HiddenCell()", "Reveal()", "ScoreExact()", "GatedTurns(limit=3, looks=3)"),
     "KitError: GatedTurns.looks: must be below limit (3)"),
    (("HiddenOrder()", "Probe()", "OpenTurns()", "ScoreExact()"),
     "KitError: SweepEnv.scoring: must be a scoring part such as ScoreExact(), got OpenTurns"),
])
def test_a_bad_parameter_is_refused_at_load_with_the_kit_s_message(kit_pool, parts, message):
    report = Validator(kit_pool, seed=1).validate(program(*parts))
    assert (report.ok, report.stage, report.reason) == (False, "load", "load_error")
    assert message in report.message, report.message


def test_an_unversioned_import_is_refused_at_load_naming_the_versions(kit_pool):
    code = program(*HIDDEN[:1], *INFO[:1], *SCORING[:1], *TURNS[:1]).replace(
        "gamekit.v1 import *", "gamekit import KitEnv, HiddenNumber, Probe, ScoreExact, "
                               "OpenTurns")
    report = Validator(kit_pool, seed=1).validate(code)
    assert (report.ok, report.stage, report.reason) == (False, "load", "load_error")
    assert "the game kit is imported by version: write `from spadekit.envs.gamekit.v1 " \
           "import KitEnv` (released: v1)" in report.message
