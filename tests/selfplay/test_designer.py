"""Designer and hint prompts, hint parsing and the hint leak check."""

from __future__ import annotations

import types

import pytest

from spadekit.selfplay.prompts import (DOC_WORDS, SKILLS, build_designer_messages, build_hint_messages,
                               hint_leaks, leaked_fragments, normalize_skill, parse_hint,
                               skills_for)
from spadekit.envs.actions import format_tool_call
from spadekit.envs.library import list_library, source
from spadekit.envs.program import EnvProgram

GAME_SKILLS = ["Mathematical_Reasoning", "Logical_Deduction", "Spatial_Reasoning",
               "Pattern_Recognition", "Optimization", "Causal_Inference"]
TOOL_SKILLS = ["API_Orchestration", "Data_Retrieval", "State_Modification", "Error_Recovery",
               "Tool_Selection", "Multi-Step_Workflows"]


def test_skills_match_the_spec():
    assert skills_for("games") == GAME_SKILLS and skills_for("tooluse") == TOOL_SKILLS
    for setting in SKILLS:
        for skill, text in SKILLS[setting].items():
            assert 25 <= len(text.split()) <= 80, skill
    assert {e.skill for e in list_library()} == set(GAME_SKILLS) | set(TOOL_SKILLS)
    assert normalize_skill("tooluse", "multi step workflows") == "Multi-Step_Workflows"
    assert normalize_skill("games", "logical-deduction") == "Logical_Deduction"
    with pytest.raises(ValueError, match="choose from"):
        normalize_skill("games", "Data_Retrieval")
    with pytest.raises(ValueError, match="setting"):
        skills_for("chess")


COMMON = ["Environment Designer", "exactly one top-level class whose name ends in `Env`",
          "max_turns=12, **kwargs", "random.Random(seed)", "[0.0, 1.0]", "solution(self)",
          "Standard library only", "```python", "HINT:", "1-3 sentences"]


def test_games_system_prompt_states_the_contract():
    system, user = build_designer_messages("games", "Optimization", "doc")
    assert system["role"] == "system" and user["role"] == "user"
    text = system["content"]
    for piece in COMMON + ["reset(self, seed=None, options=None)", "(observation: str, info: dict)",
                           "terminated: bool, truncated: bool, info: dict", "\\boxed{<command>}",
                           "LAST `\\boxed{...}`", "partial credit", "never reach 1.0",
                           "`truncated=True`", "self.max_turns", '"\\\\boxed{...}"']:
        assert piece in text, piece
    assert "ToolEnv" not in text and "<tool_call>" not in text


def test_tooluse_system_prompt_states_the_toolenv_api():
    text = build_designer_messages("tooluse", "Error_Recovery", "doc")[0]["content"]
    for piece in COMMON + ["from spadekit.envs.tooluse import ToolEnv, ToolError",
                           "tool_<name>", "Args:", "setup(self, rng: random.Random) -> str",
                           "criteria(self) -> dict[str, bool]", "format_tool_call",
                           '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>',
                           "<answer>done</answer>", "raise ToolError", "Do not override reset"]:
        assert piece in text, piece
    assert "\\boxed" not in text


def test_max_turns_is_rendered():
    system, user = build_designer_messages("games", "Optimization", None, max_turns=20)
    assert "max_turns=20, **kwargs" in system["content"] and "max_turns=20" in user["content"]


@pytest.mark.parametrize("setting", ["games", "tooluse"])
def test_document_is_truncated_per_setting(setting):
    limit = DOC_WORDS[setting]
    doc = " ".join(f"w{i}" for i in range(limit + 500))
    user = build_designer_messages(setting, skills_for(setting)[0], doc)[1]["content"]
    assert f"w{limit - 1}" in user and f"w{limit} " not in user and f"w{limit}\n" not in user
    assert f"at most {limit} words" in user and "<document>" in user
    short = build_designer_messages(setting, skills_for(setting)[0], doc, doc_words=10)
    assert "w9\n</document>" in short[1]["content"] and "w10" not in short[1]["content"]
    assert limit == {"games": 6000, "tooluse": 4000}[setting]


def test_no_document():
    user = build_designer_messages("games", "Optimization", None)[1]["content"]
    assert "<document>" not in user and "No grounding document" in user
    assert build_designer_messages("games", "Optimization", "   ")[1]["content"] == user


def test_positive_and_negative_examples():
    code = source("games_code_breaker")
    program = EnvProgram(code="class AlphaEnv:\n    pass\n", meta={"win_rate": 0.5,
                                                                   "regret": 0.25})
    positive = [(code, 0.42, 0.3), program, {"code": "class BetaEnv:\n    pass\n"}]
    user = build_designer_messages("games", "Logical_Deduction", "text", positive,
                                   negative=("class TooEasyEnv:\n    pass\n", 0.97))[1]["content"]
    assert "DIFFERENT" in user
    assert "Reference 1 (win rate 0.42, hint regret 0.30)" in user
    assert "class CodeBreakerEnv" in user
    assert "Reference 2 (win rate 0.50, hint regret 0.25)" in user and "class AlphaEnv" in user
    assert "Reference 3:" in user and "class BetaEnv" in user
    assert "Avoid: too easy (win rate 0.97)" in user and "class TooEasyEnv" in user
    hard = build_designer_messages("games", "Logical_Deduction", "text",
                                   negative=("class HardEnv: pass", 0.02))[1]["content"]
    assert "Avoid: too hard (win rate 0.02)" in hard and "Reference" not in hard
    text = build_designer_messages("games", "Logical_Deduction", "t",
                                   negative=("class HardEnv: pass", "too hard (win rate 0.05)"))
    assert "Avoid: too hard (win rate 0.05)." in text[1]["content"]
    record = types.SimpleNamespace(code="class GammaEnv:\n    pass\n", win_rate=0.6, regret=None)
    shown = build_designer_messages("games", "Logical_Deduction", "t", [record])[1]["content"]
    assert "Reference 1 (win rate 0.60):" in shown and "class GammaEnv" in shown
    huge = build_designer_messages("games", "Logical_Deduction", "t", ["x = 1\n" * 5000])
    assert "# ... (cut)" in huge[1]["content"]


@pytest.mark.parametrize("setting", ["games", "tooluse"])
def test_hint_prompt(setting):
    code = source("games_code_breaker" if setting == "games" else "tools_record_lookup")
    system, user = build_hint_messages(code, setting)
    assert "1-3 sentences" in system["content"] and "HINT:" in system["content"]
    assert "Never give the answer" in system["content"]
    assert code.strip() in user["content"] and f"Setting: {setting}" in user["content"]
    marker = "\\boxed{command}" if setting == "games" else "<tool_call>"
    assert marker in user["content"]
    retry = build_hint_messages(code, setting, previous="guess 1234", problem="leak")[1]
    assert "rejected (leak): 'guess 1234'" in retry["content"]


@pytest.mark.parametrize("text, expected", [
    ("HINT: Track which candidates survive each clue.",
     "Track which candidates survive each clue."),
    ("**Hint:** Keep a map of walls. Avoid dead ends. Plan ahead. Then win big.",
     "Keep a map of walls. Avoid dead ends. Plan ahead."),
    ("<think>let me see</think>\nHint: Probe small moduli first, then combine them.",
     "Probe small moduli first, then combine them."),
    ("Here is my hint.\n\nHINT: \"Test one switch at a time.\"", "Test one switch at a time."),
    ("  Compare the per-item value   ratios\n before packing.  ",
     "Compare the per-item value ratios before packing."),
    ("HINT: Read every page of results.\n\n```python\nprint(1)\n```",
     "Read every page of results."),
])
def test_parse_hint_accepts(text, expected):
    assert parse_hint(text) == expected


@pytest.mark.parametrize("text", [
    None, "", "   ", "HINT:", "I'm sorry, but I can't help with that.",
    "I cannot provide a hint.", "As an AI, I must decline.", "Hint: none", "ok",
    "\x8f\x12}{%$#@!&*()_+=-[]\\|;:'\",.<>/?`~ \x01\x02", "word " * 200,
    "```python\nclass XEnv: pass\n```", "def solve(self): return self.secret",
])
def test_parse_hint_rejects(text):
    assert parse_hint(text) is None


def test_hint_leaks_games():
    actions = ["\\boxed{mod 11}", "\\boxed{mod 9}", "\\boxed{guess 4321}"]
    assert hint_leaks("Start with \\boxed{mod 11} to narrow things.", actions)
    assert hint_leaks("The answer is GUESS   4321.", actions)
    assert hint_leaks("Ask MOD 9 early.", actions)
    assert not hint_leaks("Ask for remainders modulo coprime numbers, then combine them.", actions)
    assert not hint_leaks("Try mod 111 as well.", actions)  # whole tokens only
    assert not hint_leaks("", actions) and not hint_leaks(None, actions)
    assert not hint_leaks("go up", ["\\boxed{up}"])  # shorter than 3 characters
    assert leaked_fragments("use mod 9 and mod 11", actions) == ["mod 11", "mod 9"]


def test_hint_leaks_tool_arguments():
    actions = [format_tool_call("search", {"department": "Finance", "page": 1}),
               format_tool_call("get", {"employee_id": "E123"})
               + format_tool_call("set", {"ids": ["SKU-77", "SKU-9"], "qty": 250}),
               format_tool_call("submit", {"employee_id": "E123"}) + "<answer>done</answer>"]
    assert hint_leaks("Submit e123 at the end.", actions)
    assert hint_leaks("Filter by the finance department.", actions)
    assert hint_leaks("Restock sku-77 first.", actions)
    assert hint_leaks("Order 250 units.", actions)
    assert not hint_leaks("Use the search tool with both filters, then submit.", actions)
    assert not hint_leaks("Look at page 1 first.", actions)  # "1" is too short
    assert not hint_leaks("E1234 is a different id.", actions)


def _exec_class(name: str) -> type:
    module = types.ModuleType(f"lib_{name}")
    exec(compile(source(name), f"{name}.py", "exec"), module.__dict__)
    return next(obj for key, obj in vars(module).items() if isinstance(obj, type)
                and key.endswith("Env") and obj.__module__ == module.__name__)


@pytest.mark.parametrize("entry", list_library(), ids=lambda e: e.name)
def test_library_hints_do_not_leak(entry):
    env = _exec_class(entry.name)(max_turns=12)
    actions = []
    for seed in (0, 1, 2):
        env.reset(seed=seed)
        actions += env.solution()
    assert actions and not hint_leaks(entry.hint, actions)
    assert parse_hint("HINT: " + entry.hint) == " ".join(entry.hint.split())
