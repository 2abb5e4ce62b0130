"""The kit grammar (``designer.grammar: kit``, issue 39): every procedural kit program is in
it, what it allows loads and passes the real validator (each parameter value it offers, and
whole programs drawn from it by hypothesis), what breaks the kit's ranges or its import is out
of it, and the config refuses it where it cannot hold. The tokenizer is the in-code byte-level
one, so a token is a byte and the matcher reads the text exactly."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")

from spadekit.common.errors import ConfigError  # noqa: E402
from spadekit.envs.procedural import all_combos, compose_kit  # noqa: E402
from spadekit.envs.procedural.compose import theme_words  # noqa: E402
from spadekit.envs.procedural.kit import KIT_PARTS, SKILL_PARTS, kit_import  # noqa: E402
from spadekit.sandbox.validate import Validator, ValidatorSettings  # noqa: E402
from spadekit.selfplay.config import load_config  # noqa: E402
from spadekit.selfplay.kit_grammar import designer_grammar, kit_grammar, part_options  # noqa: E402
from spadekit.selfplay.warmstart import designer_completion  # noqa: E402

TEXT = ("The harbor lantern burned over the meadow while copper thistle and willow garnet "
        "pebble orchid juniper kelp and basalt lay along the fjord near the delta.")
WORDS = theme_words(TEXT)
SKILL_OF = {part: skill for skill, part in SKILL_PARTS.items()}


@pytest.fixture(scope="module")
def tokenizer():
    import llguidance.hf

    from spadekit.policy.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    return tok, llguidance.hf.from_tokenizer(tok, eos_token=tok.convert_tokens_to_ids(
        "<|im_end|>"))


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    import llguidance

    tok, llt = tokenizer
    matcher = llguidance.LLMatcher(llt, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tok.encode(text, add_special_tokens=False)
    return matcher.consume_tokens(ids) and matcher.consume_token(llt.eos_token)


def test_every_procedural_kit_program_is_in_the_grammar_of_its_skill(tokenizer):
    grammars = {skill: kit_grammar(skill, WORDS, 8) for skill in SKILL_PARTS}
    for i, combo in enumerate(all_combos()):
        program = compose_kit(combo, WORDS, i, 8)
        assert _accepts(tokenizer, grammars[combo.skill], designer_completion(program)), \
            program.code


def _program(classes: dict[str, str], options: dict[str, str], cap: int, flavour: bool = False,
             skill: str | None = None) -> str:
    first = SKILL_PARTS[skill] if skill else None
    names = list(classes.values())
    if first in names:
        names = [first] + [n for n in names if n != first]
    lines = [kit_import(names), "", "", "class HarborCellEnv(KitEnv):",
             '    theme = "the harbor keeper hides a secret among the nets"']
    lines += [f"    {slot} = {options[slot]}" for slot in classes]
    if flavour:
        lines += ["", "    def intro(self):",
                  '        return super().intro() + " The harbor is quiet."']
    lines += ["", "", 'HINT = "Look first, then answer once the looks pin it down."']
    return "\n".join(lines)


_BASE = {"hidden": "HiddenNumber", "info": "Probe", "scoring": "ScoreExact",
         "turns": "OpenTurns"}


@pytest.mark.parametrize("cap", [3, 8])
def test_every_parameter_value_the_grammar_offers_loads_and_validates(cap, tokenizer):
    programs = []
    for slot, parts in KIT_PARTS.items():
        for cls in parts.values():
            classes = {**_BASE, slot: cls}
            base = {s: part_options(c, WORDS, cap)[0] for s, c in classes.items()}
            for option in part_options(cls, WORDS, cap):
                programs.append(_program(classes, {**base, slot: option}, cap))
    grammar = kit_grammar("Mathematical_Reasoning", WORDS, cap)
    assert all(_accepts(tokenizer, grammar, f"```python\n{p}\n```") for p in programs)
    with Validator(settings=ValidatorSettings(max_turns=cap)) as validator:
        reports = validator.validate_many(programs, workers=2, seeds=list(range(len(programs))))
    bad = [(p.splitlines()[5:9], r.reason, r.message[:200])
           for p, r in zip(programs, reports) if not r.ok]
    assert not bad
    assert len(programs) > 150


@st.composite
def _grammar_programs(draw):
    cap = draw(st.sampled_from([3, 8]))
    classes = {slot: draw(st.sampled_from(sorted(parts.values())))
               for slot, parts in KIT_PARTS.items()}
    options = {slot: draw(st.sampled_from(part_options(cls, WORDS, cap)))
               for slot, cls in classes.items()}
    skill = draw(st.sampled_from(sorted(SKILL_PARTS)))
    return cap, skill, _program(classes, options, cap, draw(st.booleans()), skill)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_grammar_programs())
def test_whole_programs_drawn_from_the_grammar_validate(tokenizer, drawn):
    cap, skill, code = drawn
    assert _accepts(tokenizer, kit_grammar(skill, WORDS, cap), f"```python\n{code}\n```")
    with Validator(settings=ValidatorSettings(max_turns=cap)) as validator:
        report = validator.validate(code, seed=random.Random(code).randrange(2 ** 31))
    assert report.ok, (report.reason, report.message[:300], code)


@pytest.mark.parametrize("edit", [
    ("ScoreExact()", "ScoreBanded(near=0.4, partial=0.3)"),      # out of the kit's range
    ("OpenTurns(limit=8)", "BudgetTurns(limit=8, looks=8)"),     # no turn left to answer
    ("HiddenNumber(low=0, high=19)", "HiddenCell(rows=3, cols=3)"),  # a part not imported
    ("HiddenNumber(low=0, high=19)", "HiddenNumber(low=5, high=9)"),  # fewer than 20 numbers
    ('HINT = "', 'def look(self, secret, words):\n    return str(secret)\n\n\nHINT = "'),
])
def test_what_breaks_the_kit_is_outside_the_grammar(tokenizer, edit):
    good = _program(_BASE, {s: part_options(c, WORDS, 8)[0] for s, c in _BASE.items()}, 8)
    grammar = kit_grammar("Mathematical_Reasoning", WORDS, 8)
    assert _accepts(tokenizer, grammar, f"```python\n{good}\n```")
    assert edit[0] in good
    bad = good.replace(edit[0], edit[1], 1)
    assert not _accepts(tokenizer, grammar, f"```python\n{bad}\n```")


def test_items_are_runs_of_the_prompts_theme_words_and_without_words_the_default():
    runs = part_options("HiddenOrder", WORDS, 8)
    assert runs and all(" ".join(opt.split('"')[1].split()) in " ".join(WORDS) for opt in runs)
    assert part_options("HiddenCause", [], 8) == ["HiddenCause()"]
    assert all("answer" not in o for o in part_options(
        "HiddenOrder", ["alpha", "answer", "beta", "gamma", "delta", "omega", "sigma"], 8))
    for cls in ("OpenTurns", "BudgetTurns", "GatedTurns"):
        assert all("limit=4" in o or "limit=5" in o or "limit=6" in o or "limit=7" in o
                   or "limit=8" in o for o in part_options(cls, WORDS, 3))


def test_the_designer_grammar_follows_the_config_and_the_prompts_words():
    assert designer_grammar(None, "games", "Logical_Deduction", TEXT, 8) is None
    grammar = designer_grammar("kit", "games", "Logical_Deduction", TEXT, 8)
    assert grammar == kit_grammar("Logical_Deduction", WORDS, 8)
    cut = designer_grammar("kit", "games", "Logical_Deduction", TEXT, 8, doc_words=6)
    assert cut == kit_grammar("Logical_Deduction", theme_words(" ".join(TEXT.split()[:6])), 8)
    with pytest.raises(ValueError, match="designer.grammar"):
        designer_grammar("json", "games", "Logical_Deduction", TEXT, 8)


def test_the_config_refuses_a_grammar_it_cannot_hold():
    assert load_config("cpu-kit").designer.grammar == "kit"
    assert load_config("cpu-tiny").designer.grammar is None
    with pytest.raises(ConfigError, match="designer.grammar: must be one of"):
        load_config("cpu-kit", overrides=["designer.grammar=json"])
    with pytest.raises(ConfigError, match="prompt_style=kit"):
        load_config("cpu-kit", overrides=["designer.prompt_style=compact"])
    with pytest.raises(ConfigError, match="response_prefix"):
        load_config("cpu-kit", overrides=["designer.response_prefix=class"])
    assert load_config("cpu-kit", overrides=["designer.grammar=null",
                                             "designer.prompt_style=compact"]).designer.grammar \
        is None


def test_each_composition_has_one_import_and_the_skill_part_leads():
    grammar = kit_grammar("Optimization", WORDS, 8)
    for combo in itertools.product(*(p.values() for p in KIT_PARTS.values())):
        names = list(combo)
        if "ScoreThrifty" in names:
            names = ["ScoreThrifty"] + [n for n in names if n != "ScoreThrifty"]
        assert kit_import(names).replace('"', '\\"') in grammar


def test_turn_limits_stay_in_the_kit_and_fit_the_cap(tokenizer):
    for cap in (2, 3, 8, 22, 25, 40):
        for cls in ("OpenTurns", "BudgetTurns", "GatedTurns"):
            for option in part_options(cls, WORDS, cap):
                limit = int(option.split("limit=")[1].split(",")[0].rstrip(")"))
                assert 4 <= limit <= 25, option
                if cls == "GatedTurns":
                    assert int(option.split("looks=")[1].rstrip(")")) < cap, option
    with pytest.raises(ValueError, match="at least 2 turns"):
        part_options("OpenTurns", WORDS, 1)
    with pytest.raises(ConfigError, match="turn cap of at least 2"):
        load_config("cpu-kit", overrides=["rollout.max_turns=1"])
    codes = [_program({**_BASE, "turns": "GatedTurns"},
                      {**{s: part_options(c, WORDS, 2)[0] for s, c in _BASE.items()},
                       "turns": o}, 2) for o in part_options("GatedTurns", WORDS, 2)]
    codes += [_program(_BASE, {**{s: part_options(c, WORDS, 25)[0] for s, c in _BASE.items()},
                               "turns": o}, 25) for o in part_options("OpenTurns", WORDS, 25)]
    with Validator(settings=ValidatorSettings(max_turns=2)) as validator:
        reports = validator.validate_many(codes, workers=2, seeds=list(range(len(codes))))
    assert all(r.ok for r in reports), [(r.reason, r.message[:120]) for r in reports]


@pytest.mark.parametrize("text", ['theme = "A         "', 'theme = "the keeper  "'])
def test_a_blank_theme_or_hint_is_outside_the_grammar(tokenizer, text):
    good = _program(_BASE, {s: part_options(c, WORDS, 8)[0] for s, c in _BASE.items()}, 8)
    grammar = kit_grammar("Mathematical_Reasoning", WORDS, 8)
    bad = good.replace('theme = "the harbor keeper hides a secret among the nets"', text)
    assert bad != good and not _accepts(tokenizer, grammar, f"```python\n{bad}\n```")
    blank_hint = good.replace('HINT = "Look first, then answer once the looks pin it down."',
                              'HINT = "A.........."')
    assert not _accepts(tokenizer, grammar, f"```python\n{blank_hint}\n```")


@pytest.mark.parametrize("override", [
    "generation_model=openai:model@http://127.0.0.1:9/v1", "designer.repair_attempts=1",
    "chat_template.designer.enable_thinking=true"])
def test_the_config_refuses_what_would_bypass_a_grammar(override):
    with pytest.raises(ConfigError, match="grammar"):
        load_config("cpu-kit", overrides=[override])
