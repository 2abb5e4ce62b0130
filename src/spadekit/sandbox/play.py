"""Play one episode of a program in the sandbox, from any source of actions.

Used by ``spadekit play`` and ``spadekit library``: a person at the terminal, a fixed script,
the program's own ``solution()``, or a garbage baseline. The transcript records the
observations, actions, rewards, flags and any typed failure; the return follows SPEC point 4
(the last reward if the episode terminated, else 0). The batched, token-exact engine that
models use lives in ``spadekit.rollout.engine``; this module is for single episodes.
"""

from __future__ import annotations

import json
import random
import time
from typing import Callable, Iterable, Union

from spadekit.envs.actions import format_tool_call
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import SandboxError
from spadekit.common.safe_text import terminal_text
from spadekit.sandbox.pool import SandboxPool

ActionSource = Callable[[str, int], Union[str, None]]
"""Given the latest observation and the turn index, the next action, or None to stop."""

GARBAGE = {
    "games": ["", "hello", "\\boxed{}", "\\boxed{1}", "\\boxed{test}", "\\boxed{42}",
              "\\boxed{left}", "no idea", "\\boxed{0 0}", "}{"],
    "tooluse": ["", "hello", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                "<tool_call>{bad json}</tool_call>", "\\boxed{1}",
                "<answer>done</answer>"],
}


def episode_return(last_reward: float | None, terminated: bool) -> float:
    """SPEC point 4: the last step's reward if the episode terminated, else 0."""
    return float(last_reward) if terminated and last_reward is not None else 0.0


def with_hint(observation: str, hint: str | None) -> str:
    """SPADE's hint placement, first observation only: ``"{observation}\\n\\nHINT: {hint}"``."""
    return f"{observation}\n\nHINT: {hint}" if hint else observation


def scripted_source(actions: Iterable[str]) -> ActionSource:
    it = iter(list(actions))
    return lambda _obs, _turn: next(it, None)


def garbage_source(setting: str, seed: int) -> ActionSource:
    rng = random.Random(seed)
    pool = GARBAGE.get(setting, GARBAGE["games"])
    return lambda _obs, _turn: rng.choice(pool)


def shorthand(text: str, tooluse: bool) -> str:
    """Interactive convenience: wrap plain game commands in \\boxed{}; turn ``name {json}``
    into a tool call and ``done`` into the final answer."""
    text = text.strip()
    if not tooluse:
        return text if "\\boxed{" in text else f"\\boxed{{{text}}}"
    if text.lower() == "done":
        return "<answer>done</answer>"
    if text.startswith("<"):
        return text
    name, _, args = text.partition(" ")
    try:
        arguments = json.loads(args) if args.strip() else {}
    except ValueError:
        return text
    return format_tool_call(name, arguments) if isinstance(arguments, dict) else text


def interactive_source(console, raw: bool = False) -> ActionSource:
    state = {"tooluse": False}

    def ask(_obs: str, turn: int) -> str | None:
        try:
            text = console.input(f"[bold cyan]action {turn + 1}>[/bold cyan] ")
        except (EOFError, KeyboardInterrupt):
            return None
        if text.strip() in (":q", ":quit"):
            return None
        return text if raw else shorthand(text, state["tooluse"])

    ask.state = state  # type: ignore[attr-defined]
    return ask


class Episode:
    """One episode of ``program`` in a fresh sandbox from ``pool``."""

    def __init__(self, pool: SandboxPool, program: EnvProgram, seed: int | None = None,
                 hint: str | None = None, max_turns: int = 12) -> None:
        self.pool = pool
        self.program = program
        self.seed = seed
        self.hint = hint
        self.max_turns = max_turns

    def run(self, source: ActionSource | str, show=None) -> dict:
        t0 = time.monotonic()
        out: dict = {"class_name": None, "seed": self.seed, "hint": self.hint,
                     "initial_observation": None, "turns": [], "terminated": False,
                     "truncated": False, "return": 0.0, "error": None, "tools": None}
        sb = None
        try:
            sb = self.pool.acquire(self.program.code)
            out["class_name"] = sb.program["class_name"]
            env = sb.new_env(max_turns=self.max_turns)
            cap = min(self.max_turns, env.max_turns or self.max_turns)
            obs, _info = env.reset(seed=self.seed)
            if sb.program["has_tools"]:
                out["tools"] = [t.get("function", {}).get("name") for t in env.tools()]
                if hasattr(source, "state"):
                    source.state["tooluse"] = True
            obs = with_hint(obs, self.hint)
            out["initial_observation"] = obs
            if show is not None:
                show.rule(f"{terminal_text(out['class_name'])}  seed={self.seed}")
                show.print(terminal_text(obs, markup=False), markup=False, highlight=False)
            if source == "solution":
                source = scripted_source(env.solution())
            last = None
            for turn in range(cap):
                action = source(obs, turn)
                if action is None:
                    break
                obs, reward, term, trunc, info = env.step(action)
                last = reward
                out["turns"].append({"action": action, "observation": obs, "reward": reward,
                                     "terminated": term, "truncated": trunc, "info": info})
                if show is not None:
                    show.print(f"[dim]> {terminal_text(action)}[/dim]", highlight=False)
                    show.print(terminal_text(obs, markup=False), markup=False, highlight=False)
                    show.print(f"[yellow]reward {reward:g}[/yellow]"
                               + (" [green]terminated[/green]" if term else "")
                               + (" [magenta]truncated[/magenta]" if trunc else ""))
                if term or trunc:
                    out["terminated"], out["truncated"] = term, trunc
                    break
            else:
                out["truncated"] = True  # the runner's cap
            out["return"] = episode_return(last, out["terminated"])
        except SandboxError as exc:
            out["error"] = exc.to_dict()
            out["return"] = 0.0
        finally:
            if sb is not None:
                out["output_tail"] = sb.output_tail()[-2000:]
                self.pool.release(sb)
        out["seconds"] = round(time.monotonic() - t0, 3)
        return out
