"""Tests for spadekit.envs.program: EnvProgram records, code normalisation, find_env_classes."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from spadekit.envs.extract import ExtractionError
from spadekit.envs.program import (
    DOMAINS,
    EnvProgram,
    FrozenDict,
    ProgramSyntaxError,
    find_env_classes,
    normalize_code,
)

GUESS = '''\
import random


class GuessEnv:
    max_turns = 8

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, 100)
        return "Guess a number between 1 and 100.", {}

    def step(self, action: str):
        try:
            guess = int(action.strip())
        except ValueError:
            return "Please answer with an integer.", -0.1, False, False, {}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        hint = "higher" if guess < self.secret else "lower"
        return f"Wrong, go {hint}.", 0.0, False, False, {}
'''


# ---------------------------------------------------------------------------------------------
# normalisation and identity
# ---------------------------------------------------------------------------------------------


def test_normalize_code_rules():
    assert normalize_code("a = 1  \r\nb = 2\t\r\n\r\n\r\n") == "a = 1\nb = 2\n"
    assert normalize_code("a = 1\rb = 2") == "a = 1\nb = 2\n"
    assert normalize_code("\ufeffx = 1\n") == "x = 1\n"
    assert normalize_code("\n\n    x = 1\n") == "\n\n    x = 1\n"  # leading lines/indent kept
    assert normalize_code("") == ""
    assert normalize_code(" \n\t\n") == ""
    with pytest.raises(TypeError):
        normalize_code(b"x = 1")  # type: ignore[arg-type]


def test_sha256_stable_under_cosmetic_changes():
    base = EnvProgram(GUESS)
    crlf = EnvProgram(GUESS.replace("\n", "\r\n"))
    trailing_ws = EnvProgram("\n".join(line + "   " for line in GUESS.split("\n")))
    trailing_blank = EnvProgram(GUESS + "\n\n\n   \n")
    no_final_newline = EnvProgram(GUESS.rstrip("\n"))
    bom = EnvProgram("\ufeff" + GUESS)
    for other in (crlf, trailing_ws, trailing_blank, no_final_newline, bom):
        assert other.sha256 == base.sha256
        assert other.short_id == base.short_id
    # hint and provenance are not part of the program's identity
    assert base.with_hint("binary search").sha256 == base.sha256
    assert EnvProgram(GUESS, source="library:guess", domain="games").sha256 == base.sha256


def test_sha256_changes_for_real_changes():
    base = EnvProgram(GUESS)
    assert EnvProgram(GUESS.replace("randint(1, 100)", "randint(1, 50)")).sha256 != base.sha256
    # indentation is semantic in Python
    assert EnvProgram(GUESS.replace("        return \"Correct", "         return \"Correct")).sha256 != base.sha256
    # leading whitespace change inside a line
    assert EnvProgram(GUESS.replace("max_turns = 8", "max_turns  = 8")).sha256 != base.sha256
    assert EnvProgram("\n" + GUESS).sha256 != base.sha256  # leading blank lines are kept


def test_sha256_format_and_short_id():
    program = EnvProgram(GUESS)
    assert len(program.sha256) == 64
    assert all(c in "0123456789abcdef" for c in program.sha256)
    assert program.short_id == program.sha256[:12]
    assert program.normalized_code == normalize_code(GUESS)
    # cached value does not leak into equality / repr
    assert program == EnvProgram(GUESS)
    assert "_sha256" not in repr(program)


# ---------------------------------------------------------------------------------------------
# fields, validation
# ---------------------------------------------------------------------------------------------


def test_defaults_and_frozen():
    program = EnvProgram(GUESS)
    assert program.hint is None and program.skill is None and program.domain is None
    assert program.source is None and program.class_name is None
    assert dict(program.meta) == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        program.code = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"code": None}, TypeError),
        ({"code": b"class AEnv: pass"}, TypeError),
        ({"code": ""}, ValueError),
        ({"code": "  \n\t\n"}, ValueError),
        ({"code": GUESS, "hint": 3}, TypeError),
        ({"code": GUESS, "skill": ["x"]}, TypeError),
        ({"code": GUESS, "source": 1.5}, TypeError),
        ({"code": GUESS, "domain": "puzzles"}, ValueError),
        ({"code": GUESS, "domain": "Games"}, ValueError),
        ({"code": GUESS, "domain": 1}, TypeError),
        ({"code": GUESS, "class_name": "Guess Env"}, ValueError),
        ({"code": GUESS, "class_name": 7}, TypeError),
        ({"code": GUESS, "meta": [("a", 1)]}, TypeError),
        ({"code": GUESS, "meta": {1: "x"}}, TypeError),
        ({"code": GUESS, "meta": {"when": object()}}, TypeError),
        ({"code": GUESS, "meta": {"nested": {"bad": {2, 3}}}}, TypeError),
        ({"code": GUESS, "meta": {"score": float("nan")}}, ValueError),
    ],
)
def test_validation_errors(kwargs, error):
    with pytest.raises(error) as info:
        EnvProgram(**kwargs)
    assert "EnvProgram" in str(info.value)


def test_valid_domains():
    assert DOMAINS == {"games", "tooluse"}
    for domain in (None, "games", "tooluse"):
        assert EnvProgram(GUESS, domain=domain).domain == domain


def test_meta_is_deep_frozen_and_copied():
    source = {"round": 3, "tags": ["easy", "numbers"], "stats": {"pass_rate": 0.5, "n": [1, 2]}}
    program = EnvProgram(GUESS, meta=source)
    source["round"] = 99
    source["tags"].append("mutated")
    assert program.meta["round"] == 3
    assert program.meta["tags"] == ("easy", "numbers")
    assert isinstance(program.meta, FrozenDict)
    assert isinstance(program.meta["stats"], FrozenDict)
    with pytest.raises(TypeError):
        program.meta["round"] = 4  # type: ignore[index]
    with pytest.raises(AttributeError):
        program.meta._data = {}  # type: ignore[misc]
    assert program.meta == {"round": 3, "tags": ("easy", "numbers"),
                            "stats": {"pass_rate": 0.5, "n": (1, 2)}}


def test_hashable_picklable_copyable():
    a = EnvProgram(GUESS, hint="h", meta={"k": [1, {"x": None}]})
    b = EnvProgram(GUESS, hint="h", meta={"k": (1, {"x": None})})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, a.with_hint("other")}) == 2
    assert pickle.loads(pickle.dumps(a)) == a
    assert copy.deepcopy(a) == a
    assert pickle.loads(pickle.dumps(a)).sha256 == a.sha256
    assert EnvProgram(GUESS, meta={"k": 1}) != EnvProgram(GUESS, meta={"k": 2})
    # verbatim code equality, shared identity
    crlf = EnvProgram(GUESS.replace("\n", "\r\n"))
    assert crlf != EnvProgram(GUESS) and crlf.sha256 == EnvProgram(GUESS).sha256


def test_with_hint_returns_copy():
    program = EnvProgram(GUESS, skill="search", domain="games", source="library:guess",
                         class_name="GuessEnv", meta={"a": 1})
    hinted = program.with_hint("Binary search halves the range each turn.")
    assert hinted is not program
    assert program.hint is None
    assert hinted.hint == "Binary search halves the range each turn."
    assert (hinted.code, hinted.skill, hinted.domain, hinted.source, hinted.class_name) == (
        program.code, program.skill, program.domain, program.source, program.class_name)
    assert hinted.meta == program.meta
    assert hinted.with_hint(None) == program
    with pytest.raises(TypeError):
        program.with_hint(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# serialisation
# ---------------------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip_through_json():
    program = EnvProgram(
        GUESS,
        hint="Use binary search.",
        skill="search",
        domain="games",
        source="designer:run-7/step-120",
        class_name="GuessEnv",
        meta={"round": 2, "scores": [0.5, 1.0], "judge": {"ok": True, "notes": None}},
    )
    data = program.to_dict()
    assert data["sha256"] == program.sha256 and data["short_id"] == program.short_id
    assert data["meta"] == {"round": 2, "scores": [0.5, 1.0], "judge": {"ok": True, "notes": None}}
    text = json.dumps(data)
    back = EnvProgram.from_dict(json.loads(text))
    assert back == program
    assert back.sha256 == program.sha256
    assert back.to_dict() == data


def test_from_dict_minimal_and_null_meta():
    assert EnvProgram.from_dict({"code": GUESS}) == EnvProgram(GUESS)
    assert EnvProgram.from_dict({"code": GUESS, "meta": None}).meta == {}


def test_from_dict_errors():
    with pytest.raises(TypeError):
        EnvProgram.from_dict([("code", GUESS)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="code"):
        EnvProgram.from_dict({"hint": "x"})
    with pytest.raises(ValueError, match="unknown"):
        EnvProgram.from_dict({"code": GUESS, "hnit": "typo"})
    data = EnvProgram(GUESS).to_dict()
    data["code"] = data["code"].replace("100", "1000")
    with pytest.raises(ValueError, match="sha256"):
        EnvProgram.from_dict(data)
    with pytest.raises(ValueError):
        EnvProgram.from_dict({"code": GUESS, "domain": "chess"})


# ---------------------------------------------------------------------------------------------
# find_env_classes
# ---------------------------------------------------------------------------------------------


def test_find_env_classes_top_level_only():
    code = '''
from spadekit.envs.tooluse import ToolEnv
import gymnasium as gym
from somewhere import OtherEnv as AliasEnv

class Helper:
    class InnerEnv:
        pass

class CalcEnv(ToolEnv):
    def reset(self, seed=None, options=None):
        class LocalEnv: pass
        return "", {}

if True:
    class ConditionalEnv: pass

class Environment: pass
'''
    assert find_env_classes(code) == ["CalcEnv"]
    assert find_env_classes(GUESS) == ["GuessEnv"]
    assert find_env_classes("import os\n") == []
    assert find_env_classes("class AEnv: pass\nclass BEnv(AEnv): pass\n") == ["AEnv", "BEnv"]
    assert find_env_classes("class Env: pass\n") == ["Env"]


def test_find_env_classes_syntax_error_is_typed():
    with pytest.raises(ProgramSyntaxError) as info:
        find_env_classes("import random\n\nclass BrokenEnv:\n    def reset(self:\n        pass\n")
    err = info.value
    assert isinstance(err, ExtractionError) and isinstance(err, ValueError)
    assert isinstance(err, SyntaxError)
    assert err.reason == "syntax_error"
    assert err.lineno == 4
    assert "does not parse" in str(err)
    assert isinstance(err.__cause__, SyntaxError)
    clone = pickle.loads(pickle.dumps(err))
    assert clone.reason == "syntax_error" and clone.lineno == 4


def test_find_env_classes_rejects_non_str_and_null_bytes():
    with pytest.raises(TypeError):
        find_env_classes(None)  # type: ignore[arg-type]
    with pytest.raises(ProgramSyntaxError):
        find_env_classes("class AEnv: pass\n\x00")


def test_parsing_is_serialised_and_retried():
    import ast
    import threading

    from spadekit.envs import pyparse

    calls = {"n": 0}
    real = ast.parse

    def flaky(source, filename="<unknown>", mode="exec"):
        calls["n"] += 1
        if calls["n"] == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=21, after=15)")
        return real(source, filename=filename, mode=mode)

    ast.parse = flaky
    try:
        assert isinstance(pyparse.parse("x = 1"), ast.Module) and calls["n"] == 2
    finally:
        ast.parse = real
    assert not pyparse._LOCK.locked()
    results = []
    threads = [threading.Thread(target=lambda: results.append(pyparse.parse("def f():\n  return 1")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
