"""The validator's ``play_seeds`` (``Validator.validate(..., play_seeds=...)``): the reset seeds a
caller will play are validated too, and on none of them may every garbage episode do as well as
the solution. Without them (self-play) a validation is what it was: the same seeds drawn, the
same verdict. Honest programs pass either way. CPU, seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spadekit.common.errors import ConfigError  # noqa: E402
from spadekit.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from spadekit.sandbox.validate import Validator  # noqa: E402
from validate_cases import GUESS  # noqa: E402

HIDDEN = 4_000_000_000
"""A seed the validator never draws by itself (its drawn seeds are below 2**31)."""

PAYS_ON_HIDDEN = GUESS.replace(
    "        self.turn, self.done = 0, False\n",
    "        self.turn, self.done = 0, False\n"
    f"        self.paid = seed == {HIDDEN}\n", 1).replace(
    "        self.turn += 1\n",
    "        self.turn += 1\n"
    "        if self.paid:\n"
    "            self.done = True\n"
    "            return 'Correct!', 1.0, True, False, {}\n", 1)


@pytest.fixture(scope="module")
def validator():
    pool = SandboxPool(SandboxConfig(), warm=1)
    v = Validator(pool)
    yield v
    v.close()
    pool.close()


def test_a_program_paying_any_reply_on_a_seed_the_caller_plays_is_refused(validator):
    assert PAYS_ON_HIDDEN.count("self.paid") == 2
    alone = validator.validate(PAYS_ON_HIDDEN, seed=7)
    assert alone.ok, alone.message  # self-play's validation never plays that seed
    played = validator.validate(PAYS_ON_HIDDEN, seed=7, play_seeds=[11, HIDDEN, 12])
    assert not played.ok and played.reason == "action_independent", played.message
    assert played.details["play_seed"] == HIDDEN and str(HIDDEN) in played.message
    assert HIDDEN in played.details["seeds"]["solution"]


def test_honest_programs_pass_on_the_callers_seeds_and_self_play_is_unchanged(validator):
    plays = [HIDDEN + j for j in range(12)]
    report = validator.validate(GUESS, seed=3, play_seeds=plays)
    assert report.ok, report.message
    assert set(plays) <= set(report.details["seeds"]["solution"])
    assert report.details["play_seeds"] == len(plays)
    a, b = validator.validate(GUESS, seed=3), validator.validate(GUESS, seed=3, play_seeds=())
    assert a.ok and b.ok and a.details["seeds"] == b.details["seeds"]
    assert "play_seeds" not in a.details


def test_play_seeds_must_be_ints(validator):
    with pytest.raises(ConfigError):
        validator.validate(GUESS, play_seeds=["1"])
    with pytest.raises(ConfigError):
        validator.validate_many([GUESS], seeds=[1], play_seeds=[[1], [2]])
