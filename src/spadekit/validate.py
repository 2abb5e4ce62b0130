"""Staged validation of environment programs, each stage run in the sandbox under a deadline.

extract -> syntax -> load -> interface -> determinism -> solution -> not_trivially_won -> ends
(+ ``tools`` for tool-use programs, SPEC point 3). The result is a ``ValidationReport`` with
``ok``, the ``stage`` reached, a short stable ``reason`` code and a human ``message``; ``details``
holds what each stage found (timings, class name, max_turns, solution length, how episodes end).

A program that hangs gets reason ``timeout`` (the designer reward turns that into -0.5 and a
blacklist entry); anything else invalid gets its own code and is never played.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from spadekit.envs.extract import ExtractionError, extract_program
from spadekit.envs.program import EnvProgram
from spadekit.errors import EnvRaised, InvalidResult, SandboxError
from spadekit.sandbox.pool import SandboxPool
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox
from spadekit.envs import pyparse

STAGES = ("extract", "syntax", "load", "interface", "tools", "determinism", "solution",
          "not_trivially_won", "ends")

GAME_PROBES = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}", "", "hello",
               "\\boxed{}", "}{\\boxed{{", "\\boxed{" + "9" * 300 + "}")
TOOL_PROBES = ('<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
               "<tool_call>not json</tool_call>", "hello", "\\boxed{1}", "",
               '<tool_call>{"name": 3}</tool_call>')
ANSWER = "<answer>done</answer>"
DEFAULT_SEEDS = (0, 1, 2)


@dataclass
class ValidationReport:
    ok: bool
    stage: str
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    program: EnvProgram | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["program"] = None if self.program is None else {
            "sha256": self.program.sha256, "class_name": self.program.class_name,
            "hint": self.program.hint}
        return out


@dataclass(frozen=True)
class ValidatorSettings:
    max_turns: int = 12
    """Passed to the constructor; also the runner's cap for programs without ``max_turns``."""
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    """Seeds for solution replay, garbage play and the tool-use structural check."""
    total_timeout: float = 60.0
    """Budget for one program's whole validation."""


class _Fail(Exception):
    def __init__(self, stage: str, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.stage, self.reason, self.message, self.details = stage, reason, message, details


def to_program(source: str | EnvProgram) -> EnvProgram:
    """Accept a program or raw model output (bare code is raw output too: its module-level
    ``HINT`` literal is picked up); raw text goes through ``extract_program``."""
    return source if isinstance(source, EnvProgram) else extract_program(source).to_program()


class Validator:
    """Validates programs against the contract; owns a pool unless one is given."""

    def __init__(self, pool: SandboxPool | None = None,
                 settings: ValidatorSettings | None = None) -> None:
        self._own_pool = pool is None
        self.pool = pool or SandboxPool(warm=2)
        self.settings = settings or ValidatorSettings()

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> "Validator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def validate_many(self, sources: list[str | EnvProgram], workers: int = 2
                      ) -> list[ValidationReport]:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            return list(ex.map(self.validate, sources))

    def validate(self, source: str | EnvProgram) -> ValidationReport:
        details: dict[str, Any] = {"timings_ms": {}}
        program: EnvProgram | None = None
        stage = "extract"
        sb: Sandbox | None = None
        clock = time.monotonic()
        try:
            try:
                program = to_program(source)
            except ExtractionError as exc:
                raise _Fail("extract", exc.reason, str(exc)) from None
            details["timings_ms"]["extract"] = _ms(clock)
            stage = "syntax"
            try:
                pyparse.parse(program.code)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                raise _Fail("syntax", "syntax", f"{type(exc).__name__}: {exc}",
                            line=getattr(exc, "lineno", None)) from None
            stage = "load"
            t = time.monotonic()
            try:
                sb = self.pool.acquire(program.code)
            except SandboxError as exc:
                raise _Fail("load", exc.reason, exc.message, **_err(exc)) from None
            if program.class_name not in (None, sb.program["class_name"]):
                details["class_name_given"] = program.class_name
            details.update(class_name=sb.program["class_name"],
                           has_solution=sb.program["has_solution"],
                           has_tools=sb.program["has_tools"])
            env = _checked(stage, lambda: sb.new_env(max_turns=self.settings.max_turns))
            details["max_turns"] = env.max_turns
            details["timings_ms"]["load"] = _ms(t)
            tooluse = program.domain == "tooluse" or (program.domain is None
                                                      and sb.program["has_tools"])
            details["domain"] = "tooluse" if tooluse else "games"
            run = _Runner(self, env, clock)
            for stage, fn in (("interface", run.interface), ("tools", run.tools),
                              ("determinism", run.determinism), ("solution", run.solution),
                              ("not_trivially_won", run.not_trivially_won), ("ends", run.ends)):
                if stage == "tools" and not tooluse:
                    continue
                t = time.monotonic()
                details.update(fn(tooluse) or {})
                details["timings_ms"][stage] = _ms(t)
            if program.class_name != details["class_name"]:
                program = dataclasses.replace(program, class_name=details["class_name"])
            return ValidationReport(True, "done", "ok", "valid", details, program)
        except _Fail as fail:
            details.update(fail.details)
            return ValidationReport(False, fail.stage, fail.reason, fail.message, details,
                                    program)
        finally:
            if sb is not None:
                if sb.alive:
                    details["output_tail"] = sb.output_tail()[-2000:]
                self.pool.release(sb)
            details["timings_ms"]["total"] = _ms(clock)


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 2)


def _err(exc: SandboxError) -> dict[str, Any]:
    return {"error": exc.to_dict()}


def _checked(stage: str, fn):
    """Run one sandbox call; a typed failure becomes this stage's failure."""
    try:
        return fn()
    except SandboxError as exc:
        raise _Fail(stage, exc.reason, exc.message, **_err(exc)) from None


class _Runner:
    """The probes of one validation, sharing one environment instance."""

    def __init__(self, validator: Validator, env: RemoteEnv, clock: float) -> None:
        self.env = env
        self.settings = validator.settings
        self.clock = clock
        self.cap = env.max_turns or self.settings.max_turns

    def _budget(self, stage: str) -> None:
        if time.monotonic() - self.clock > self.settings.total_timeout:
            raise _Fail(stage, "timeout", f"validation exceeded its total budget of "
                        f"{self.settings.total_timeout:g}s")

    def _reset(self, stage: str, seed: int) -> str:
        obs, _info = _checked(stage, lambda: self.env.reset(seed=seed))
        if not obs.strip():
            raise _Fail(stage, "empty_observation", f"reset(seed={seed}) returned an empty "
                        "observation")
        return obs

    def _play(self, stage: str, seed: int, actions) -> list[tuple]:
        """Reset with ``seed`` and play ``actions`` until the episode ends; returns the reset
        observation and the step tuples (without info)."""
        trace = [(self._reset(stage, seed),)]
        for action in actions:
            self._budget(stage)
            obs, reward, term, trunc, _ = _checked(stage, lambda a=action: self.env.step(a))
            trace.append((obs, reward, term, trunc))
            if term or trunc:
                break
        return trace

    def _probe(self, stage: str, seed: int, actions) -> list[tuple]:
        """Send every action, starting a new episode (next seed) whenever one ends, so that an
        environment that ends early still meets every probe. Returns the step tuples."""
        steps: list[tuple] = []
        self._reset(stage, seed)
        live = True
        for action in actions:
            if not live:
                seed += 1
                self._reset(stage, seed)
            self._budget(stage)
            obs, reward, term, trunc, _ = _checked(stage, lambda a=action: self.env.step(a))
            steps.append((seed, obs, reward, term, trunc))
            live = not (term or trunc)
        return steps

    def interface(self, tooluse: bool) -> dict:
        self._probe("interface", 42, TOOL_PROBES if tooluse else GAME_PROBES)
        self._reset("interface", 123)
        return {}

    def tools(self, tooluse: bool) -> dict:
        names: list[str] = []
        for seed in self.settings.seeds:
            self._reset("tools", seed)
            schemas = _checked("tools", self.env.tools)
            problem = _schema_problem(schemas)
            if problem:
                raise _Fail("tools", "bad_tools", f"tools() after reset(seed={seed}): {problem}")
            names = [s["function"]["name"] for s in schemas]
            _o, reward, _te, _tr, _i = _checked("tools", lambda: self.env.step(ANSWER))
            if reward >= 1.0:
                raise _Fail("tools", "criteria_trivial", f"answering at once after reset(seed="
                            f"{seed}) already scores 1.0: the success criteria check nothing")
        return {"tools": names}

    def _actions(self, tooluse: bool, seed: int) -> list[str]:
        probes = list(TOOL_PROBES if tooluse else GAME_PROBES)
        return [probes[(i + seed) % len(probes)] for i in range(self.cap)]

    def determinism(self, tooluse: bool) -> dict:
        seed = self.settings.seeds[0] + 7
        actions = self._actions(tooluse, seed)[:6]
        first = self._play("determinism", seed, actions)
        second = self._play("determinism", seed, actions)
        if first != second:
            at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b) \
                if len(first) == len(second) else min(len(first), len(second))
            raise _Fail("determinism", "nondeterministic", "the same seed and actions gave a "
                        f"different {'reset observation' if at == 0 else f'step {at} result'}; "
                        "use random.Random(seed) for all randomness", first_difference=at)
        return {}

    def solution(self, tooluse: bool) -> dict:
        if not self.env.sandbox.program.get("has_solution"):
            return {"solution": "absent"}
        turns = []
        for seed in self.settings.seeds:
            self._reset("solution", seed)
            try:
                actions = self.env.solution()
            except InvalidResult as exc:
                raise _Fail("solution", "solution_fails", exc.message) from None
            except EnvRaised as exc:
                if exc.exc_type == "NotImplementedError":
                    return {"solution": "absent"}
                raise _Fail("solution", "solution_fails", f"solution() failed: {exc.message}",
                            **_err(exc)) from None
            except SandboxError as exc:
                raise _Fail("solution", "solution_fails" if exc.reason == "env_raised"
                            else exc.reason, f"solution() failed: {exc.message}",
                            **_err(exc)) from None
            if len(actions) > self.cap:
                raise _Fail("solution", "solution_fails", f"solution() for seed {seed} has "
                            f"{len(actions)} actions, more than max_turns={self.cap}")
            trace = self._play("solution", seed, actions)
            last = trace[-1]
            if len(last) < 4 or last[1] < 1.0 or not last[2]:
                got = "no steps" if len(last) < 4 else (f"reward {last[1]:g}, terminated="
                                                        f"{last[2]}")
                raise _Fail("solution", "solution_fails", f"replaying solution() for seed {seed} "
                            f"does not reach reward 1.0 ({got} after {len(trace) - 1} of "
                            f"{len(actions)} actions)", seed=seed)
            turns.append(len(trace) - 1)
        return {"solution": "replayed", "solution_turns": turns}

    def not_trivially_won(self, tooluse: bool) -> dict:
        best = 0.0
        for seed in self.settings.seeds[:2]:
            for i, (played, _obs, reward, _te, _tr) in enumerate(
                    self._probe("not_trivially_won", seed, self._actions(tooluse, seed))):
                best = max(best, reward)
                if reward >= 1.0:
                    raise _Fail("not_trivially_won", "trivially_won", f"garbage actions reached "
                                f"reward 1.0 (seed {played}, garbage action {i + 1})")
        return {"garbage_best_reward": best}

    def ends(self, tooluse: bool) -> dict:
        seed = self.settings.seeds[-1]
        trace = self._play("ends", seed, self._actions(tooluse, seed))
        last = trace[-1]
        if len(last) == 4 and (last[2] or last[3]):
            how = "terminated" if last[2] else "truncated"
            return {"ends": f"{how} after {len(trace) - 1} steps"}
        return {"ends": f"runner_cap: the program did not end the episode within {self.cap} "
                        "steps; the runner's own cap applies"}


def _schema_problem(schemas: list) -> str | None:
    if not schemas:
        return "no tools"
    for i, s in enumerate(schemas):
        fn = s.get("function") if isinstance(s, dict) else None
        if s.get("type") != "function" or not isinstance(fn, dict):
            return f"schema {i} is not {{'type': 'function', 'function': {{...}}}}"
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            return f"schema {i} has no name"
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict) or params.get("type") != "object":
            return f"tool {fn['name']!r}: parameters must be a JSON schema of type object"
    return None
