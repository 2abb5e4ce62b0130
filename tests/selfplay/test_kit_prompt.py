"""The kit designer prompt (issue 39, ``designer.prompt_style: kit``): the menu of parts, the
skill named with the part that makes it (the loop's one choice), the document's theme words,
memory references as kit classes on one line; a warm-start example's completion is the
program with its hint inside the code, and extracts as written."""

from __future__ import annotations

import pytest

from spadekit.common.errors import ConfigError
from spadekit.envs.extract import extract_program
from spadekit.envs.procedural import Combo, compose_kit
from spadekit.envs.procedural.kit import SKILL_PARTS
from spadekit.envs.skills import skills_for
from spadekit.selfplay.config import SelfPlayConfig, build
from spadekit.selfplay.prompts import build_designer_messages, kit_reference
from spadekit.selfplay.warmstart import designer_completion

WORDS = ["harbor", "lantern", "meadow", "copper", "thistle", "willow", "garnet", "pebble"]
DOC = "The harbor lantern burned over the meadow; copper thistle grew by the willow."


def test_the_kit_prompt_holds_menu_skill_theme_words_and_kit_references():
    refs = [compose_kit(Combo("cell", "probe", "steep", "budget"), WORDS, 1, 3),
            "class OldEnv:\n    def reset(self, seed=None, options=None):\n"
            "        return 'Find the hidden key among the doors.', {}\n"]
    system, user = build_designer_messages("games", "Spatial_Reasoning", DOC, refs, None, 3,
                                           style="kit")
    assert system["role"] == "system" and "spadekit.envs.gamekit.v1" in system["content"]
    for part in ("HiddenCell(rows, cols)", "Probe(), Reveal(), Clue()",
                 "ScoreThrifty(cost, floor)", "GatedTurns(limit, looks)", "max_turns=3"):
        assert part in system["content"]
    text = user["content"]
    assert text.startswith("Skill: Spatial_Reasoning (its part: HiddenCell).")
    assert "Theme words: harbor, lantern, burned, meadow" in text
    assert "(KitEnv): hidden = HiddenCell(" in text and "HINT" not in text  # the class, no hint
    assert "OldEnv: Find the hidden key" in text  # a whole program: its summary
    assert text.endswith("Write a new kit game for Spatial_Reasoning with HiddenCell.")


def test_the_prompt_names_the_part_that_makes_each_skill():
    for skill in skills_for("games"):
        _system, user = build_designer_messages("games", skill, DOC, style="kit")
        part = SKILL_PARTS[skill]
        assert user["content"].startswith(f"Skill: {skill} (its part: {part}).")
        assert user["content"].endswith(f"Write a new kit game for {skill} with {part}.")


def test_a_warm_start_completion_holds_the_hint_in_the_code_and_extracts_as_written():
    program = compose_kit(Combo("number", "clue", "thrifty", "open"), WORDS, 3, 3)
    completion = designer_completion(program)
    assert completion.startswith("```python\nfrom spadekit.envs.gamekit.v1 import KitEnv, "
                                 "ScoreThrifty, HiddenNumber, Clue, OpenTurns\n")
    assert "\nHINT:" not in completion
    found = extract_program(completion)
    assert found.code.strip() == program.code.strip() and found.hint == program.hint


def test_the_kit_style_is_for_games():
    with pytest.raises(ValueError, match="for games"):
        build_designer_messages("tooluse", skills_for("tooluse")[0], DOC, style="kit")
    with pytest.raises(ConfigError, match="prompt_style=kit is for games.*prompt_style=compact"):
        build(SelfPlayConfig, {"setting": "tooluse", "designer": {"prompt_style": "kit"}})


def test_kit_reference_is_the_class_on_one_line_with_its_own_methods_named():
    code = compose_kit(Combo("order", "reveal", "exact", "gated"), WORDS, 2, 3).code
    code = code.replace("    turns =", "    def look(self, words):\n        return 'x' * 500\n"
                        "\n    turns =")
    shown = kit_reference(code)
    assert shown.startswith("class ") and "(KitEnv): hidden = HiddenOrder(items=" in shown
    assert "; info = Reveal(); scoring = ScoreExact(); def look(...); turns = GatedTurns(" \
        in shown and "\n" not in shown and "x" * 20 not in shown and "theme" not in shown
