"""``ToolUseBaseEnv``: the tool-use base class of the SPADE reference contract, for programs written
against it (pre-loaded by name, or imported as ``tool_use_base_env``; see ``spadekit.envs.compat``).

A subclass sets ``self._tools``, ``self._state`` and ``self._expected_answer`` in ``reset`` and
implements ``tool_<name>`` methods and ``solution()``; the base class owns ``step()`` with the
reference's episode rules (docs/design/envs.md): a correct ``<answer>`` ends with 1.0, one tool
call per turn, the turn reaching ``max_turns`` truncates. One deliberate difference: a format
error scores 0.0, not -0.1, since spadekit rewards lie in [0, 1] (SPEC point 1). ``tools()``
returns the schemas as written (the parent normalises and checks them). Standard library only.
"""

import json
import re

from spadekit.envs import schemas

__all__ = ["ToolUseBaseEnv"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FORMAT_ERROR = ("Format error: call a tool with <tool_call>{\"name\": ..., \"arguments\": "
                "{...}}</tool_call>, or submit with <answer>result</answer>.")


class ToolUseBaseEnv:
    """Base class of reference-style tool-use environments (see the module docstring)."""

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self._tools = {}
        self._state = {}
        self._call_history = []
        self._expected_answer = None
        self.reset()

    def reset(self, seed=None):
        raise NotImplementedError("a ToolUseBaseEnv subclass implements reset()")

    def solution(self):
        raise NotImplementedError("a ToolUseBaseEnv subclass implements solution()")

    # ----- tools ------------------------------------------------------------------------------
    def get_tools(self):
        """Nested OpenAI schemas of ``self._tools`` (as written when it is not a dict)."""
        if not isinstance(self._tools, dict):
            return self._tools
        return [{"type": "function", "function": {
            "name": name, "description": info.get("description", ""),
            "parameters": info.get("parameters", {"type": "object", "properties": {}})}}
            if isinstance(info, dict) else info for name, info in self._tools.items()]

    def tools(self):
        """What spadekit asks for: a subclass's own ``get_tools()``, else ``self._tools`` as
        written; the sandbox's parent side normalises and checks either (``envs.refstyle``)."""
        if type(self).get_tools is not ToolUseBaseEnv.get_tools:
            return self.get_tools()
        return self._tools

    def _run_tool(self, name, arguments):
        method = getattr(self, "tool_" + str(name), None)
        if method is None or not callable(method):
            return None
        try:
            result = method(**arguments)
        except Exception as exc:  # shown to the agent, as the reference does
            return "Error calling %s: %s" % (name, exc)
        self._call_history.append({"name": name, "arguments": arguments, "result": str(result)})
        return result

    def execute_tool(self, name, arguments):
        """Run one pre-parsed call: ``{"output": str, "returncode": 0 or 1}``."""
        if getattr(self, "tool_" + str(name), None) is None:
            return {"output": "Unknown tool '%s'" % name, "returncode": 1}
        result = self._run_tool(name, dict(arguments or {}))
        failed = isinstance(result, str) and result.startswith("Error calling ")
        return {"output": str(result), "returncode": 1 if failed else 0}

    # ----- episode ----------------------------------------------------------------------------
    def _reveal(self, text):
        try:
            shown = str(self.solution())
        except Exception as exc:  # solution() must not turn a truncation into a crash
            shown = "(solution unavailable: %s)" % type(exc).__name__
        return "%s\n\nTime up. Solution:\n%s" % (text, shown) if text else \
            "Time up. Solution:\n%s" % shown

    def step(self, action):
        self.turn_count += 1
        truncated = self.turn_count >= self.max_turns
        text = action if isinstance(action, str) else str(action)
        answer = _ANSWER.search(text)
        if answer:
            if self._check_answer(answer.group(1).strip()):
                return "Correct!", 1.0, True, False, {}
            if truncated:
                return self._reveal("Wrong answer."), 0.0, False, True, {}
            return self._incorrect_answer_feedback(), 0.0, False, False, {}
        call = _CALL.search(text)
        if not call:
            return ((self._reveal(""), 0.0, False, True, {}) if truncated
                    else (FORMAT_ERROR, 0.0, False, False, {}))
        try:
            parsed = json.loads(call.group(1))
            name = parsed.get("name", "")
            arguments = parsed.get("arguments", {})
            if not isinstance(arguments, dict):
                arguments = {}
        except (ValueError, AttributeError):
            return ((self._reveal(""), 0.0, False, True, {}) if truncated
                    else ("Format error: the tool call is not valid JSON.", 0.0, False, False,
                          {}))
        if getattr(self, "tool_" + str(name), None) is None:
            known = ", ".join(schemas.tool_names(self._tools))
            obs = "Unknown tool '%s'. Available: %s" % (name, known)
        else:
            obs = "Tool result:\n%s" % (self._run_tool(name, arguments),)
        if truncated:
            return self._reveal(obs), 0.0, False, True, {}
        return obs, 0.0, False, False, {}

    def _incorrect_answer_feedback(self):
        """Wrong-answer text; multi-step tasks (``_user_messages`` + ``_current_msg``) name the
        step still open."""
        messages = getattr(self, "_user_messages", None)
        index = getattr(self, "_current_msg", None)
        if isinstance(messages, (list, tuple)) and isinstance(index, int) \
                and 0 <= index < len(messages):
            return ("Incorrect. Step %d of %d is not complete yet: \"%s\" Finish it with the "
                    "tools, then submit <answer>done</answer>." % (index + 1, len(messages),
                                                                   messages[index]))
        return "Incorrect. Keep using tools."

    def _check_answer(self, answer):
        given, expected = str(answer).strip(), str(self._expected_answer).strip()
        if given.lower() == expected.lower():
            return True
        try:
            return abs(float(given.replace("$", "").replace(",", "")) -
                       float(expected.replace("$", "").replace(",", ""))) < 0.01
        except (TypeError, ValueError):
            return False

    def _obs_suffix(self):
        """Kept for programs that still call it; tools reach the agent as schemas."""
        return ""

    def close(self):
        pass
