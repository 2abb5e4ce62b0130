"""``benchmarks/retire_rates.py``'s core on two library games (issue item 6): the real validator
and the real watch (real sandboxes, a real run database) judge an honest game over ten seeds
each, the rates come back well-formed, and neither game is refused or retired on them.

The two games are the ones whose margins the full run found tightest in their setting: the
knapsack (random valid packs earn about half the optimum against the validator's random-policy
margin) and the flaky-rates tool game (garbage episodes of the watch sometimes finish it). The
full measurement, its table and intervals are in docs/reward_integrity.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import retire_rates  # noqa: E402

GAMES = ("games_knapsack_reveal", "tools_flaky_rates")
SEEDS = 10
TIMING = {"slow", "slow_in_play"}
"""Verdicts on time, not on margins: a test machine loaded by other work can earn them."""


def test_honest_library_games_are_neither_refused_nor_retired_and_the_rates_are_well_formed():
    games = retire_rates.honest_games(procedural=0, names=GAMES)
    assert sorted(g.name for g in games) == sorted(GAMES)
    assert {g.setting for g in games} == {"games", "tooluse"}
    result = retire_rates.measure(games, validator_seeds=SEEDS, watch_rounds=SEEDS, seed=0,
                                  modes=retire_rates.REPLY_MODES)
    assert set(result["games"]) == set(GAMES)
    checks = ["refused"] + [f"retired_{m}" for m in retire_rates.REPLY_MODES]
    for name, row in result["games"].items():
        assert set(checks) <= set(row), (name, sorted(row))
        for check in checks:
            cell = row[check]
            assert cell["n"] == SEEDS and 0 <= cell["k"] <= cell["n"]
            assert cell["rate"] == cell["k"] / cell["n"]
            lo, hi = cell["ci95"]
            assert 0.0 <= lo <= cell["rate"] <= hi <= 1.0 and hi > 0  # Wilson: never [0, 0]
            assert sum(cell["reasons"].values()) == cell["k"]
            # the honest game: no refusal or retirement on a margin or a replay
            assert not set(cell["reasons"]) - TIMING, (name, check, cell["evidence"])
        # the margins were measured, and each held with room on every seed
        assert row["refused"]["garbage_slack_min"] > 0 and row["refused"]["random_slack_min"] > 0
    assert 0.0 <= result["max_rate"] <= 1.0
    assert all(pair[1] in checks for pair in result["above_limit"])
    lines = retire_rates.table(result)
    assert len(lines) == 2 + len(GAMES) and all(f"/{SEEDS} " in line for line in lines[2:])
    totals = retire_rates.summary(result)
    assert totals["refused"]["n"] == SEEDS * len(GAMES)


def test_wilson_interval_matches_known_values():
    lo, hi = retire_rates.wilson(0, 200)
    assert lo == 0.0 and abs(hi - 0.01884) < 1e-4  # zero in 200: the bound is still ~1.9%
    lo, hi = retire_rates.wilson(5, 100)
    assert abs(lo - 0.02154) < 1e-4 and abs(hi - 0.11175) < 1e-4
