"""Staged validation of environment programs, each stage run in the sandbox under a deadline.

extract -> syntax -> load -> interface (+ ``tools``) -> determinism -> solution -> lockstep ->
action_dependent -> ends. The result is a ``ValidationReport``: ``ok``, the ``stage`` reached, a
stable ``reason`` code (``timeout``, ``nondeterministic``, ``no_solution``, ``solution_fails``,
``action_independent``, ``trivially_won``, ``slow``, ``oversized``, ``parent_budget``...), a
human ``message`` and per-stage ``details``. Validation cannot be recognised by a program: one
drawn ``validation_seed`` fixes every reset seed, garbage action and probe order (and repeats a
validation exactly), and the scored episodes run interleaved with decoys in one lockstep batch,
as training plays. The parent's reads of what a program returns are metered apart, linear and
capped. ``play_seeds`` adds seeds a caller will play on. Reason codes in detail:
docs/design/sandbox.md.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from spadekit.envs.extract import ExtractionError, extract_program
from spadekit.envs.program import EnvProgram
from spadekit.common.config_fields import Bool, Count, Int, PosInt, Positive, Unit, section
from spadekit.common.errors import ConfigError, SandboxError
from spadekit.sandbox.probes import (ANSWER, GAME_EDGE_PROBES, TOOL_EDGE_PROBES, advertised_actions,
                             garbage_action, garbage_actions, merge_advertised, mutate,
                             tool_probes)
from spadekit.sandbox.validate_episodes import BASELINE_EPISODES, EpisodeChecks, _err, _Fail
from spadekit.sandbox.pool import SandboxPool
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox
from spadekit.envs import pyparse, refstyle
from spadekit.envs.scan_limits import PARENT_BUDGET, ParentMeter, parent_work

__all__ = ["ANSWER", "BASELINE_EPISODES", "DEFAULT_SEEDS", "GAME_PROBES", "STAGES", "TOOL_PROBES", "ValidationReport",
           "Validator", "ValidatorSettings", "garbage_actions", "to_program", "turn_cap"]

STAGES = ("extract", "syntax", "load", "interface", "tools", "determinism", "solution",
          "lockstep", "action_dependent", "ends")

GAME_PROBES = GAME_EDGE_PROBES
TOOL_PROBES = TOOL_EDGE_PROBES
DEFAULT_SEEDS = (0, 1, 2)
SEED_SPACE = 2 ** 31
"""Drawn reset seeds are in ``range(SEED_SPACE)``; validation seeds are 63-bit."""
PARENT_BUDGET_S = 30.0
"""Seconds of parent-side reading (``scan_limits.parent_work``) one validation may spend, on
top of ``total_timeout`` (which counts the rest); past it the program fails ``parent_budget``."""


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


@section(knob="ValidatorSettings")
class ValidatorSettings:
    """How programs are checked.

    - ``max_turns``: passed to the constructor, and the turn cap: a program's own smaller
      ``max_turns`` is used, a larger one is clamped to this, one below 1 is ignored.
    - ``seeds``: fixed seeds for the solution replay and the tool-use structural check (SPEC
      point 3 uses 0, 1, 2).
    - ``drawn_seeds``: seeds drawn per validation on which the tool-use structural check runs
      too (criteria met by answering at once only off the fixed seeds are found).
    - ``solution_drawn_seeds``: seeds drawn per validation on which ``solution()`` must reach
      full score too, besides the fixed ``seeds``; the baselines play the same seeds.
    - ``require_solution``: refuse a program without a replayable ``solution()`` (reason
      ``no_solution``). Off for programs of the reference's contract (prose solutions): those
      are checked by the absolute garbage criterion only (garbage must never reach 1.0).
    - ``action_margin``: the solution's mean return must exceed the garbage's mean return, on
      the same seeds, by at least this much (0.5: "0.6 for any action" is refused);
    - ``random_margin``: ... and the random policy's (random advertised commands and numbers)
      by at least this much (0.25: random valid moves earn partial credit in an honest game).
      The baselines play the drawn seeds (``BASELINE_EPISODES`` of each per seed; the fixed,
      public seeds get garbage episodes too, recorded only).
    - ``blind_episodes``: fresh drawn seeds on which the leading blind replies (an advertised
      action replied every turn; a solved seed's solution replayed on other seeds) are
      measured; the printed one's mean must be ``random_margin`` below the solution's too.
      ``details`` gets ``blind_mean_return``/``blind_reply`` and ``chance_return`` (the best
      of the blind, garbage and random-policy means: ``reward.above_chance`` reads it).
    - ``total_timeout``: budget in seconds for one program's whole validation.
    - ``garbage_episodes``: episodes of drawn garbage when there is no solution to pair them
      with (each on a drawn seed, until the program ends it or the turn cap); the first is
      also the determinism check's reference episode.
    - ``lockstep_instances``: the scored episodes are played interleaved in one worker, at least
      this many at once (filled up with garbage episodes): at least a training group.
    - ``decoy_instances``: before the scored checks, a number of instances drawn from 0 to this
      is created and played a little, so that no instance count marks them.
    - ``slow_step_s`` / ``slow_steps``: a program with ``slow_steps`` resets or steps slower than
      ``slow_step_s`` seconds each is refused (reason ``slow``), well before the per-call
      deadline or the total budget run out.
    - ``turn_budget_s``: a lockstep turn on which the worker spent longer than this on all its
      instances' steps together is slow; ``slow_steps`` of them (or every turn, when there are
      fewer) refuse the program (reason ``slow``): play waits for the worker's whole turn.
    """

    max_turns: PosInt = 12
    seeds: Annotated[tuple[Int, ...], Field(min_length=1)] = DEFAULT_SEEDS
    total_timeout: Positive = 60.0
    drawn_seeds: Count = 1
    garbage_episodes: PosInt = 2
    slow_step_s: Positive = 0.5
    slow_steps: PosInt = 3
    solution_drawn_seeds: Count = 3
    require_solution: Bool = True
    action_margin: Unit = 0.5
    random_margin: Unit = 0.25
    blind_episodes: Count = 16
    lockstep_instances: PosInt = 8
    decoy_instances: Count = 6
    turn_budget_s: Positive = 2.0


def to_program(source: str | EnvProgram) -> EnvProgram:
    """Accept a program or raw model output (bare code is raw output too: its module-level
    ``HINT`` literal is picked up); raw text goes through ``extract_program``."""
    return source if isinstance(source, EnvProgram) else extract_program(source).to_program()


def turn_cap(declared: Any, cap: int) -> int:
    """The turns one episode of a program gets: its own ``max_turns`` when that is an int from
    1 to ``cap``, else ``cap`` (absent, not an int, ``<= 0`` or larger than ``cap``)."""
    if isinstance(declared, bool) or not isinstance(declared, int) or not 1 <= declared <= cap:
        return cap
    return declared


class Validator:
    """Validates programs against the contract; owns a pool unless one is given.

    ``seed`` fixes the sequence of validation seeds (one drawn per ``validate`` call that is not
    given its own ``seed=``); without it they are drawn from the system's randomness."""

    def __init__(self, pool: SandboxPool | None = None,
                 settings: ValidatorSettings | None = None, seed: int | None = None) -> None:
        self._own_pool = pool is None
        self.pool = pool or SandboxPool(warm=2)
        self.settings = settings or ValidatorSettings()
        self._seeds = random.SystemRandom() if seed is None else random.Random(seed)
        self._seeds_lock = threading.Lock()

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> "Validator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def draw_seed(self) -> int:
        """The next validation seed."""
        with self._seeds_lock:
            return self._seeds.getrandbits(63)

    def validate_many(self, sources: list[str | EnvProgram], workers: int = 2,
                      seeds: list[int] | None = None,
                      play_seeds: list[Sequence[int]] | None = None) -> list[ValidationReport]:
        """Validate in parallel; the validation seeds are drawn in order before any starts.
        ``play_seeds``: each program's own (``validate``)."""
        seeds = list(seeds) if seeds is not None else [self.draw_seed() for _ in sources]
        plays = list(play_seeds) if play_seeds is not None else [()] * len(sources)
        if len(seeds) != len(sources) or len(plays) != len(sources):
            raise ConfigError(f"{len(seeds)} seeds and {len(plays)} play seed lists for "
                              f"{len(sources)} programs")
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            return list(ex.map(lambda args: self.validate(*args), zip(sources, seeds, plays)))

    def validate(self, source: str | EnvProgram, seed: int | None = None,
                 play_seeds: Sequence[int] = ()) -> ValidationReport:
        """One program's report. ``play_seeds``: the reset seeds the caller will play it on
        (module docstring; empty: self-play's validation)."""
        plays = tuple(play_seeds or ())
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in plays):
            raise ConfigError(f"play seeds must be ints, got {list(plays)[:5]!r}")
        with ParentMeter() as meter:  # the parent's reading time, kept out of the program's
            return self._validate(source, seed, meter, plays)

    def _validate(self, source: str | EnvProgram, seed: int | None,
                  meter: ParentMeter, plays: tuple[int, ...] = ()) -> ValidationReport:
        validation_seed = self.draw_seed() if seed is None else seed
        details: dict[str, Any] = {"validation_seed": validation_seed, "timings_ms": {}}
        if plays:
            details["play_seeds"] = len(plays)
        program: EnvProgram | None = None
        stage = "extract"
        sb: Sandbox | None = None
        run: _Runner | None = None
        clock = time.monotonic()
        try:
            try:
                with parent_work():
                    program = to_program(source)
            except ExtractionError as exc:
                raise _Fail("extract", exc.reason, str(exc)) from None
            details["timings_ms"]["extract"] = _ms(clock)
            stage = "syntax"
            try:
                with parent_work():
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
            tooluse = program.domain == "tooluse" or (program.domain is None
                                                      and sb.program["has_tools"])
            run = _Runner(self.settings, sb, random.Random(validation_seed), clock, tooluse,
                          details, hint=program.hint, meter=meter, play_seeds=plays)
            env, cap = run.fresh("load")
            details["max_turns"] = cap
            details["timings_ms"]["load"] = _ms(t)
            details["domain"] = "tooluse" if tooluse else "games"
            run.first = env
            for stage, fn in (("interface", run.interface), ("tools", run.tools),
                              ("determinism", run.determinism), ("solution", run.solution),
                              ("lockstep", run.lockstep),
                              ("action_dependent", run.action_dependent), ("ends", run.ends)):
                if stage == "tools" and not tooluse:
                    continue
                t = time.monotonic()
                details.update(fn() or {})
                details["timings_ms"][stage] = _ms(t)
            if program.class_name != details["class_name"]:
                program = dataclasses.replace(program, class_name=details["class_name"])
            return ValidationReport(True, "done", "ok", "valid", details, program)
        except _Fail as fail:
            details.update(fail.details)
            return ValidationReport(False, fail.stage, fail.reason, fail.message, details,
                                    program)
        finally:
            details["timings_ms"]["parent"] = round(meter.seconds * 1000, 2)
            if run is not None:
                details["step_ms"] = run.timing()
            compat = getattr(getattr(self.pool, "config", None), "compat", False)
            if program is not None and compat:  # what it relies on (a stand-in pool: no config)
                details["compat"] = sorted(set(refstyle.static_features(program.code)) |
                                           (sb.compat_used if sb is not None else set()))
            if sb is not None:
                if sb.alive:
                    details["output_tail"] = sb.output_tail()[-2000:]
                self.pool.release(sb)
            details["timings_ms"]["total"] = _ms(clock)


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 2)


def _checked(stage: str, fn):
    """Run one sandbox call; a typed failure becomes this stage's failure."""
    try:
        return fn()
    except SandboxError as exc:
        raise _Fail(stage, exc.reason, exc.message, **_err(exc)) from None


def _ending(episode: dict) -> str:
    if episode["terminated"] or episode["truncated"]:
        how = "terminated" if episode["terminated"] else "truncated"
        return f"{how} after {len(episode['rewards'])} steps"
    return (f"runner_cap: the program did not end the episode within {episode['cap']} steps; "
            "the runner's own cap applies")


class _Runner(EpisodeChecks):
    """The checks of one validation: one sandbox, a fresh instance per check, every seed and
    garbage action drawn from ``rng`` (seeded with the validation seed)."""

    def __init__(self, settings: ValidatorSettings, sb: Sandbox, rng: random.Random,
                 clock: float, tooluse: bool, details: dict[str, Any], *,
                 hint: str | None = None, meter: ParentMeter | None = None,
                 play_seeds: tuple[int, ...] = ()) -> None:
        self.settings, self.sb, self.rng, self.clock = settings, sb, rng, clock
        self.play_seeds = play_seeds
        """Seeds the caller will play (validated like drawn ones, and each on its own)."""
        self.scale = 1.0
        """How many times self-play's seeds this validation checks (its budgets grow so)."""
        self.phase_scale = 1.0
        """How many times a validation's work a phase of its own does (its budget grows so)."""
        self.blind: dict[str, tuple[list[str], list[dict]]] = {}
        """The blind-reply baseline by kind: the reply's actions and its measured episodes."""
        self.meter = meter if meter is not None else ParentMeter()
        self.tooluse, self.details = tooluse, details
        self.hint = hint
        """The program's hint: some garbage replies repeat its words."""
        self.observation: str | None = None
        """The first reset observation: some garbage replies repeat its words."""
        self.first: RemoteEnv | None = None
        self.seeds: dict[str, Any] = details.setdefault("seeds", {})
        self.advertised: list[str] = []
        self.schemas: list = []
        self.episodes: list[dict] = []
        self.times: list[float] = []
        self.slow = 0

    # -- plumbing ------------------------------------------------------------------------

    def draw(self) -> int:
        return self.rng.randrange(SEED_SPACE)

    def fresh(self, stage: str) -> tuple[RemoteEnv, int]:
        """A new instance of the program and its turn cap."""
        if self.first is not None:  # the load stage's instance goes to the interface probe
            env, self.first = self.first, None
        else:
            env = _checked(stage, lambda: self.sb.new_env(max_turns=self.settings.max_turns))
        declared = env.max_turns  # the sandbox clamps it too; this holds for any sandbox
        cap = turn_cap(declared, self.settings.max_turns)
        if declared is not None and declared != cap:
            self.details["max_turns_declared"] = declared
        return env, cap

    def _budget(self, stage: str) -> None:
        """``parent_budget`` once the parent's reading passed :data:`PARENT_BUDGET_S`;
        ``timeout`` once the rest of the validation's time passed ``total_timeout``."""
        parent = self.meter.seconds
        if parent > PARENT_BUDGET_S:
            raise _Fail(stage, PARENT_BUDGET, f"the parent spent {parent:.1f}s reading what the "
                        f"program returned, more than its budget of {PARENT_BUDGET_S:g}s",
                        parent_s=round(parent, 3))
        total = self.settings.total_timeout * self.scale * self.phase_scale
        if time.monotonic() - self.clock - parent > total:
            raise _Fail(stage, "timeout", f"validation exceeded its total budget of "
                        f"{total:g}s (not counting {parent:.2f}s of the "
                        "parent reading the program's results)")

    def _timed(self, stage: str, what: str, fn):
        self._budget(stage)
        t = time.perf_counter()
        out = _checked(stage, fn)
        dt = time.perf_counter() - t
        self.times.append(dt)
        if dt > self.settings.slow_step_s:
            self.slow += 1
            if self.slow >= self.settings.slow_steps:
                raise _Fail(stage, "slow", f"{self.slow} calls took longer than "
                            f"{self.settings.slow_step_s:g}s (the last, {what}, {dt:.2f}s): "
                            "the program is too slow to play", slow_calls=self.slow)
        return out

    def timing(self) -> dict[str, Any]:
        """Reset and step latencies seen (a baseline for the training-time watch), and the
        longest lockstep turn of the worker (all its instances' steps together), in ms."""
        if not self.times:
            return {"calls": 0}
        ordered = sorted(self.times)
        return {"calls": len(ordered), "p50": round(statistics.median(ordered) * 1e3, 3),
                "p90": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e3, 3),
                "max": round(ordered[-1] * 1e3, 3), "slow": self.slow,
                "lockstep_turn_max": round(getattr(self, "turn_max", 0.0) * 1e3, 3)}

    def _reset(self, stage: str, env: RemoteEnv, seed: int) -> str:
        obs, _info = self._timed(stage, f"reset(seed={seed})", lambda: env.reset(seed=seed))
        if not obs.strip():
            raise _Fail(stage, "empty_observation", f"reset(seed={seed}) returned an empty "
                        "observation")
        return obs

    def _step(self, stage: str, env: RemoteEnv, action: str) -> tuple:
        try:
            return self._timed(stage, "step", lambda: env.step(action))
        except _Fail as fail:
            fail.details.setdefault("action", action[:200])
            raise

    def _play(self, stage: str, env: RemoteEnv, seed: int, actions: list[str]) -> list[tuple]:
        """Reset with ``seed`` and play ``actions`` until the episode ends; returns the reset
        observation and the step tuples (without info)."""
        trace = [(self._reset(stage, env, seed),)]
        for action in actions:
            obs, reward, term, trunc, _ = self._step(stage, env, action)
            trace.append((obs, reward, term, trunc))
            if term or trunc:
                break
        return trace

    def _probe(self, stage: str, env: RemoteEnv, seed: int, actions: list[str],
               live: bool) -> tuple[int, list[str], bool]:
        """Send every action, starting a new episode (next seed) whenever one ends (and first,
        unless ``live``), so that an environment that ends early still meets every probe.
        Returns the last seed used, the observations seen and whether the episode is live."""
        seen: list[str] = []
        for action in actions:
            if not live:
                seed += 1
                seen.append(self._reset(stage, env, seed))
            obs, _reward, term, trunc, _ = self._step(stage, env, action)
            seen.append(obs)
            live = not (term or trunc)
        return seed, seen, live

    # -- checks --------------------------------------------------------------------------

    def interface(self) -> dict:
        """SPEC's probe with drawn seeds: reset, the edge probes, every action the program
        advertises (and those with their numbers put out of range), then reset again."""
        env, _cap = self.fresh("interface")
        first, again = self.draw(), self.draw()
        self.seeds["interface"] = [first, again]
        self.details["advertised"] = self.advertised  # filled in as they are found
        obs = self._reset("interface", env, first)
        self.observation = obs if isinstance(obs, str) else None
        todo = list(TOOL_PROBES if self.tooluse else GAME_PROBES)  # shuffled among drawn ones
        todo += [garbage_action(self.rng, self.tooluse) for _ in range(self.rng.randint(2, 5))]
        seed, seen, live, sent = first, [obs], True, set(todo)
        for _round in range(2):  # the second round: actions advertised by step observations
            with parent_work():  # reading the observations is the parent's time
                found = [a for o in seen for a in advertised_actions(o, self.tooluse)]
            added = merge_advertised(self.advertised, (  # (not echoes of what was sent)
                a for a in found if a not in sent))
            todo += added + [m for m in (mutate(a, self.rng) for a in added) if m]
            if not todo:
                break
            self.rng.shuffle(todo)
            seed, seen, live = self._probe("interface", env, seed, todo, live)
            sent.update(todo)
            todo = []
        self._reset("interface", env, again)
        return {}

    def tools(self) -> dict:
        names: list[str] = []
        seeds = list(self.settings.seeds) + [self.draw() for _ in range(self.settings.drawn_seeds)]
        self.seeds["tools"] = seeds
        env, _cap = self.fresh("tools")
        for seed in seeds:
            self._reset("tools", env, seed)
            schemas = _checked("tools", env.tools)
            problem = _schema_problem(schemas)
            if problem:
                raise _Fail("tools", "bad_tools", f"tools() after reset(seed={seed}): {problem}")
            names = [s["function"]["name"] for s in schemas]
            self.schemas = schemas
            _o, reward, _te, _tr, _i = self._step("tools", env, ANSWER)
            if reward >= 1.0:
                raise _Fail("tools", "criteria_trivial", f"answering at once after reset(seed="
                            f"{seed}) already scores 1.0: the success criteria check nothing")
        seed = self.draw()
        self.seeds["tool_probes"] = seed
        self._reset("tools", env, seed)
        self._probe("tools", env, seed, tool_probes(self.schemas, self.rng), True)
        return {"tools": names}

    def ends(self) -> dict:
        return {"ends": _ending(self.episodes[0])}



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
