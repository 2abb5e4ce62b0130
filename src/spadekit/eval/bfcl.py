"""BFCL v4 multi-turn (``bfcl-mt``): the Berkeley Function-Calling Leaderboard's stateful multi-turn
categories, played as spadekit tool-use episodes and scored by BFCL's own checker.

Data, simulated APIs and ``multi_turn_checker`` come from ``bfcl-eval`` (imported lazily). One
item is one BFCL entry. In :class:`BFCLEnv` a reply's ``<tool_call>`` blocks run as BFCL calls
against the episode's own API instances; a reply without calls closes the current request; after
the last request the reward is 1.0 iff BFCL's checker accepts the recorded calls. A request may
take at most ``max_steps_per_turn`` replies (20); reaching it fails the entry with reward 0.
Categories ``base``, ``miss_param``, ``miss_func`` and ``long_context`` follow BFCL's prompting
mode (docs/design/eval.md). Refused calls are not recorded, so the checker replays exactly what
the episode executed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import tempfile
import uuid
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from spadekit.envs.actions import parse_tool_calls
from spadekit.eval.base import EvalError, EvalItem, Suite, SuiteDefaults, safe_score
from spadekit.eval.bfcl_tools import (CallError, encode_call, function_tool, parse_call,
                                      tool_call_text)

__all__ = ["BFCLEnv", "BFCLMultiTurnSuite", "CATEGORIES", "DONE_REPLY", "user_turn_text"]

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23"
MAX_STEPS_PER_TURN = 20
"""Tool-calling replies per user request (BFCL's MAXIMUM_STEP_LIMIT)."""
MAX_USER_TURNS = 8
"""The longest conversation in the four categories (miss_func/miss_param entries)."""
MAX_OBSERVATION_CHARS = 60_000
"""Below the rollout engine's 65,536-character observation limit."""
DONE_REPLY = "<answer>done</answer>"
"""A reply that closes a request (any reply without a tool call does)."""
BFCL_SYSTEM = (
    "You are an assistant that acts through function calls. The user gives you requests one at "
    "a time. To call a function, write "
    '<tool_call>{"name": "FUNCTION_NAME", "arguments": {"ARG": VALUE}}</tool_call>; you may '
    "write several such blocks in one message and they run in order. The results come back in "
    "the next message, so you can keep calling functions. Use only the functions and argument "
    "names you were given, and do not guess values the user did not provide. When the current "
    "request is done, or cannot be done with the functions and information you have, reply "
    "without any tool call (for example <answer>done</answer>); the next request will follow.")
FUNCTIONS_ADDED = (
    "I have made more functions available to you (OpenAI function schemas):\n{schemas}\n"
    "Please continue with my previous request using them.")
STEP_LIMIT = ("[Tool-call limit reached: {n} tool-calling messages for one request. "
              "The task has failed.]")
_EXEC_ERROR = "Error during execution: "


@functools.lru_cache(maxsize=1)
def _bfcl() -> SimpleNamespace:
    """The parts of ``bfcl_eval`` this suite uses, imported once; EvalError when missing."""
    # bfcl_eval's config module mkdirs result/ and score/ under this root; keep it out of trees.
    os.environ.setdefault("BFCL_PROJECT_ROOT",
                          os.path.join(tempfile.gettempdir(), "spadekit-bfcl"))
    try:
        import bfcl_eval
        from bfcl_eval.constants import executable_backend_config as backend
        from bfcl_eval.constants.category_mapping import VERSION_PREFIX
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    except ImportError as exc:
        raise EvalError(f"the bfcl-mt suite needs the bfcl_eval package ({exc}); install it "
                        f"with: {INSTALL_HINT}") from None
    return SimpleNamespace(data=Path(bfcl_eval.__file__).parent / "data", prefix=VERSION_PREFIX,
                           backend=backend, utils=multi_turn_utils, checker=multi_turn_checker)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@functools.lru_cache(maxsize=None)
def _class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    bfcl = _bfcl()
    file = bfcl.backend.MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_read_jsonl(bfcl.data / "multi_turn_func_doc" / file))


@functools.lru_cache(maxsize=None)
def _api_class(class_name: str) -> type:
    module = importlib.import_module(_bfcl().backend.CLASS_FILE_PATH_MAPPING[class_name])
    return getattr(module, class_name)


def _function_docs(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Function name -> BFCL doc, for every API class the entry involves (BFCL's order)."""
    return {doc["name"]: doc for cls in entry["involved_classes"] for doc in _class_docs(cls)}


def _held_out(entry: dict[str, Any]) -> dict[int, list[str]]:
    """miss_func: turn index -> names of the functions that become available at that turn."""
    return {int(turn): [f["name"] if isinstance(f, dict) else str(f) for f in funcs]
            for turn, funcs in (entry.get("missed_function") or {}).items()}


def _offered_at_start(entry: dict[str, Any]) -> list[str]:
    hidden = {name for names in _held_out(entry).values() for name in names}
    hidden |= set(entry.get("excluded_function") or [])
    return [name for name in _function_docs(entry) if name not in hidden]


def user_turn_text(entry: dict[str, Any], index: int) -> str:
    """What the user says at turn ``index``; at a miss_func turn where held-out functions become
    available, their schemas come first (BFCL's held-out turns have no user message)."""
    text = "\n\n".join(str(m.get("content", "")) for m in entry["question"][index]
                       if isinstance(m, dict) and m.get("role", "user") == "user")
    added = _held_out(entry).get(index)
    if added:
        docs, excluded = _function_docs(entry), set(entry.get("excluded_function") or [])
        schemas = [function_tool(docs[n]) for n in added if n in docs and n not in excluded]
        note = FUNCTIONS_ADDED.format(schemas=json.dumps(schemas, ensure_ascii=False))
        text = note + ("\n\n" + text if text else "")
    return text


def _unique_model_name() -> str:
    """BFCL's executor keys API instances by model name: one fresh name per episode/check."""
    return f"spadekit_{uuid.uuid4().hex}"


def _forget(namespace: dict[str, Any], model_name: str) -> None:
    """Drop the API instances BFCL's executor keeps in its module globals for ``model_name``."""
    prefix = model_name + "_"
    for key in [k for k in list(namespace) if k.startswith(prefix)]:
        namespace.pop(key, None)


def _verdict(error_type: str, message: str) -> dict[str, Any]:
    return {"valid": False, "error_type": error_type, "error_message": message[:2000]}


def _shape_problem(completion: Any, n_turns: int) -> str | None:
    """Why ``completion`` is not ``list[turn][step][call string]`` with ``n_turns`` turns."""
    if not isinstance(completion, list):
        return f"completion must be a list of turns, got {type(completion).__name__}"
    if len(completion) != n_turns:
        return f"completion has {len(completion)} turns, the entry has {n_turns}"
    for t, turn in enumerate(completion):
        if not isinstance(turn, list) or not all(isinstance(step, list) for step in turn):
            return f"turn {t} must be a list of steps, each a list of call strings"
        for step in turn:
            for call in step:
                try:
                    parse_call(call)
                except CallError as exc:
                    return f"turn {t}: {exc}"
    return None


def _json_call(call: str, classes: Sequence[type]) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as ``(name, JSON arguments)``; positional arguments are named
    from the API method's signature."""
    name, args, kwargs = parse_call(call)
    if args:
        method = next((getattr(c, name) for c in classes if hasattr(c, name)), None)
        if method is None:
            raise CallError(f"no API method {name!r}")
        params = [p.name for p in inspect.signature(method).parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(args) > len(params):
            raise CallError(f"too many positional arguments in {call!r}")
        kwargs = {**dict(zip(params, args)), **kwargs}
    return name, json.loads(json.dumps(kwargs))


class BFCLMultiTurnSuite(Suite):
    """BFCL v4 multi-turn categories as a suite; see the module docstring."""

    name = "bfcl-mt"
    defaults = SuiteDefaults(k=1, temperature=0.6, top_p=0.95, max_new_tokens=4096,
                             max_turns=MAX_USER_TURNS * (MAX_STEPS_PER_TURN + 1),
                             system_prompt=BFCL_SYSTEM)

    def __init__(self, categories: Sequence[str] = CATEGORIES, *,
                 max_steps_per_turn: int = MAX_STEPS_PER_TURN) -> None:
        if isinstance(categories, str):
            categories = [categories]
        names = [str(c).removeprefix("multi_turn_") for c in categories]
        unknown = [c for c in names if c not in CATEGORIES]
        if unknown or not names:
            raise EvalError(f"unknown BFCL multi-turn categories {unknown}; choose from "
                            f"{', '.join(CATEGORIES)}")
        if max_steps_per_turn < 1:
            raise ValueError("max_steps_per_turn must be >= 1")
        self.categories = tuple(dict.fromkeys(names))
        self.max_steps_per_turn = max_steps_per_turn
        _bfcl()  # fail now, with the install hint, if the package is missing

    def groups(self) -> dict[str, str]:
        return {f"multi_turn_{c}": c for c in self.categories}

    def load_items(self, limit: int | None = None) -> list[EvalItem]:
        bfcl = _bfcl()
        items: list[EvalItem] = []
        for cat in self.categories:
            stem = f"{bfcl.prefix}_multi_turn_{cat}.json"
            entries = _read_jsonl(bfcl.data / stem)
            truth = {row["id"]: row["ground_truth"]
                     for row in _read_jsonl(bfcl.data / "possible_answer" / stem)}
            for entry in entries[: None if limit is None else max(0, limit)]:
                gt = truth[entry["id"]]
                items.append(EvalItem(
                    id=entry["id"], dataset=f"multi_turn_{cat}", group=cat,
                    prompt=user_turn_text(entry, 0), answer=[list(t) for t in gt],
                    data={"category": cat, "entry": entry, "ground_truth": gt}))
        return items

    def check(self, item: EvalItem, completion: Any) -> dict[str, Any]:
        """BFCL's verdict on ``completion`` (``list[turn][step][call string]``):
        ``{"valid", "error_type", "error_message"}``. Never raises; malformed input is invalid
        and never reaches BFCL's executor (which ``eval``\\ s the call strings)."""
        try:
            entry, truth = item.data["entry"], item.data["ground_truth"]
            problem = _shape_problem(completion, len(truth))
            if problem:
                return _verdict("spadekit:malformed_completion", problem)
            bfcl, model_name = _bfcl(), _unique_model_name()
            try:
                result = bfcl.checker(completion, truth, entry, entry["id"].rsplit("_", 1)[0],
                                      model_name)
            finally:
                _forget(vars(bfcl.utils), model_name)
            if result.get("valid") is True:
                return {"valid": True, "error_type": "", "error_message": ""}
            return _verdict(str(result.get("error_type", "")),
                            str(result.get("error_message", "")))
        except Exception as exc:
            return _verdict("spadekit:checker_raised", f"{type(exc).__name__}: {exc}")

    def score(self, item: EvalItem, completion: Any) -> float:
        """1.0 if BFCL's checker accepts ``completion``, else 0.0 (never raises)."""
        return safe_score(lambda: 1.0 if self.check(item, completion)["valid"] is True else 0.0)

    def gold_completion(self, item: EvalItem) -> list[list[list[str]]]:
        """The ground truth in the completion shape: one step per turn holding all its calls."""
        return [[list(turn)] if turn else [] for turn in item.data["ground_truth"]]

    def gold_replies(self, item: EvalItem, *, per_call: bool = True) -> list[str]:
        """Scripted assistant replies that play the ground truth through :class:`BFCLEnv`: for
        each turn, one ``<tool_call>`` reply per call (or, ``per_call=False``, one reply with all
        of the turn's calls), then :data:`DONE_REPLY` to close the turn. Two long_context
        entries (38, 46) have a 34-call turn: play those with ``per_call=False`` (or a larger
        ``max_steps_per_turn``)."""
        classes = [_api_class(c) for c in item.data["entry"]["involved_classes"]]
        replies: list[str] = []
        for turn in item.data["ground_truth"]:
            calls = [_json_call(call, classes) for call in turn]
            if per_call:
                replies.extend(tool_call_text([call]) for call in calls)
            elif calls:
                replies.append(tool_call_text(calls))
            replies.append(DONE_REPLY)
        return replies

    def make_env(self, item: EvalItem, max_turns: int | None = None) -> BFCLEnv:
        """A fresh :class:`BFCLEnv` for ``item``, scored by :meth:`check` at termination."""
        return BFCLEnv(item.data["entry"], lambda calls: self.check(item, calls),
                       max_steps_per_turn=self.max_steps_per_turn, max_turns=max_turns)


class BFCLEnv:
    """One BFCL entry as a text environment (Gymnasium contract over ``str``; see the module
    docstring). ``checker(completion) -> {"valid": bool, ...}`` scores the recorded calls."""

    def __init__(self, entry: dict[str, Any], checker: Callable[[list], dict[str, Any]], *,
                 max_steps_per_turn: int = MAX_STEPS_PER_TURN, max_turns: int | None = None,
                 max_observation_chars: int = MAX_OBSERVATION_CHARS,
                 max_calls_per_step: int = 64) -> None:
        if max_steps_per_turn < 1 or (max_turns is not None and max_turns < 1):
            raise ValueError("max_steps_per_turn and max_turns must be >= 1")
        self._bfcl = _bfcl()
        self.entry = entry
        self.checker = checker
        self.max_steps_per_turn = max_steps_per_turn
        self.max_turns = max_turns
        self.max_observation_chars = max(1000, max_observation_chars)
        self.max_calls_per_step = max(1, max_calls_per_step)
        self.n_turns = len(entry["question"])
        self.last_check: dict[str, Any] | None = None
        self._docs = _function_docs(entry)
        self._held = _held_out(entry)
        self._excluded = set(entry.get("excluded_function") or [])
        test_category = entry["id"].rsplit("_", 1)[0]
        self._long_context = "long_context" in test_category or "composite" in test_category
        self._offered = _offered_at_start(entry)
        self._callable = set(self._docs) - self._excluded
        self._model_name = ""
        self._finalizer: weakref.finalize | None = None
        self._turn = self._turn_steps = self._steps = 0
        self._record: list[list[list[str]]] = [[] for _ in range(self.n_turns)]
        self._done = True

    # -- Gymnasium contract ---------------------------------------------------------------

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI schemas of the functions offered now (at reset: all of the entry's APIs'
        functions except excluded and held-out ones)."""
        return [function_tool(self._docs[name]) for name in self._offered]

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[str, dict[str, Any]]:
        self.close()
        self._model_name = _unique_model_name()
        self._finalizer = weakref.finalize(self, _forget, vars(self._bfcl.utils),
                                           self._model_name)
        self._execute([])  # instantiate this episode's APIs from the entry's initial_config
        self._offered = _offered_at_start(self.entry)
        self._turn = self._turn_steps = self._steps = 0
        self._record = [[] for _ in range(self.n_turns)]
        self._done, self.last_check = False, None
        return self._cap(self._open_turn(0)), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            return "", 0.0, True, False, self._info()
        self._steps += 1
        lines = self._run_calls(action if isinstance(action, str) else str(action))
        if not lines:  # no tool call: the current request is over
            return self._close_turn("")
        self._turn_steps += 1
        text = "\n".join(lines)
        if self._turn_steps >= self.max_steps_per_turn:  # BFCL fails the entry here
            self._done = True
            self.close()
            verdict = _verdict("spadekit:step_limit", STEP_LIMIT.format(n=self._turn_steps))
            self.last_check = verdict
            return (self._cap(text + "\n\n" + STEP_LIMIT.format(n=self._turn_steps)), 0.0,
                    True, False, self._info(verdict))
        return self._go_on(text)

    def close(self) -> None:
        """Release this episode's API instances (also done at termination and on reset)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None

    def completion(self) -> list[list[list[str]]]:
        """The calls executed so far, as ``list[turn][step][call string]`` (BFCL's shape)."""
        return [[list(step) for step in turn] for turn in self._record]

    # -- internals ------------------------------------------------------------------------

    def _info(self, verdict: dict[str, Any] | None = None) -> dict[str, Any]:
        info: dict[str, Any] = {"id": self.entry["id"], "user_turn": self._turn,
                                "user_turns": self.n_turns, "turn_steps": self._turn_steps}
        if verdict is not None:
            info.update(valid=verdict.get("valid") is True,
                        error_type=str(verdict.get("error_type", "")),
                        calls=self.completion())
        return info

    def _open_turn(self, index: int) -> str:
        for name in self._held.get(index, []):
            if name in self._docs and name not in self._excluded and name not in self._offered:
                self._offered.append(name)
        return user_turn_text(self.entry, index)

    def _go_on(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        truncated = self.max_turns is not None and self._steps >= self.max_turns
        if truncated:
            self._done = True
            self.close()
        return self._cap(text), 0.0, False, truncated, self._info()

    def _close_turn(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._turn += 1
        self._turn_steps = 0
        if self._turn < self.n_turns:
            following = self._open_turn(self._turn)
            return self._go_on(f"{text}\n\n{following}" if text else following)
        self._done = True
        self.close()
        try:
            verdict = self.checker(self.completion())
        except Exception as exc:  # a checker must not raise; if it does, the episode fails
            verdict = _verdict("spadekit:checker_raised", f"{type(exc).__name__}: {exc}")
        self.last_check = verdict
        reward = 1.0 if verdict.get("valid") is True else 0.0
        return self._cap(text), reward, True, False, self._info(verdict)

    def _execute(self, calls: list[str]) -> list[str]:
        results, _ = self._bfcl.utils.execute_multi_turn_func_call(
            calls, self.entry["initial_config"], self.entry["involved_classes"],
            self._model_name, self.entry["id"], long_context=self._long_context,
            is_evaL_run=False)
        return [str(r) for r in results]

    def _run_calls(self, action: str) -> list[str]:
        """Run the reply's tool calls; one JSON line per ``<tool_call>`` block (none: [])."""
        parsed = parse_tool_calls(action, strict=False, limit=self.max_calls_per_step)
        errors = {e.index: str(e) for e in parsed.errors}
        calls = iter(parsed.calls)
        plan: list[tuple[str, str | None, str | None]] = []  # (name, call string, error)
        for index in range(len(parsed.calls) + len(parsed.errors)):
            if index in errors:
                plan.append(("", None, errors[index]))
                continue
            call = next(calls)
            if call.name not in self._callable:
                plan.append((call.name, None, f"unknown function {call.name!r}: it is not one "
                                              "of the available tools"))
                continue
            try:
                plan.append((call.name, encode_call(call.name, call.arguments), None))
            except CallError as exc:
                plan.append((call.name, None, str(exc)))
        runnable = [code for _, code, _ in plan if code is not None]
        results: list[str] = []
        if runnable:
            try:
                results = self._execute(runnable)
            except Exception as exc:  # BFCL catches call errors itself; this is a last resort
                results = [f"{_EXEC_ERROR}{type(exc).__name__}: {exc}"] * len(runnable)
            self._record[self._turn].append(runnable)
        budget = max(500, self.max_observation_chars // max(1, len(plan)))
        outputs = iter(results)
        lines = []
        for name, code, error in plan:
            if code is None:
                lines.append(json.dumps({"tool": name, "error": error} if name
                                        else {"error": error}, ensure_ascii=False))
            else:
                lines.append(_result_line(name, next(outputs, _EXEC_ERROR + "no result"),
                                          budget))
        if lines and action.lower().count("<tool_call>") > len(plan):
            lines.append(json.dumps({"error": f"only the first {self.max_calls_per_step} tool "
                                              "calls of a message are run"}))
        return lines

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_observation_chars:
            return text
        note = f"\n[observation cut: {len(text)} characters]"
        return text[: self.max_observation_chars - len(note)] + note


def _result_line(name: str, result: str, budget: int) -> str:
    """``{"tool": name, "result": ...}`` (JSON results embedded as JSON) or ``"error"``."""
    key, value = ("error", result[len(_EXEC_ERROR):]) if result.startswith(_EXEC_ERROR) else (
        "result", result)
    payload: Any = value
    if len(value) > budget:
        payload = value[:budget] + f" ...[{len(value) - budget} more characters cut]"
    elif key == "result" and value.startswith(("{", "[")):
        try:
            payload = json.loads(value)
        except ValueError:
            pass
    return json.dumps({"tool": name, key: payload}, ensure_ascii=False)
