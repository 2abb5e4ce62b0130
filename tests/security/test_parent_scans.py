"""The trusted parent's reading of what untrusted programs return is linear and bounded.

A sandboxed program's results are read by the parent after its worker replied, where no worker
deadline applies: the string ``solution()`` of the reference contract (``envs.schemas``), the
tool calls of actions (``envs.actions``, read by the hint leak check and by ``ToolEnv`` in the
worker, where an agent's reply would otherwise hang the program), the hint in a designer's text.
Each hostile value below stalled the parent (minutes to hours), raised ``RecursionError`` or a
bare ``ValueError`` out of it, or was labelled ``timeout`` and charged the designer the hang
penalty. Now each is read in milliseconds; what is too big is refused as ``oversized``, what runs
out of the parent's budget as ``parent_budget``: invalid, never a hang.

Pure reads run in a child process killed after its limit (a regular expression cannot be
interrupted); validations run under a watchdog that interrupts the test with ``SIGUSR1``.
The property tests compare the rewritten scanners with simple reference implementations.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.common.errors import InvalidResult
from spadekit.envs.actions import ActionParseError, extract_boxed, parse_tool_calls
from spadekit.envs.program import EnvProgram
from spadekit.envs.schemas import solution_actions
from spadekit.sandbox import validate as validate_module
from spadekit.sandbox.play import Episode
from spadekit.sandbox.validate import Validator, ValidatorSettings
from spadekit.selfplay.rewards import designer_reward_for_failure

SRC = Path(__file__).resolve().parents[2] / "src"
TOOLS = [{"type": "function", "function": {"name": "f", "description": "f", "parameters": {
    "type": "object", "properties": {"a": {}}}}}]


# -- helpers ------------------------------------------------------------------------------------


def _child(body: str, limit_s: float) -> dict:
    """Run ``body`` (Python that sets ``out``, a JSON value) in a fresh interpreter; fail the
    test when it is still running after ``limit_s`` seconds (it is killed)."""
    script = "import json\n" + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=limit_s, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the parent-side read was still running after {limit_s:g}s")
    assert done.returncode == 0, done.stderr[-2000:]
    return {"out": json.loads(done.stdout.strip().splitlines()[-1]),
            "seconds": time.monotonic() - start}


class _Hung(Exception):
    pass


@contextlib.contextmanager
def _watchdog(limit_s: float):
    """Interrupt the test (``_Hung``) when the block is still running after ``limit_s``."""
    def interrupt(_signum, _frame):
        raise _Hung(f"still running after {limit_s:g}s")

    main = threading.get_ident()
    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(limit_s, lambda: signal.pthread_kill(main, signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def _reason_of(fn):
    """``fn()``'s ``(\"ok\", value)`` or ``(\"raised\", type name, reason)``."""
    try:
        return ("ok", fn())
    except Exception as exc:  # the point: which typed error, if any
        return ("raised", type(exc).__name__, getattr(exc, "reason", None))


# -- string solutions (envs.schemas) ------------------------------------------------------------


def test_nested_unclosed_calls_in_a_string_solution_are_read_once():
    # each unclosed "f(" was scanned to the end: about 40,000 x 40,000 characters in Python
    found = _child("""
        from spadekit.envs.schemas import solution_actions
        tools = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {}}}}}]
        out = solution_actions("f(" * 40_000 + " ANSWER: 1", tools)
    """, 60)
    assert found["seconds"] < 10
    assert found["out"] == ["<answer>1</answer>"]


def test_unclosed_tags_in_a_string_solution_are_read_once():
    # every unclosed <tool_call> and <answer> made the pattern search to the end: ~6 s here
    text = "<tool_call>" * 4500 + "<answer>" * 6000 + "\\boxed{1}"
    start = time.monotonic()
    assert solution_actions(text) == ["\\boxed{1}"]
    assert time.monotonic() - start < 2


def test_a_deep_tool_call_in_a_string_solution_is_oversized_not_a_crash():
    deep = '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 40_000 + "]" * 40_000 \
        + "}}</tool_call> ANSWER: 1"
    assert _reason_of(lambda: solution_actions(deep, TOOLS)) == (
        "raised", "InvalidResult", "oversized")


def test_a_string_solution_over_the_cap_is_oversized():
    for text in ("\\boxed{" * 120_000, "\\boxed{1}" * 12_000):
        assert _reason_of(lambda: solution_actions(text)) == (
            "raised", "InvalidResult", "oversized")


def test_a_read_past_its_deadline_is_parent_budget():
    assert _reason_of(lambda: solution_actions("\\boxed{1} " * 100, budget_s=0.0)) == (
        "raised", "InvalidResult", "parent_budget")
    assert designer_reward_for_failure("parent_budget") == (0.0, False)
    assert designer_reward_for_failure("oversized") == (0.0, False)


# -- tool calls in actions (envs.actions, the leak check, ToolEnv) ------------------------------


def test_a_fence_of_spaces_in_a_tool_call_is_read_in_one_pass():
    # the fence pattern backtracked cubically: 8,000 spaces took 232 s
    found = _child("""
        from spadekit.envs.actions import parse_tool_calls
        calls, errors = parse_tool_calls("<tool_call>```" + " " * 20_000 + "x</tool_call>",
                                         strict=False)
        fenced = parse_tool_calls('<tool_call>```json\\n{"name": "f"}\\n```</tool_call>')
        out = [len(calls), [type(e).__name__ for e in errors], [c.name for c in fenced]]
    """, 60)
    assert found["seconds"] < 10
    assert found["out"] == [0, ["ActionParseError"], ["f"]]


def test_deep_or_huge_json_in_a_tool_call_is_a_parse_error():
    deep = '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 100_000 + "]" * 100_000 \
        + "}}</tool_call>"
    huge = '<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>"
    as_string = '<tool_call>{"name": "f", "arguments": "' + "[" * 5000 + '"}</tool_call>'
    for action in (deep, huge):
        calls, errors = parse_tool_calls(action, strict=False)
        assert calls == [] and [type(e) for e in errors] == [ActionParseError]
        with pytest.raises(ActionParseError):
            parse_tool_calls(action)
    calls, errors = parse_tool_calls(as_string, strict=False)  # a string left as it is
    assert calls == [] and "must be a JSON object" in str(errors[0])
    ok = '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 60 + "]" * 60 + "}}</tool_call>"
    assert parse_tool_calls(ok)[0].name == "f"


def test_the_hint_leak_scan_of_a_fenced_tool_call_is_fast():
    found = _child("""
        from spadekit.selfplay.leaks import leaked_fragments
        action = "<tool_call>```" + " " * 8000 + "x</tool_call>"
        out = leaked_fragments("Use xyzzy.", [action, "\\\\boxed{xyzzy}"])
    """, 60)
    assert found["seconds"] < 10
    assert found["out"] == ["xyzzy"]


def test_an_agents_fenced_reply_does_not_hang_a_tool_env():
    # in the worker, this reply used to hang the program: a play timeout, charged as its hang
    found = _child("""
        import importlib.util
        from spadekit.envs.library import _program_paths
        path = _program_paths()["tools_record_lookup"]
        spec = importlib.util.spec_from_file_location("prog", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cls = next(v for k, v in vars(module).items() if k.endswith("Env") and k != "ToolEnv")
        env = cls(max_turns=4)
        env.reset(seed=1)
        obs, reward, *_ = env.step("<tool_call>```" + " " * 20_000 + "x</tool_call>")
        out = [reward, "not valid JSON" in obs]
    """, 60)
    assert found["seconds"] < 10
    assert found["out"] == [0.0, True]


# -- the hint in a designer's text (envs.hints) -------------------------------------------------


def test_backticks_in_a_hint_are_stripped_in_bounded_time():
    # the code-span pattern backtracked cubically over a run of backticks: ~2 s for the
    # 4,000 characters a hint may have, ~30 s or more for 12,000
    found = _child("""
        from spadekit.envs.hints import _strip_markdown
        out = _strip_markdown("`" * 12_000)
    """, 60)
    assert found["seconds"] < 10 and found["out"] == ""
    from spadekit.envs.extract import extract_program

    code = "```python\nclass AEnv:\n    pass\n```\n"
    assert extract_program(code + "HINT: use `probe` first, then commit.\n").hint == \
        "use probe first, then commit."


# -- in validation and play (real sandbox) -------------------------------------------------------

GAME = '''
import random

class NumberEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.code, self.t = self.rng.randint(100, 999), 0
        return "Guess the hidden number from 100 to 999; answer as \\\\boxed{n}.", {}

    def step(self, action):
        self.t += 1
        won = action.strip() == "\\\\boxed{%d}" % self.code
        return ("right" if won else "wrong"), (1.0 if won else 0.0), won, self.t >= 12, {}

    def solution(self):
        return SOLUTION
'''

TOOL = '''
import random

class LookupEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Find the record with the tool f and answer with <answer>id</answer>.", {}

    def tools(self):
        return [{"type": "function", "function": {"name": "f", "description": "look up",
                 "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]

    def step(self, action):
        self.t += 1
        return "nothing found", 0.0, False, self.t >= 12, {}

    def solution(self):
        return "f(" * 40000 + " ANSWER: 1"
'''


def _program(template: str, solution: str) -> EnvProgram:
    return EnvProgram(code=template.replace("SOLUTION", solution))


def test_validation_refuses_an_oversized_string_solution_without_a_hang(pool):
    program = _program(GAME, '"\\\\boxed{1}" * 12000')
    with _watchdog(120):
        report = Validator(pool, seed=1).validate(program)
    assert (report.ok, report.stage, report.reason) == (False, "solution", "oversized")
    assert designer_reward_for_failure(report.reason) == (0.0, False)


def test_validation_of_a_quadratic_string_solution_is_not_a_timeout(pool):
    # 195 s of parent CPU, then labelled "timeout" (the hang penalty), before
    start = time.monotonic()
    with _watchdog(120):
        report = Validator(pool, seed=1).validate(EnvProgram(code=TOOL))
    assert time.monotonic() - start < 60
    assert not report.ok and report.reason not in ("timeout", "slow"), report.reason
    assert (report.stage, report.reason) == ("solution", "solution_fails")


def test_the_parents_reading_time_is_not_the_programs(pool, monkeypatch):
    honest = _program(GAME, '["\\\\boxed{%d}" % self.code]')
    real = validate_module.advertised_actions

    def slow(*args, **kwargs):  # a parent-side read that takes its time
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(validate_module, "advertised_actions", slow)
    tight = ValidatorSettings(total_timeout=5.0)
    with _watchdog(120):
        report = Validator(pool, tight, seed=3).validate(honest)
    assert report.ok, (report.reason, report.message)  # was "timeout": the hang penalty
    assert report.details["timings_ms"]["parent"] > 5000
    monkeypatch.setattr(validate_module, "PARENT_BUDGET_S", 2.0)
    with _watchdog(120):
        report = Validator(pool, tight, seed=3).validate(honest)
    assert (report.ok, report.reason) == (False, "parent_budget")
    assert designer_reward_for_failure(report.reason) == (0.0, False)


def test_play_solution_of_a_quadratic_string_finishes(pool):
    with _watchdog(120):
        out = Episode(pool, EnvProgram(code=TOOL), seed=1).run("solution")
    assert out["error"] is None and [t["action"] for t in out["turns"]] == [
        "<answer>1</answer>"]
    with _watchdog(120):
        out = Episode(pool, _program(GAME, '"\\\\boxed{1}" * 12000'), seed=1).run("solution")
    assert out["error"]["reason"] == "oversized"


# -- property tests: the rewritten scanners and simple references --------------------------------


def _reference_boxed(text: str):
    """The last top-level box, char by char (the contract of ``extract_boxed``)."""
    result, i, opening = None, 0, re.compile(r"\\boxed\s*\{")
    while True:
        m = opening.search(text, i)
        if m is None:
            return result
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            return None
        result, i = text[m.end():j - 1].strip(), j


_BOX_TEXT = st.lists(st.sampled_from(["\\boxed{", "\\boxed {", "{", "}", "a", " ", "\\",
                                      "boxed"]), max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(_BOX_TEXT)
def test_extract_boxed_matches_the_reference(text):
    assert extract_boxed(text) == _reference_boxed(text)


def _reference_solution(text, tools=()):
    """The string-solution contract, the plain way: one combined pattern, each bracket scan
    from its own opening (quadratic, fine on small inputs)."""
    import ast

    block = re.compile(r"<tool_call>(.*?)</tool_call>|<answer>(.*?)</answer>|\\boxed\{"
                       r"|\bANSWER\s*:\s*([^\n]*)|\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.DOTALL)

    def balanced(start, opening, closing):
        depth, i, quote = 1, start, None
        while i < len(text):
            ch = text[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = None
            elif ch in "'\"" and opening == "(":
                quote = ch
            elif ch == opening:
                depth += 1
            elif ch == closing:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None

    def call(source, name, names):
        try:
            node = ast.parse(source, mode="eval").body
            if not isinstance(node, ast.Call) or len(node.args) > len(names) or any(
                    k.arg is None for k in node.keywords):
                return None
            args = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
            args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
            return "<tool_call>%s</tool_call>" % json.dumps({"name": name, "arguments": args})
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return None

    params = {t["function"]["name"]: list(t["function"]["parameters"]["properties"])
              for t in tools}
    actions, pos, answered = [], 0, False
    while (m := block.search(text, pos)) is not None:
        pos = m.end()
        if m.group(1) is not None:
            try:
                parsed = json.loads(m.group(1))
            except ValueError:
                return None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
                return None
            actions.append(m.group(0))
        elif m.group(2) is not None or m.group(3) is not None:
            actions.append("<answer>%s</answer>" % (m.group(2) if m.group(2) is not None
                                                     else m.group(3)).strip())
            answered = True
        elif m.group(4) is None:
            end = balanced(pos, "{", "}")
            if end is None:
                return None
            actions.append(text[m.start():end])
            pos = end
        elif m.group(4) in params:
            end = balanced(pos, "(", ")")
            action = None if end is None else call(text[m.start(4):end], m.group(4),
                                                   params[m.group(4)])
            if action is not None:
                actions.append(action)
                pos = end
    if not actions or (params and not answered):
        return None
    return actions


_SOLUTION_TEXT = st.lists(st.sampled_from([
    "<tool_call>", "</tool_call>", '{"name": "f"}', "<answer>", "</answer>", "ANSWER: ",
    "\\boxed{", "{", "}", "f(", "g(", "(", ")", "a=1", "'", '"', "\\", ", ", "x", " ", "\n",
    "f(a='b')", "f(1)"]), max_size=25).map("".join)


@settings(max_examples=600, deadline=None)
@given(_SOLUTION_TEXT, st.booleans())
def test_solution_actions_matches_the_reference(text, with_tools):
    tools = TOOLS if with_tools else []
    assert solution_actions(text, tools) == _reference_solution(text, tools)


def _reference_unfenced(text: str) -> str:
    m = re.match(r"^```[A-Za-z]*\s*(.*?)\s*```$", text, re.DOTALL)
    return m.group(1) if m else text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["`", "```", "json", " ", "\n", "{", "}", "x"]),
                max_size=12).map("".join))
def test_the_fence_unwrapping_matches_the_pattern_on_small_inputs(body):
    from spadekit.envs.actions import _unfenced

    assert _unfenced(body.strip()) == _reference_unfenced(body.strip())


def test_the_scan_limits_are_documented_constants():
    from spadekit.envs import scan_limits, schemas

    assert schemas.MAX_SOLUTION_CHARS == 100_000 and schemas.MAX_JSON_DEPTH == 64
    assert scan_limits.PARENT_REASONS == {"oversized", "parent_budget"}
    assert isinstance(InvalidResult("x", reason=scan_limits.OVERSIZED), InvalidResult)
