"""Procedural kit programs (issue 39): every combination of the parts written as a game-kit
program passes the real validator at the default preset's turn cap and at 8 turns; the
program names its composition, opens its import with the part that makes its skill, holds
its hint, is about 150 tokens of code, and is the same for the same seed."""

from __future__ import annotations

import random

import pytest

from spadekit.envs.procedural import Combo, all_combos, compose_kit, surface_words
from spadekit.envs.procedural.kit import SKILL_PARTS, kit_import, skill_part
from spadekit.sandbox.validate import Validator, ValidatorSettings
from spadekit.selfplay.kit_identity import kit_identity

WORDS = ["harbor", "lantern", "meadow", "copper", "thistle", "willow", "garnet", "pebble",
         "orchid", "juniper"]
TEXT = ("The harbor lantern burned over the meadow while copper thistle and willow garnet "
        "pebble orchid juniper kelp and basalt lay along the fjord near the delta.")


def _programs(cap: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [compose_kit(c, surface_words(TEXT, rng, 10), rng.randrange(2 ** 31), cap)
            for c in all_combos()]


@pytest.mark.parametrize("cap", [3, 8])
def test_every_procedural_kit_program_validates(cap):
    programs = _programs(cap, seed=cap)
    with Validator(settings=ValidatorSettings(max_turns=cap)) as validator:
        reports = validator.validate_many([p.code for p in programs], workers=2,
                                          seeds=list(range(len(programs))))
    bad = [(p.meta["procedural"]["combo"], r.reason, r.message[:160])
           for p, r in zip(programs, reports) if not r.ok]
    assert not bad
    assert all(r.details.get("solution_turns") and max(r.details["solution_turns"]) <= cap
               for r in reports)


def test_a_kit_program_names_its_composition_skill_and_kit_version():
    for program in _programs(3):
        combo = Combo.parse(program.meta["procedural"]["combo"])
        ident = kit_identity(program.code)
        assert ident is not None and ident.composition == combo.key
        assert program.meta["gamekit"] == "v1" and program.meta["procedural"]["style"] == "kit"
        assert program.skill == combo.skill
        first = program.code.splitlines()[0]
        assert first.startswith(kit_import([skill_part(combo.skill)]) + ", ") or \
            first == kit_import([skill_part(combo.skill)])
        assert "HINT = " in program.code and program.hint in program.code
        assert len(program.code) < 900


def test_the_same_seed_writes_the_same_program_and_another_seed_another():
    combo = Combo("cause", "clue", "banded", "budget")
    one, two = compose_kit(combo, WORDS, 5, 3), compose_kit(combo, WORDS, 5, 3)
    assert one.code == two.code
    others = {compose_kit(combo, WORDS, s, 3).code for s in range(6)}
    assert len(others) > 1


def test_skill_parts_are_the_parts_that_make_each_skill():
    for skill, part in SKILL_PARTS.items():
        made = {c.skill for c in all_combos()
                if part in (f"Hidden{c.hidden.capitalize()}",)
                or (part == "ScoreThrifty" and c.scoring == "thrifty")}
        assert skill in made
    with pytest.raises(KeyError):
        skill_part("Juggling")


def test_too_few_words_or_turns_is_a_clear_error():
    combo = Combo("number", "probe", "exact", "open")
    with pytest.raises(ValueError, match="at least 8 distinct words"):
        compose_kit(combo, ["probe", "answer", "harbor"], 0, 3)
    with pytest.raises(ValueError, match="at least 2 turns"):
        compose_kit(combo, WORDS, 0, 1)


def test_spadekit_procedural_style_kit_writes_a_validated_kit_pool_with_its_split(tmp_path):
    import json

    from typer.testing import CliRunner

    from spadekit.cli.app import app
    from spadekit.runs.pool import load_pool

    out = tmp_path / "pool"
    res = CliRunner().invoke(app, ["procedural", "--out", str(out), "--style", "kit",
                                   "--split", "held_out", "--max-turns", "3", "--seed", "2"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["style"] == "kit" and summary["invalid"] == 0
    assert summary["kept"] == summary["combos"] == 84  # 60 gated + 20% of the other 120
    programs = load_pool(out)
    split = json.loads((out / "split.json").read_text())
    assert {kit_identity(p.code).composition for p in programs} == set(split["held_out"])
    assert all(p.meta["gamekit"] == "v1" for p in programs)


def test_draw_combos_keeps_every_part_and_is_fixed_by_its_seed():
    from spadekit.selfplay.procedural_pool import draw_combos, split_combos

    train = split_combos(0).train
    one, two = draw_combos(train, 48, 0), draw_combos(train, 48, 0)
    assert one == two and len(one) == 48 and set(one) <= set(train)
    assert draw_combos(train, 48, 1) != one
    for kind in ("hidden", "info", "scoring", "turns"):
        assert {getattr(c, kind) for c in one} == {getattr(c, kind) for c in train}
    assert draw_combos(train, 10_000, 0) == tuple(train)
