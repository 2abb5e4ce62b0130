"""Unit tests for spadekit.envs.tooluse.ToolEnv."""

from __future__ import annotations

import json
import random
from typing import Literal, Optional

import pytest

from spadekit.envs.actions import format_tool_call
from spadekit.envs.tooluse import ToolEnv, ToolError, python_type_schema

ANSWER = "<answer>done</answer>"


class CounterEnv(ToolEnv):
    """Reach a hidden target with add(); a demo of every feature."""

    def setup(self, rng: random.Random) -> str:
        self.state = {"target": rng.randint(5, 50), "value": 0, "log": []}
        return "Make the counter equal the hidden target, then submit."

    def criteria(self) -> dict[str, bool]:
        value = self.state["value"]
        return {"touched": value != 0, "on_target": value == self.state["target"]}

    def solution(self) -> list[str]:
        return [format_tool_call("add", {"amount": self.state["target"]}), ANSWER]

    def tool_add(self, amount: int, note: Optional[str] = None) -> dict:
        """Add to the counter.

        Longer explanation that is not part of the description.

        Args:
            amount (int): How much to add;
                may be negative.
            note: Free text kept in the log.

        Returns:
            The new value.
        """
        if amount == 0:
            raise ToolError("amount must be non-zero")
        self.state["value"] += amount
        self.state["log"].append(note)
        return {"value": self.state["value"]}

    def tool_peek(self) -> int:
        """Distance to the target (absolute)."""
        return abs(self.state["target"] - self.state["value"])

    def tool_crash(self, ratio: float) -> float:
        """A buggy tool."""
        return 1 / 0

    def tool_mixed(self, flag: bool, mode: Literal["fast", "slow"], tags: list[str],
                   scale: float = 1.0, meta: dict | None = None, anything=None,
                   ids: list[int] | None = None) -> str:
        """Exercise schema types.

        Args:
            flag: A boolean.
            mode: Speed mode.
        """
        return f"{flag}-{mode}-{tags}-{scale}-{meta}-{ids}"


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


@pytest.fixture()
def env() -> CounterEnv:
    e = CounterEnv(max_turns=4)
    e.reset(seed=1)
    return e


def results(info: dict) -> list[dict]:
    return info["tool_results"]


# ----- schemas ---------------------------------------------------------------------------------
def test_type_schemas():
    assert python_type_schema(str) == {"type": "string"}
    assert python_type_schema(int) == {"type": "integer"}
    assert python_type_schema(float) == {"type": "number"}
    assert python_type_schema(bool) == {"type": "boolean"}
    assert python_type_schema(dict) == {"type": "object"}
    assert python_type_schema(list) == {"type": "array"}
    assert python_type_schema(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert python_type_schema(Optional[int]) == {"type": ["integer", "null"]}
    assert python_type_schema(int | str) == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert python_type_schema(Literal["a", "b"]) == {"enum": ["a", "b"]}
    assert python_type_schema(dict[str, int]) == {"type": "object"}
    assert python_type_schema(object) == {}


def test_tools_schema_derivation(env):
    schemas = {s["function"]["name"]: s for s in env.tools()}
    assert sorted(schemas) == ["add", "crash", "mixed", "peek"]
    add = schemas["add"]
    assert add["type"] == "function"
    fn = add["function"]
    assert fn["description"] == "Add to the counter."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "description": "How much to add; may be negative."},
            "note": {"type": ["string", "null"], "description": "Free text kept in the log."},
        },
        "required": ["amount"],
    }
    no_params = {"type": "object", "properties": {}, "required": []}
    assert schemas["peek"]["function"]["parameters"] == no_params
    mixed = schemas["mixed"]["function"]["parameters"]
    assert mixed["required"] == ["flag", "mode", "tags"]
    props = mixed["properties"]
    assert props["flag"] == {"type": "boolean", "description": "A boolean."}
    assert props["mode"] == {"enum": ["fast", "slow"], "description": "Speed mode."}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scale"] == {"type": "number"}
    assert props["meta"] == {"type": ["object", "null"]}
    assert props["anything"] == {}
    assert props["ids"] == {"type": ["array", "null"], "items": {"type": "integer"}}
    json.dumps(env.tools())


def test_reset_lists_tools_and_is_seeded():
    env = CounterEnv()
    obs, info = env.reset(seed=5)
    assert obs.startswith("Make the counter")
    assert "- add(amount: integer, note: string|null): Add to the counter." in obs
    assert "<answer>done</answer>" in obs and "<tool_call>" in obs
    assert info["tools"] == env.tools()
    target = env.state["target"]
    env.reset(seed=5)
    assert env.state["target"] == target and env.max_turns == 12
    env.reset()  # seed=None draws a fresh instance without error
    assert 5 <= env.state["target"] <= 50


# ----- stepping --------------------------------------------------------------------------------
def test_solution_scores_one(env):
    obs, reward, terminated, truncated, info = env.step(env.solution()[0])
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert json.loads(obs) == {"tool": "add", "result": {"value": env.state["target"]}}
    obs, reward, terminated, truncated, info = env.step("All set. " + ANSWER)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["criteria"] == {"touched": True, "on_target": True}
    assert "2/2 checks" in obs


def test_answer_scores_fraction_of_criteria(env):
    assert env.step(ANSWER)[1:4] == (0.0, True, False)
    env.reset(seed=1)
    wrong = env.state["target"] + 1
    _, reward, terminated, _, info = env.step(call("add", amount=wrong) + ANSWER)  # calls run first
    assert reward == 0.5 and terminated
    assert info["criteria"] == {"touched": True, "on_target": False}


def test_multiple_calls_per_turn_run_in_order(env):
    action = call("add", amount=3) + " then " + call("add", amount=4) + call("peek")
    obs, *_, info = env.step(action)
    assert [r["tool"] for r in results(info)] == ["add", "add", "peek"]
    assert results(info)[1]["result"] == {"value": 7}
    assert results(info)[2]["result"] == abs(env.state["target"] - 7)
    assert len(obs.splitlines()) == 3


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (call("nope"), "unknown tool 'nope'; available: add, crash, mixed, peek"),
        (call("add"), "missing required argument(s): amount"),
        (call("add", amount=1, bogus=2), "unexpected argument(s): bogus"),
        (call("add", amount="3"), "argument 'amount' must be of type integer"),
        (call("add", amount=1.5), "argument 'amount' must be of type integer"),
        (call("add", amount=True), "argument 'amount' must be of type integer"),
        (call("add", amount=1, note=7), "argument 'note' must be of type string|null"),
        (call("mixed", flag=1, mode="fast", tags=[]), "argument 'flag' must be of type boolean"),
        (call("mixed", flag=True, mode="slowest", tags=[]), "'mode' must be of type one of fast/"),
        (call("mixed", flag=True, mode="fast", tags=["a", 2]), "'tags' must be of type array"),
        (call("mixed", flag=True, mode="fast", tags="a"), "argument 'tags' must be of type array"),
        (call("mixed", flag=True, mode="fast", tags=[], meta=[1]), "argument 'meta'"),
        (call("add", amount=0), "amount must be non-zero"),
        (call("crash", ratio=1), "internal error: ZeroDivisionError"),
    ],
)
def test_argument_and_tool_errors_are_reported(env, action, error):
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    record = results(info)[0]
    assert set(record) == {"tool", "error"} and error in record["error"]
    assert json.loads(obs) == record
    assert env.state["value"] == 0


def test_lossless_coercions(env):
    mixed = call("mixed", flag=False, mode="slow", tags=["x"], scale=2, meta=None, anything=[1],
                 ids=[1, 2.0])
    _, *_, info = env.step(call("add", amount=4.0) + mixed)
    assert results(info)[0]["result"] == {"value": 4}
    assert results(info)[1]["result"] == "False-slow-['x']-2.0-None-[1, 2]"


def test_malformed_calls_and_format_errors(env):
    obs, reward, terminated, truncated, info = env.step("<tool_call>{oops}</tool_call>")
    assert "malformed tool call" in obs and not terminated and info["parse_errors"]
    obs, *_ = env.step("I will think about it.")
    assert obs.startswith("Format error") and "<answer>done</answer>" in obs
    bad = '<tool_call>{"name": "add", "arguments": [2]}</tool_call>'
    obs, *_, info = env.step(call("add", amount=2) + bad)
    assert env.state["value"] == 2 and "must be a JSON object" in obs


def test_non_string_and_huge_actions(env):
    assert env.step(None)[0].startswith("Format error")  # type: ignore[arg-type]
    obs, reward, *_ = env.step("x" * 200_000)
    assert reward == 0.0 and obs.startswith("Format error")


def test_too_many_calls_per_turn(env):
    obs, *_, info = env.step(call("add", amount=1) * (ToolEnv.max_calls_per_turn + 3))
    assert env.state["value"] == ToolEnv.max_calls_per_turn
    assert len(results(info)) == ToolEnv.max_calls_per_turn
    assert "too many calls in one turn (max 16); the rest were not run" in obs.splitlines()[-1]
    obs, *_ = env.step(call("peek") * 100_000)  # huge turns stay cheap and short
    assert len(obs.splitlines()) == ToolEnv.max_calls_per_turn + 1


def test_long_results_are_cut():
    class Big(CounterEnv):
        def tool_dump(self) -> str:
            """Huge output."""
            return "y" * 10_000

    env = Big()
    env.reset(seed=0)
    obs, *_ = env.step(call("dump"))
    assert len(obs) < Big.max_result_chars + 20 and obs.endswith("...(cut)")


def test_truncation_and_after_end(env):
    for turn in range(1, 5):
        obs, reward, terminated, truncated, _ = env.step(call("peek"))
        assert reward == 0.0 and not terminated
        assert truncated == (turn == 4)
    assert "Turn limit" in obs
    obs, reward, terminated, truncated, _ = env.step(ANSWER)
    assert terminated and reward == 0.0 and "over" in obs


def test_step_before_reset_does_not_crash():
    obs, reward, terminated, truncated, _ = CounterEnv().step(ANSWER)
    assert terminated and reward == 0.0


def test_deterministic_replay():
    runs = []
    for _ in range(2):
        env = CounterEnv()
        env.reset(seed=42)
        actions = (call("peek"), call("add", amount=3), call("peek"), ANSWER)
        runs.append([env.step(a)[:4] for a in actions])
    assert runs[0] == runs[1]


def test_base_class_requires_overrides():
    env = ToolEnv()
    with pytest.raises(NotImplementedError):
        env.reset(seed=0)
    assert env.tools() == []
    with pytest.raises(NotImplementedError):
        env.solution()


def test_unresolvable_annotation_is_untyped():
    class Odd(CounterEnv):
        def tool_odd(self, x: "NoSuchType") -> str:  # noqa: F821
            """Odd annotation."""
            return repr(x)

    env = Odd()
    env.reset(seed=0)
    schema = {s["function"]["name"]: s for s in env.tools()}["odd"]["function"]["parameters"]
    assert schema["properties"]["x"] == {} and schema["required"] == ["x"]
    assert results(env.step(call("odd", x=[1]))[4])[0]["result"] == "[1]"
