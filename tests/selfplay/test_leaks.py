"""The hint leak check (issues 22 and 25): literal needles, the empirical probe in the real
sandbox, the design phase's counts, and the scans' robustness on hostile input.

Fixtures are real programs under ``tests/data/leaks/``, each with a ``solution()`` that wins.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.common.streams import RoundStreams
from spadekit.envs.actions import format_tool_call
from spadekit.envs.library import list_library, source
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.pool import SandboxPool
from spadekit.selfplay.generate import solution_actions
from spadekit.selfplay.leak_probe import empirical_leak, hint_candidates
from spadekit.selfplay.leaks import (SolutionTrace, boxed_contents, leaked_fragments, number_words,
                                     numbers_in, program_constants, tokens)
from spadekit.selfplay.prompts import hint_leaks, leaked_fragments as reexported

DATA = Path(__file__).resolve().parents[1] / "data" / "leaks"

LEAKS = {  # fixture -> (hints that give the answer away, the check that must catch them)
    "password": (["The magic word that opens the door is xyzzy.", "Say XYZZY to the mouth."],
                 "literal"),
    "answer42": (["Always answer 42.", "The number is forty-two.", "Guess 42, nothing else."],
                 "literal"),
    "obfuscated": (["The code is x-y-z-z-y.", "Type X Y Z Z Y on the pad.",
                    "The code reads x.y.z.z.y from left to right."], "literal"),
    "multistep": (["Press blue, then red, then yellow.", "Go blue, red and then yellow."],
                  "literal"),
    "shown": (["Green is the colour that opens the chest."], "empirical"),
}
HONEST = {  # fixture -> strategy hints that must pass both checks
    "password": ["Classic text adventures had a famous magic word; the door wants one of those."],
    "answer42": ["Halve the range with every guess: start in the middle and follow higher or "
                 "lower.", "There are 100 numbers; 17 and 7.5 are far from it."],
    "obfuscated": ["The most worn keys are in the code; inspect them first and try the words "
                   "they can spell."],
    "multistep": ["The order is fixed; a wrong press sends you back to the start, so keep what "
                  "worked. Blue matters."],
    "shown": ["Only one colour works and it never changes; the shuffled order does not matter."],
    "doors": ["There are 3 doors; knock on each before opening one.",
              "Knock first: the prize door chimes, and door 1 is not always it."],
}


def code(name: str) -> str:
    return (DATA / f"{name}.py").read_text()


def mute(name: str) -> str:
    """The fixture without its ``solution()`` (and with another class name)."""
    text = code(name)
    text = text[:text.index("    def solution(self):")].rstrip() + "\n"
    return re.sub(r"class (\w+)Env", r"class Mute\1Env", text)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(warm=1) as p:
        yield p


@pytest.fixture(scope="module")
def traces(pool):
    return {name: solution_actions(pool, code(name), 12) for name in set(LEAKS) | set(HONEST)}


# -- the fixtures on the real sandbox ----------------------------------------------------------


def test_solution_trace_holds_seeds_observations_and_constants(traces):
    trace = traces["multistep"]
    assert isinstance(trace, SolutionTrace) and len(trace.per_seed) == 3
    assert list(trace) == ["\\boxed{blue}", "\\boxed{red}", "\\boxed{yellow}"] * 3
    assert "four buttons" in trace.observations[0] and "green" in trace.constants
    assert traces["doors"].per_seed == [["\\boxed{knock 1}", "\\boxed{open 1}"],
                                        ["\\boxed{knock 2}", "\\boxed{open 2}"],
                                        ["\\boxed{knock 3}", "\\boxed{open 3}"]]


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_leaking_hints_are_caught_on_real_solution_actions(name, pool, traces):
    hints, check = LEAKS[name]
    for hint in hints:
        literal = leaked_fragments(hint, traces[name])
        assert bool(literal) == (check == "literal"), (hint, literal)
        if check == "empirical":
            won = empirical_leak(pool, code(name), hint, solution=traces[name])
            assert won and won[-1].lower() == "\\boxed{green}", (hint, won)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_strategy_hints_pass_both_checks(name, pool, traces):
    for hint in HONEST[name]:
        assert leaked_fragments(hint, traces[name]) == [], hint
        assert empirical_leak(pool, code(name), hint, solution=traces[name]) is None, hint


def test_the_leaks_say_what_gave_them_away(traces):
    assert leaked_fragments("Always answer 42.", traces["answer42"]) == ["42"]
    assert leaked_fragments("The code is x-y-z-z-y.", traces["obfuscated"]) == ["xyzzy"]
    assert leaked_fragments("Press blue, then red, then yellow.", traces["multistep"]) == \
        ["blue -> red -> yellow"]


def test_a_program_without_a_solution_is_caught_by_playing_the_hint(pool):
    """The audit's hole: no ``solution()``, nothing to compare; the probe still plays."""
    program = mute("password")
    assert solution_actions(pool, program, 12) is None
    hint = "The magic word that opens the door is xyzzy."
    assert leaked_fragments(hint, None) == []
    assert empirical_leak(pool, program, hint) == ["\\boxed{xyzzy}"]
    assert empirical_leak(pool, mute("obfuscated"), "The code is x-y-z-z-y.") is None  # no verb
    assert empirical_leak(pool, program, "Say the classic magic word.") is None


@pytest.mark.parametrize("entry", list_library(), ids=lambda e: e.name)
def test_library_hints_pass_on_the_real_sandbox(entry, pool):
    program = source(entry.name)
    trace = solution_actions(pool, program, 12)
    assert trace and leaked_fragments(entry.hint, trace) == []
    assert empirical_leak(pool, program, entry.hint, setting=entry.setting, solution=trace,
                          budget_s=30) is None


# -- through the design phase ----------------------------------------------------------------

def _design(tmp_path: Path, pool, programs: list[str], hints: dict[str, str]):
    from spadekit.runs.store import RunStore
    from spadekit.sandbox.validate import Validator, ValidatorSettings
    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.design import DesignPhase
    from spadekit.selfplay.memory import EnvironmentMemory

    cfg = load_config("cpu-tiny", overrides=[
        "model=tiny", "rounds=1", f"envs_per_round={len(programs)}", "bootstrap=null",
        "memory_seed_library=false", "dedup_threshold=1.01", "designer.max_new_tokens=8192",
        "rollout.max_turns=12", "tensorboard=false", "designer.hint_max_new_tokens=1024"])
    state = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: " + next(h for cls, h in hints.items() if f"class {cls}(" in text
                                   or f"class {cls}:" in text)
        program = programs[state["n"] % len(programs)]
        state["n"] += 1
        return f"```python\n{program}\n```\nHINT: none"

    with RunStore(tmp_path / "run", create=True) as store:
        memory = EnvironmentMemory(store, cap=cfg.memory_size,
                                   duplicate_threshold=cfg.dedup_threshold)
        # require_solution off: the mute password has no solution() (as an imported
        # reference program may not); its leak must still be found, by playing the hint
        phase = DesignPhase(cfg, ScriptedPolicy(tiny_tokenizer(), respond), pool,
                            Validator(pool, ValidatorSettings(max_turns=cfg.turn_cap,
                                                              require_solution=False),
                                      seed=0), store, memory, None)
        out = phase.run(0, RoundStreams(0, 0))
        pooled = {(store.get_hint(sha) or {}).get("hint") for sha in out.pooled}
    return out, pooled


CLASSES = {"password": "PasswordEnv", "answer42": "Answer42Env", "obfuscated": "VaultEnv",
           "multistep": "PanelEnv", "shown": "ColourEnv", "doors": "DoorsEnv"}


def test_design_phase_drops_leaking_hints_and_says_why(tmp_path, pool):
    names = sorted(LEAKS)
    programs = [code(n) for n in names] + [mute("password")]
    hints = {CLASSES[n]: LEAKS[n][0][0] for n in names}
    hints["MutePasswordEnv"] = "The magic word that opens the door is xyzzy."
    out, pooled = _design(tmp_path, pool, programs, hints)
    assert out.valid == len(programs), out.reasons
    assert out.hints["leaks"] == len(programs) and out.hints["ok"] == 0
    assert out.hints["leaks_literal"] == 4 and out.hints["leaks_empirical"] == 2
    assert out.hints["missing"] == len(programs) and pooled == {None}
    why = {d["hint"]: (d["reason"], d["evidence"]) for d in out.leak_details}
    assert why["Always answer 42."] == ("literal", ["42"])
    assert why["Green is the colour that opens the chest."] == ("empirical", ["\\boxed{Green}"])


def test_design_phase_keeps_honest_hints(tmp_path, pool):
    names = sorted(HONEST)
    hints = {CLASSES[n]: HONEST[n][0] for n in names}
    out, pooled = _design(tmp_path, pool, [code(n) for n in names], hints)
    assert out.valid == len(names), out.reasons
    assert out.hints["ok"] == len(names) and out.hints["leaks"] == 0 and not out.leak_details
    assert pooled == set(hints.values())


# -- the matchers ------------------------------------------------------------------------------


def test_numbers_are_whole_numeric_tokens():
    boxed7 = ["\\boxed{7}"]
    assert hint_leaks("Always answer 7.", boxed7) and hint_leaks("Answer seven!", boxed7)
    for hint in ("There are 17 doors.", "Scores like 7.5 are partial.", "Try x7 and 7x.",
                 "Room 70 is empty."):
        assert not hint_leaks(hint, boxed7), hint
    assert hint_leaks("Enter 4,321 on the pad.", ["\\boxed{4321}"])
    assert hint_leaks("The code is 4-3-2-1.", ["\\boxed{4321}"])
    assert not hint_leaks("Count 4 3 2 1 0 down.", ["\\boxed{4321}"])
    assert hint_leaks("It is forty-two.", ["\\boxed{42}"])
    assert not hint_leaks("Only one guess counts.", ["\\boxed{1}"])  # a lone "one" is a pronoun


def test_verbs_and_shown_words_are_not_needles():
    trace = SolutionTrace(["\\boxed{guess 4321}", "\\boxed{reveal}"],
                          per_seed=[["\\boxed{guess 4321}", "\\boxed{reveal}"]],
                          observations=["Commands: guess <n>, reveal."])
    assert leaked_fragments("Guess early, reveal late.", trace) == []
    assert leaked_fragments("Guess 4321.", trace) == ["guess 4321", "4321"]
    assert leaked_fragments("The answer is 4 3 2 1.", trace) == ["4321"]
    # without observations "reveal" is a command the hint spells out, as before
    assert leaked_fragments("Reveal late.", ["\\boxed{reveal}"]) == ["reveal"]


def test_short_arguments_count_only_when_every_seed_uses_them():
    varying = SolutionTrace(per_seed=[["\\boxed{open 1}"], ["\\boxed{open 2}"],
                                      ["\\boxed{open 3}"]])
    varying.extend(a for s in varying.per_seed for a in s)
    assert leaked_fragments("There are 3 doors; door 1 is not always it.", varying) == []
    fixed = SolutionTrace(per_seed=[["\\boxed{open 3}"]] * 3)
    fixed.extend(["\\boxed{open 3}"] * 3)
    assert leaked_fragments("It is always door 3.", fixed) == ["3"]


def test_constants_the_solution_uses_are_needles():
    # a short number in a command's arguments counts only as a constant (or on every seed)
    trace = SolutionTrace(["\\boxed{say 7 now}"], constants=[7, "zzz", 99])
    assert leaked_fragments("Whisper 7.", trace) == ["7"]
    assert leaked_fragments("Whisper 7.", SolutionTrace(["\\boxed{say 7 now}"])) == []
    assert leaked_fragments("Whisper zzz or 99.", trace) == []  # constants the solution skips
    assert program_constants("X = 'a'\nY = (1, [2.5, {'k': 'v'}])\nclass E:\n    Z = -3\n"
                             "    W = True\ndef f():\n    Q = 'inner'\n") == \
        ["a", 1, 2.5, "k", "v"]
    assert program_constants("def (:") == [] and program_constants(None) == []


def test_sequences_need_three_commands_in_order_and_close_together():
    steps = ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}"]
    maze = SolutionTrace(steps, per_seed=[steps], observations=["Move up, down, left or right."])
    assert leaked_fragments("Keep left.", steps) == ["left"]  # not shown: a command, as before
    assert leaked_fragments("Keep left.", maze) == []
    assert leaked_fragments("Go up, then left, then down.", maze) == ["up -> left -> down"]
    assert leaked_fragments("Go LEFT, DOWN and RIGHT.", maze) == ["left -> down -> right"]
    assert leaked_fragments("Left or down, then up.", maze) == []  # order
    assert leaked_fragments("Up is hard. Walls are everywhere in this maze, so left is slow "
                            "and down too.", maze) == []  # too far apart


def test_tool_arguments_as_before_and_reexports():
    assert reexported is leaked_fragments
    actions = [format_tool_call("search", {"department": "Finance", "page": 1}),
               format_tool_call("set", {"ids": ["SKU-77"], "qty": 250})
               + "<answer>done</answer>"]
    assert leaked_fragments("Restock s k u 77 and order 250.", actions) == ["sku-77", "250"]
    assert leaked_fragments("Look at page 1 and say done.", actions) == []


def test_candidates_from_a_hint():
    singles, sequences = hint_candidates('Say "open sesame", then 42 or x-y-z; forty-two.',
                                         verbs=["enter"], max_turns=3)
    assert singles[:4] == ["\\boxed{Say}", "\\boxed{say}", "\\boxed{open sesame}",
                           "\\boxed{open}"]
    for value in ("42", "xyz", "sesame", "enter 42", "enter xyz"):
        assert f"\\boxed{{{value}}}" in singles, value
    assert "\\boxed{then}" not in singles and len(sequences) == 2
    assert all(len(s) == 3 for s in sequences)
    tool, _ = hint_candidates("Answer FIN-7 at the end.", "tooluse")
    assert "<answer>FIN-7</answer>" in tool and hint_candidates("", "games") == ([], [])


# -- robustness (issue 25) ---------------------------------------------------------------------


def _fast(fn, limit_s: float = 10.0):
    start = time.monotonic()
    value = fn()
    assert time.monotonic() - start < limit_s
    return value


def test_unclosed_boxes_are_scanned_once():
    action = "\\boxed{" * 120_000  # quadratic before: about 3 hours per seed in the trainer
    assert _fast(lambda: leaked_fragments("Say xyzzy.", [action] * 3)) == []
    deep = "\\boxed{" * 50_000 + "xyzzy" + "}" * 50_000  # past the length cap: nothing
    assert _fast(lambda: boxed_contents(deep)) == []
    nested = "\\boxed{" * 1000 + "xyzzy" + "}" * 1000
    found = _fast(lambda: boxed_contents(nested))
    assert len(found) == 32 and found[-1] == "xyzzy"  # capped, innermost kept
    assert _fast(lambda: hint_leaks("x " * 1500 + "xyzzy", ["{" * 5000 + "\\boxed{xyzzy}"]))


def test_hostile_tool_calls_do_not_raise():
    deep = '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 100_000 + "]" * 100_000 \
        + "}}</tool_call>"
    deep_ok = '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 900 + '"xyzzy"' \
        + "]" * 900 + "}}</tool_call>"
    huge = '<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>"
    many = '<tool_call>{"name": "f", "arguments": {"a": "b"}}' * 50_000
    for action in (deep, deep_ok, huge, many):
        assert _fast(lambda: leaked_fragments("Use xyzzy and bbb.", [action])) == []


def test_the_budget_ends_a_scan():
    actions = [f"\\boxed{{word{i} x{i}}}" for i in range(5000)]
    assert _fast(lambda: leaked_fragments("word1 x1", actions, budget_s=0.0), 2.0) == []
    assert leaked_fragments("word1 x1", actions) == ["word1 x1", "x1"]


def test_the_probe_survives_a_program_that_hangs_or_raises():
    hostile = code("password").replace(
        '        said = words[-1].strip().lower() if words else ""\n',
        '        said = words[-1].strip().lower() if words else ""\n'
        '        if said == "boom":\n            raise RuntimeError("boom")\n'
        '        while said == "loop":\n            pass\n')
    with SandboxPool(SandboxConfig(step_timeout=1.0), warm=0) as pool:
        assert empirical_leak(pool, hostile, "Boom, then xyzzy.") == ["\\boxed{xyzzy}"]
        assert _fast(lambda: empirical_leak(pool, hostile, "A loop before xyzzy."), 20) is None
        assert empirical_leak(pool, "class Broken(:", "xyzzy") is None
        assert empirical_leak(pool, hostile, "xyzzy", budget_s=0.0) is None


# -- properties --------------------------------------------------------------------------------


def _old_boxed(action: str) -> list[str]:
    """The old definition (every opening scanned to its balanced close), for small inputs."""
    out = []
    for match in re.finditer(r"\\boxed\s*\{", action):
        depth, i = 1, match.end()
        while i < len(action) and depth:
            depth += {"{": 1, "}": -1}.get(action[i], 0)
            i += 1
        if depth == 0:
            out.append(action[match.end():i - 1])
    return out


_PIECES = st.lists(st.sampled_from(["\\boxed{", "\\boxed {", "{", "}", "a", "b 7", " ", "\\"]),
                   max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(_PIECES)
def test_boxed_scan_equals_the_old_definition(action):
    assert boxed_contents(action) == _old_boxed(action)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.lists(st.text(max_size=120), max_size=5))
def test_scanners_never_raise(hint, actions):
    found = leaked_fragments(hint, actions)
    assert isinstance(found, list) and all(isinstance(f, str) for f in found)
    assert found == leaked_fragments(hint, actions)
    assert isinstance(numbers_in(hint), set) and isinstance(hint_candidates(hint)[0], list)
    assert all(t == t.lower() and t.isalnum() for t in tokens(hint))


_WORD = st.text(alphabet="bcdfghjklmnpqrstvwxz", min_size=3, max_size=10)


@settings(max_examples=200, deadline=None)
@given(_WORD, st.sampled_from(["", "-", " ", ".", " - ", "_"]), st.booleans())
def test_any_spelling_of_an_answer_leaks(word, sep, upper):
    spelled = sep.join(word.upper() if upper else word)
    assert leaked_fragments(f"The word is {spelled}, promise.", [f"\\boxed{{{word}}}"]) == [word]
    assert leaked_fragments(f"The word is {word}s{word}.", [f"\\boxed{{{word}}}"]) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10_000, max_value=10_000))
def test_numbers_match_whole(n):
    box = [f"\\boxed{{{n}}}"]
    assert hint_leaks(f"Answer {n} now.", box)
    assert not hint_leaks(f"Answer {n}7 now.", box) and not hint_leaks(f"Answer {n}.5 now.", box)
    assert numbers_in(f"x{abs(n)}") == set() and numbers_in(f"({n})") == {str(n)}


_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen " \
         "fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def _spell(n: int) -> str:
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10 - 2] + ("" if n % 10 == 0 else "-" + _UNITS[n % 10])
    rest = n % 100
    return _UNITS[n // 100] + " hundred" + ("" if rest == 0 else " and " + _spell(rest))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=2, max_value=999))
def test_number_words_read_back(n):
    assert number_words(tokens(f"say {_spell(n)} please")) == {str(n)}
