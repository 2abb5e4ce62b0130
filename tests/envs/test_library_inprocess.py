"""In-process checks of every library environment program (no sandbox).

Each program is exec'd into a fresh module namespace, the single ``*Env`` class it defines is
found, and the environment contract is exercised: construction, reset types, determinism,
solution replay, garbage robustness, truncation, reward range and tool schemas.
"""

from __future__ import annotations

import ast
import json
import math
import random
import string
import types

import pytest

from spadekit.envs.actions import boxed, format_tool_call
from spadekit.envs.library import LibraryEnv, get, list_library, read_metadata, source

SKILLS = {
    "games": {"Mathematical_Reasoning", "Logical_Deduction", "Spatial_Reasoning",
              "Pattern_Recognition", "Optimization", "Causal_Inference"},
    "tooluse": {"API_Orchestration", "Data_Retrieval", "State_Modification", "Error_Recovery",
                "Tool_Selection", "Multi-Step_Workflows"},
}
LIBRARY = list_library()
NAMES = [env.name for env in LIBRARY]
GARBAGE = ["", "hello", "\\boxed{}", "\\boxed{1}", "\\boxed{test}", "\\boxed{42}",
           "<answer>done</answer>", "\\boxed{guess 42}", "\\boxed{answer}", "\\boxed{\\boxed{x}}",
           "<tool_call>{not json}</tool_call>",
           '<tool_call>{"name": "x", "arguments": []}</tool_call>',
           '<tool_call>{"name": "submit", "arguments": {"x": 1}}</tool_call>',
           "\\boxed{mod 99999999999999999999999}", "\\boxed{" + "9" * 5000 + "}", "x" * 100_000,
           "\\boxed{ﾟ²}", "\\boxed{{{{", "}}}}"]

# garbage that may legitimately end an episode (with a low score) is left out of long runs
NONTERMINAL_GARBAGE = [g for g in GARBAGE
                       if g not in ("<answer>done</answer>", "\\boxed{guess 42}")]


def load_class(name: str) -> type:
    """Exec a library program into a fresh module and return its one defined *Env class."""
    module = types.ModuleType(f"libenv_{name}")
    exec(compile(source(name), f"{name}.py", "exec"), module.__dict__)
    classes = [obj for key, obj in vars(module).items() if isinstance(obj, type)
               and key.endswith("Env") and obj.__module__ == module.__name__]
    assert len(classes) == 1, f"{name}: expected exactly one defined *Env class, got {classes}"
    return classes[0]


def check_step(result) -> tuple[str, float, bool, bool, dict]:
    obs, reward, terminated, truncated, info = result
    assert isinstance(obs, str) and obs
    assert isinstance(reward, float) and math.isfinite(reward) and 0.0 <= reward <= 1.0
    assert isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)
    return obs, reward, terminated, truncated, info


def replay(env, actions: list[str]) -> list[tuple]:
    return [check_step(env.step(a)) for a in actions]


# ----- registry --------------------------------------------------------------------------------
def test_registry_covers_every_skill_once():
    for setting, skills in SKILLS.items():
        found = sorted(env.skill for env in LIBRARY if env.setting == setting)
        assert found == sorted(skills), setting
    assert len(LIBRARY) == 12 and NAMES == sorted(NAMES)


def test_registry_metadata_and_lookup():
    for env in LIBRARY:
        assert isinstance(env, LibraryEnv) and env.path.is_file()
        assert env.doc and env.hint and env.tags and all(isinstance(t, str) for t in env.tags)
        assert env.name.startswith("games_" if env.setting == "games" else "tools_")
        assert get(env.name) == env
        assert "class " in source(env.name)
    with pytest.raises(KeyError, match="available"):
        get("no_such_env")


def test_registry_rejects_bad_metadata(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text('"""Doc."""\nSKILL = "X"\nSETTING = "games"\nHINT = "h"\nTAGS = "notalist"\n')
    with pytest.raises(ValueError, match="broken.py.*TAGS"):
        read_metadata(bad)
    bad.write_text('"""Doc."""\nSKILL = "X"\nSETTING = "board"\nHINT = "h"\nTAGS = []\n')
    with pytest.raises(ValueError, match="SETTING"):
        read_metadata(bad)
    bad.write_text('SKILL = "X"\nSETTING = "games"\nHINT = f"{1}"\nTAGS = []\n')
    with pytest.raises(ValueError, match="HINT"):
        read_metadata(bad)


@pytest.mark.parametrize("name", NAMES)
def test_programs_import_only_stdlib_or_spadekit(name):
    env = get(name)
    tree = ast.parse(source(name))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    allowed = {"random", "re", "itertools", "collections", "math", "json", "string"}
    if env.setting == "tooluse":
        allowed.add("spadekit")
    assert roots <= allowed, roots - allowed


# ----- contract --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_construct_and_reset(name):
    cls = load_class(name)
    for env in (cls(max_turns=12), cls()):
        assert env.max_turns == 12
        obs, info = env.reset(seed=3)
        assert isinstance(obs, str) and obs.strip() and isinstance(info, dict)
    obs, info = cls(max_turns=5).reset(seed=None, options={})
    assert obs


@pytest.mark.parametrize("name", NAMES)
def test_deterministic(name):
    cls = load_class(name)
    for seed in (11, 12):
        runs = []
        for _ in range(2):
            env = cls()
            first, _ = env.reset(seed=seed)
            actions = env.solution()[:-1] + ["hello", "\\boxed{1}"]
            runs.append([first] + [(o, r, te, tr) for o, r, te, tr, _ in replay(env, actions)])
        assert runs[0] == runs[1]
    env, instances = cls(), set()
    for seed in range(4):
        instances.add((env.reset(seed=seed)[0], tuple(env.solution())))
    assert len(instances) > 1, "instances should depend on the seed"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(5))
def test_solution_reaches_full_reward(name, seed):
    cls = load_class(name)
    env = cls(max_turns=12)
    env.reset(seed=seed)
    actions = env.solution()
    assert isinstance(actions, list) and all(isinstance(a, str) for a in actions)
    assert 1 <= len(actions) <= 12
    results = replay(env, actions)
    for _, _, terminated, truncated, _ in results[:-1]:
        assert not terminated and not truncated
    _, reward, terminated, _, _ = results[-1]
    assert reward == 1.0 and terminated
    obs, reward, terminated, _, _ = check_step(env.step("one more"))
    assert terminated and reward == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_garbage_never_wins_and_truncates(name):
    cls = load_class(name)
    rng = random.Random(0)
    for seed in range(3):
        env = cls(max_turns=12)
        env.reset(seed=seed)
        turns = [NONTERMINAL_GARBAGE[(seed + i) % len(NONTERMINAL_GARBAGE)] for i in range(10)]
        turns += ["".join(rng.choice(string.printable) for _ in range(rng.randint(0, 80)))
                  for _ in range(2)]
        results = replay(env, turns)
        assert all(r < 1.0 for _, r, _, _, _ in results)
        assert not any(te for _, _, te, _, _ in results)
        assert [tr for _, _, _, tr, _ in results] == [False] * 11 + [True]
        _, _, terminated, _, _ = check_step(env.step("after the end"))
        assert terminated


@pytest.mark.parametrize("name", NAMES)
def test_each_garbage_action_alone_never_wins(name):
    cls = load_class(name)
    env = cls(max_turns=3)
    for action in GARBAGE:
        env.reset(seed=7)
        for _ in range(3):
            _, reward, terminated, truncated, _ = check_step(env.step(action))
            assert reward < 1.0
            if terminated or truncated:
                break


def _call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


def _chunks(moves: list[str], size: int) -> list[str]:
    return [boxed(" ".join(moves[i : i + size])) for i in range(0, len(moves), size)]


def _wet_booking(env):
    day = next(d for d in env.weather if env.weather[d] in ("rain", "storm"))
    return [_call("book_meeting", day=day, hour=9, city=env.city, attendees=env.people),
            "<answer>done</answer>"]


def _runner_up(env):
    others = [r for r in env._matches(env.dept, env.city) if r["id"] != env.target]
    return [_call("submit_employee", employee_id=others[0]["id"]), "<answer>done</answer>"]


# For each program: a near-miss play (built from the hidden state) that must score in (0, 1).
NEAR_MISSES = {
    "games_modular_search": lambda env, sol: sol[:-1] + [
        boxed(f"guess {env.secret + 99 if env.secret + 99 < env.upper else env.secret - 99}")],
    "games_code_breaker": lambda env, sol: sol[:-1] + [
        boxed("submit " + ("2" if env.secret[0] == "1" else "1") + env.secret[1:])],
    "games_maze_gems": lambda env, sol: _chunks(env._path(env.start, env.exit, set(env.gems)), 6),
    "games_sequence_rule": lambda env, sol: [sol[-1].replace("}", "1}")],
    "games_knapsack_reveal": lambda env, sol: [boxed(f"pack {min(env.best) + 1}")],
    "games_switchboard": lambda env, sol: [
        boxed("answer " + " ".join(str(w + 1) for w in env.wires[:-1])
              + f" {(env.wires[-1] + 1) % 5 + 1}")],
    "tools_meeting_scheduler": lambda env, sol: _wet_booking(env),
    "tools_record_lookup": lambda env, sol: _runner_up(env),
    "tools_inventory_update": lambda env, sol: [
        a.split('<tool_call>{"name": "remove_item"')[0] for a in sol],
    "tools_flaky_rates": lambda env, sol: [_call("submit_conversion", amount=env.expected + 5),
                                           "<answer>done</answer>"],
    "tools_assistant_relay": lambda env, sol: [sol[0], sol[1] + sol[1], sol[2]],
    "tools_order_pipeline": lambda env, sol: [
        a.replace("send_confirmation", "get_order") for a in sol],
}


def test_near_misses_cover_library():
    assert sorted(NEAR_MISSES) == NAMES


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(4))
def test_partial_credit(name, seed):
    """A near miss gets partial credit: terminated with 0 < reward < 1."""
    env = load_class(name)()
    env.reset(seed=seed)
    actions = NEAR_MISSES[name](env, env.solution())
    results = replay(env, actions)
    _, reward, terminated, _, _ = results[-1]
    assert terminated and 0.0 < reward < 1.0, (actions, results[-1])


@pytest.mark.parametrize("name", [env.name for env in LIBRARY if env.setting == "tooluse"])
def test_tool_schemas_well_formed(name):
    env = load_class(name)()
    obs, info = env.reset(seed=0)
    schemas = env.tools()
    assert info["tools"] == schemas and len(schemas) >= 3
    names = [s["function"]["name"] for s in schemas]
    assert len(set(names)) == len(names)
    for schema in schemas:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert fn["name"].isidentifier() and fn["description"] and fn["name"] in obs
        params = fn["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        for prop in params["properties"].values():
            assert prop.get("type") or prop.get("enum") or prop.get("anyOf"), (fn["name"], prop)
            assert prop.get("description"), f"{name}.{fn['name']}: undocumented parameter"
    json.dumps(schemas)


@pytest.mark.parametrize("name", NAMES)
def test_solution_many_seeds(name):
    env = load_class(name)()
    for seed in range(5, 40):
        env.reset(seed=seed)
        actions = env.solution()
        assert len(actions) <= 12
        results = replay(env, actions)
        assert results[-1][1] == 1.0 and results[-1][2], (seed, results[-1])


@pytest.mark.parametrize("name", [env.name for env in LIBRARY if env.setting == "tooluse"])
def test_tool_env_immediate_answer_scores_zero(name):
    env = load_class(name)()
    for seed in range(3):
        env.reset(seed=seed)
        _, reward, terminated, _, info = check_step(env.step("<answer>done</answer>"))
        assert terminated and reward == 0.0 and not any(info["criteria"].values())
