"""The bfcl-mt suite on real BFCL v4 data: real checker, real simulated APIs, scripted replies."""

from __future__ import annotations

import json
import math
import sys

import pytest

pytest.importorskip("bfcl_eval")

from spadekit.envs.actions import format_tool_call  # noqa: E402
from spadekit.eval.base import EvalError, EvalItem  # noqa: E402
from spadekit.eval import bfcl as bfcl_mod  # noqa: E402
from spadekit.eval.bfcl import (CATEGORIES, DONE_REPLY, BFCLEnv,  # noqa: E402
                                BFCLMultiTurnSuite)
from spadekit.eval.bfcl_tools import (CallError, encode_call, parse_call,  # noqa: E402
                                      to_json_schema)
from spadekit.sandbox.worker import check_reset, check_step  # noqa: E402

OBS_CAP = 65536
PER_CATEGORY = 5


@pytest.fixture(scope="module")
def suite() -> BFCLMultiTurnSuite:
    return BFCLMultiTurnSuite()


@pytest.fixture(scope="module")
def items(suite: BFCLMultiTurnSuite) -> dict[str, list[EvalItem]]:
    found: dict[str, list[EvalItem]] = {c: [] for c in CATEGORIES}
    for item in suite.load_items(PER_CATEGORY):
        found[item.group].append(item)
    return found


@pytest.fixture(scope="module")
def all_items(suite: BFCLMultiTurnSuite) -> dict[str, EvalItem]:
    return {item.id: item for item in suite.load_items()}


def play(env: BFCLEnv, replies: list[str]) -> tuple[float, bool, bool, dict, list[str]]:
    """Reset and step through ``replies`` (contract-checked); stop at the end of the episode."""
    value, err = check_reset(env.reset(seed=0), OBS_CAP)
    assert err is None, err
    observations = [value[0]]
    reward, terminated, truncated, info = 0.0, False, False, value[1]
    for reply in replies:
        value, err = check_step(env.step(reply), OBS_CAP)
        assert err is None, err
        obs, reward, terminated, truncated, info = value
        observations.append(obs)
        if terminated or truncated:
            break
        assert reward == 0.0
    return reward, terminated, truncated, info, observations


def walk_types(schema: dict) -> list[str]:
    found = [schema["type"]] if "type" in schema else []
    for sub in (schema.get("properties") or {}).values():
        found += walk_types(sub)
    if isinstance(schema.get("items"), dict):
        found += walk_types(schema["items"])
    return found


# -- suite construction and items ------------------------------------------------------------

def test_unknown_category_raises() -> None:
    with pytest.raises(EvalError, match="unknown"):
        BFCLMultiTurnSuite(["base", "parallel"])
    with pytest.raises(EvalError):
        BFCLMultiTurnSuite([])


def test_missing_package_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    bfcl_mod._bfcl.cache_clear()
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # makes `import bfcl_eval` fail
    try:
        with pytest.raises(EvalError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
            BFCLMultiTurnSuite()
    finally:
        bfcl_mod._bfcl.cache_clear()


def test_load_items_shape_and_order(suite: BFCLMultiTurnSuite) -> None:
    items = suite.load_items(3)
    assert [i.id for i in items] == [f"multi_turn_{c}_{n}" for c in CATEGORIES for n in range(3)]
    assert [i.id for i in suite.load_items(3)] == [i.id for i in items]
    assert suite.load_items(0) == []
    one = BFCLMultiTurnSuite(["miss_param"]).load_items(2)
    assert [i.dataset for i in one] == ["multi_turn_miss_param"] * 2
    for item in items:
        entry, truth = item.data["entry"], item.data["ground_truth"]
        assert item.dataset == f"multi_turn_{item.group}" and item.group in CATEGORIES
        assert item.prompt == entry["question"][0][0]["content"]
        assert item.answer == truth and len(truth) == len(entry["question"])
        assert all(isinstance(call, str) for turn in truth for call in turn)
        assert json.loads(json.dumps(item.to_dict())) == item.to_dict()
    assert suite.groups() == {f"multi_turn_{c}": c for c in CATEGORIES}
    assert suite.defaults.max_turns >= 8 * 21 and suite.defaults.max_new_tokens == 4096


# -- scoring ---------------------------------------------------------------------------------

@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_completion_scores_one(suite: BFCLMultiTurnSuite, items, category: str) -> None:
    for item in items[category]:
        assert suite.score(item, suite.gold_completion(item)) == 1.0, item.id


def test_garbage_scores_zero(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][0]
    n = len(item.data["ground_truth"])
    gold = suite.gold_completion(item)
    garbage = [
        None, "cd(folder='document')", 42, {"turn": []}, [], [[]] * n, [[[]] for _ in range(n)],
        [[["cd(folder='nowhere')"]] for _ in range(n)],           # wrong calls
        [[[["cd(folder='document')"]]] for _ in range(n)],        # nested one level too deep
        [["cd(folder='document')"] for _ in range(n)],            # one level too shallow
        [[[1, 2]] for _ in range(n)],                             # not strings
        gold[:-1], gold + [[]],                                   # wrong number of turns
        [[["__import__('os').getcwd()"]]] + gold[1:],             # not a plain call
        [[["cd(folder=open('x'))"]]] + gold[1:],                  # non-literal argument
        [[["cd(folder="]]] + gold[1:],                            # syntax error
    ]
    for completion in garbage:
        assert suite.score(item, completion) == 0.0, completion
    verdict = suite.check(item, None)
    assert verdict["valid"] is False and verdict["error_type"] == "spadekit:malformed_completion"
    broken = EvalItem(id="x", dataset="multi_turn_base", group="base", prompt="", data={})
    assert suite.score(broken, gold) == 0.0


def test_checker_instances_are_released(suite: BFCLMultiTurnSuite, items) -> None:
    namespace = vars(bfcl_mod._bfcl().utils)
    before = len(namespace)
    for item in items["long_context"][:2]:
        suite.score(item, suite.gold_completion(item))
    assert len(namespace) == before


# -- the environment -------------------------------------------------------------------------

@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("per_call", [True, False])
def test_env_gold_replies_win(suite: BFCLMultiTurnSuite, items, category: str,
                              per_call: bool) -> None:
    for item in items[category][:3]:
        env = suite.make_env(item, max_turns=suite.defaults.max_turns)
        replies = suite.gold_replies(item, per_call=per_call)
        assert sum(r == DONE_REPLY for r in replies) == len(item.data["ground_truth"])
        reward, terminated, truncated, info, _ = play(env, replies)
        assert (reward, terminated, truncated) == (1.0, True, False), (item.id, info)
        assert info["valid"] is True and suite.score(item, info["calls"]) == 1.0
        assert env.step(DONE_REPLY)[2] is True  # stepping a finished episode is harmless


def test_env_doing_nothing_loses(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][1]
    n = len(item.data["ground_truth"])
    reward, terminated, _, info, observations = play(suite.make_env(item), ["I can't."] * n)
    assert (reward, terminated) == (0.0, True)
    assert info["calls"] == [[] for _ in range(n)]
    assert observations[1] == item.data["entry"]["question"][1][0]["content"]


def test_env_wrong_calls_lose(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][0]
    replies = [format_tool_call("mkdir", {"dir_name": "wrong"}), DONE_REPLY]
    replies += [DONE_REPLY] * len(item.data["ground_truth"])
    reward, terminated, _, info, _ = play(suite.make_env(item), replies)
    assert (reward, terminated) == (0.0, True) and info["calls"][0] == [["mkdir(dir_name='wrong')"]]


def test_env_bad_actions_give_error_observations(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][0]  # GorillaFileSystem + TwitterAPI; excludes cp
    assert item.data["entry"]["excluded_function"] == ["cp"]
    env = suite.make_env(item)
    env.reset()
    cases = {
        '<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>': "not valid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': "name",
        format_tool_call("launch_rocket", {}): "unknown function",
        format_tool_call("cp", {"source": "a", "destination": "b"}): "unknown function",
        format_tool_call("cd", {"folder); print(1": "x"}): "not a valid identifier",
        format_tool_call("cd", {"folder": float("nan")}): "finite",
        format_tool_call("cd", {"folder": 123}): '"error"',       # raises inside the API
        format_tool_call("cd", {"nope": "x"}): '"error"',         # unexpected keyword
        "<tool_call>": "empty",
    }
    for action, expected in cases.items():
        obs, reward, terminated, truncated, _ = env.step(action)
        assert expected in obs and (reward, terminated, truncated) == (0.0, False, False), action
    obs, *_ = env.step("<tool_call>{bad json}</tool_call>\n" + format_tool_call("pwd", {}))
    lines = [json.loads(line) for line in obs.splitlines()]
    assert "error" in lines[0]
    assert lines[1] == {"tool": "pwd", "result": {"current_working_directory": "/workspace"}}
    recorded = env.completion()[0]
    assert ["pwd()"] in recorded and all("cp(" not in c for step in recorded for c in step)


def test_step_limit_fails_the_entry_as_bfcl_does(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][0]
    env = BFCLEnv(item.data["entry"], lambda calls: suite.check(item, calls),
                  max_steps_per_turn=2)
    env.reset()
    assert env.step(format_tool_call("pwd", {}))[4]["user_turn"] == 0
    obs, reward, terminated, truncated, info = env.step(format_tool_call("pwd", {}))
    assert (reward, terminated, truncated) == (0.0, True, False) and "limit" in obs
    assert info["user_turn"] == 0 and info["valid"] is False
    assert info["error_type"] == "spadekit:step_limit"
    assert env.step("<answer>done</answer>")[1:3] == (0.0, True)


def test_env_truncates_at_max_turns(suite: BFCLMultiTurnSuite, items) -> None:
    env = suite.make_env(items["base"][0], max_turns=2)
    env.reset()
    assert env.step(format_tool_call("pwd", {}))[3] is False
    _, reward, terminated, truncated, _ = env.step(format_tool_call("pwd", {}))
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_two_envs_of_one_item_share_no_state(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["base"][0]
    a, b = suite.make_env(item), suite.make_env(item)
    a.reset(), b.reset()
    a.step(format_tool_call("cd", {"folder": "document"}))
    a.step(format_tool_call("mkdir", {"dir_name": "temp"}))
    assert '"temp"' in a.step(format_tool_call("ls", {}))[0]
    assert "document" in b.step(format_tool_call("ls", {}))[0]
    b.step(format_tool_call("cd", {"folder": "document"}))
    assert '"temp"' not in b.step(format_tool_call("ls", {}))[0]
    # interleaved full games with gold replies both win
    a2, b2 = suite.make_env(item), suite.make_env(item)
    a2.reset(), b2.reset()
    results = []
    for reply in suite.gold_replies(item):
        results = [a2.step(reply), b2.step(reply)]
    assert [r[1:3] for r in results] == [(1.0, True), (1.0, True)]
    namespace = vars(bfcl_mod._bfcl().utils)
    for env in (a, b):
        env.close()
    assert not any(k.startswith((a._model_name, a2._model_name)) for k in list(namespace))


def test_tools_schemas(suite: BFCLMultiTurnSuite, items, all_items) -> None:
    sample = [i for c in CATEGORIES for i in items[c]] + [all_items["multi_turn_base_2"]]
    for item in sample:
        env = suite.make_env(item)
        env.reset()
        tools = env.tools()
        names = [t["function"]["name"] for t in tools]
        assert len(names) == len(set(names)) and names
        entry = item.data["entry"]
        hidden = set(entry.get("excluded_function") or [])
        hidden |= {n for ns in (entry.get("missed_function") or {}).values() for n in ns}
        assert not hidden & set(names), item.id
        for tool in tools:
            assert tool["type"] == "function" and isinstance(tool["function"]["description"], str)
            params = tool["function"]["parameters"]
            assert params["type"] == "object" and isinstance(params["properties"], dict)
            assert set(params["required"]) <= set(params["properties"])
            assert set(walk_types(params)) <= {"object", "number", "integer", "string",
                                               "boolean", "array"}
            json.dumps(tool)
    assert "rm" not in [t["function"]["name"] for t in suite.make_env(
        all_items["multi_turn_base_2"]).tools()]


def test_miss_func_end_to_end(suite: BFCLMultiTurnSuite, items) -> None:
    item = items["miss_func"][0]  # sort is held out until turn 3
    assert item.data["entry"]["missed_function"] == {"3": ["sort"]}
    env = suite.make_env(item)
    env.reset()
    assert "sort" not in [t["function"]["name"] for t in env.tools()]
    observations = play(env, suite.gold_replies(item, per_call=False))[4]
    held_turn = observations[[i for i, o in enumerate(observations) if '"name": "sort"' in o][0]]
    assert "more functions" in held_turn and '"type": "object"' in held_turn
    assert "sort" in [t["function"]["name"] for t in env.tools()]
    assert env.last_check and env.last_check["valid"] is True


def test_miss_func_ground_truth_calling_held_out_function_early(suite, all_items) -> None:
    """BFCL quirk: multi_turn_miss_func_49's ground truth calls ``tail`` before it is given."""
    item = all_items["multi_turn_miss_func_49"]
    assert play(suite.make_env(item), suite.gold_replies(item, per_call=False))[0] == 1.0


def test_long_context_observations_fit(suite: BFCLMultiTurnSuite, all_items) -> None:
    many = all_items["multi_turn_long_context_38"]  # one turn has 34 calls
    assert play(suite.make_env(many), suite.gold_replies(many, per_call=False))[:2] == (1.0, True)
    item = all_items["multi_turn_long_context_113"]  # results of ~47,000 characters
    replies = suite.gold_replies(item, per_call=False)
    reward, terminated, _, _, observations = play(suite.make_env(item), replies)
    assert (reward, terminated) == (1.0, True)
    assert max(len(o) for o in observations) > 40_000  # long context really is long
    env = BFCLEnv(item.data["entry"], lambda calls: suite.check(item, calls),
                  max_observation_chars=5000)
    reward, terminated, _, _, observations = play(env, replies)
    assert max(len(o) for o in observations) <= 5000 and "characters cut" in "".join(observations)
    assert (reward, terminated) == (1.0, True)  # cutting what the model sees changes no state


# -- schema conversion and call strings ------------------------------------------------------

def test_schema_conversion() -> None:
    bfcl_doc = {"type": "dict", "required": ["a", "zz"], "properties": {
        "a": {"type": "float", "description": "x"},
        "b": {"type": "tuple", "items": {"type": "dict", "properties": {
            "c": {"type": "integer"}}}},
        "d": {"type": "string", "default": "None"}, "e": {"type": "any", "default": 3}}}
    schema = to_json_schema(bfcl_doc)
    assert schema["type"] == "object" and schema["required"] == ["a"]
    assert schema["properties"]["a"] == {"type": "number", "description": "x"}
    assert schema["properties"]["b"]["items"]["type"] == "object"
    assert schema["properties"]["b"]["items"]["properties"]["c"] == {"type": "integer"}
    assert schema["properties"]["d"] == {"type": "string"}
    assert schema["properties"]["e"] == {"default": 3}


def test_call_strings() -> None:
    text = encode_call("mv", {"source": "it's.txt", "n": [1, 2.5, None, True], "m": {"k": "v"}})
    assert text == "mv(source=\"it's.txt\", n=[1, 2.5, None, True], m={'k': 'v'})"
    assert parse_call(text) == ("mv", [], {"source": "it's.txt", "n": [1, 2.5, None, True],
                                           "m": {"k": "v"}})
    assert parse_call("sort('a.txt')") == ("sort", ["a.txt"], {})
    for name, args in [("os.system", {}), ("import", {}), ("f", {"class": 1}),
                       ("f", {"a": math.inf}), ("f", {"a": object()}), ("f", {"a": {1: 2}})]:
        with pytest.raises(CallError):
            encode_call(name, args)
    for text in ["f(**{'a': 1})", "f(a=b)", "obj.f()", "f()()", "[f()]", "f(", None]:
        with pytest.raises(CallError):
            parse_call(text)
