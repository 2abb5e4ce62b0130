"""The RLVE baseline: 400 verifiable single-turn environments behind an adaptive-difficulty ladder.

Environments come from PyPI ``rlve-gym`` (imported as ``Gym``), each with a generator, a verifier
and a parameter controller. :func:`generate_problem` makes one problem at a level (retrying
derived seeds); :class:`RLVEEnv` plays it with the text contract: the last ``\\boxed{...}`` (else
``<answer>``) is verified, reward = the verifier's reward clipped to [0, 1];
:class:`DifficultyLadder` is RLVE's per-environment schedule; :class:`RLVECurriculum` ties them
together. ``generator`` reseeds the process-wide generators, which are restored afterwards.
rlve-gym quirks: docs/design/curriculum.md.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import random
import threading
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from spadekit.curriculum.base import Curriculum
from spadekit.envs.actions import extract_answer, extract_boxed
from spadekit.common.errors import ConfigError, SpadekitError
from spadekit.rollout.engine import EpisodeSpec, Trajectory

__all__ = ["ANSWER_MARKERS", "INSTALL_HINT", "RLVE_SYSTEM", "DifficultyLadder", "RLVECurriculum",
           "RLVEEnv", "RLVEGenerationError", "RLVEProblem", "generate_problem", "rlve_env_names"]

INSTALL_HINT = "pip install rlve-gym==0.0.1 torch networkx numpy sympy"
ANSWER_MARKERS = ("<spadekit-rlve-answer>", "</spadekit-rlve-answer>")
"""Markers the verifier is built with; they contain no braces, so ``{...}`` answers survive."""
RLVE_SYSTEM = (
    "Solve the problem. You may reason step by step first. Then give your final answer, in "
    "exactly the output format the problem asks for, inside \\boxed{...}; only the last box "
    "counts.")
_RAW_ANSWER_ENVS = frozenset({"PolyaModel"})  # scorer ignores the answer markers (upstream bug)
_EPS = 1e-6  # RLVE's own tolerance when turning a reward into ``accuracy``


def _gym() -> tuple[dict, dict]:
    """``(identifier2environment, identifier2controller)``, or ConfigError with the install line."""
    try:
        from Gym.environments import identifier2environment
        from Gym.parameter_controllers import identifier2controller
    except ImportError as exc:
        raise ConfigError(f"the RLVE baseline needs rlve-gym and its undeclared dependencies "
                          f"({exc}); install them with: {INSTALL_HINT}") from None
    return identifier2environment, identifier2controller


def rlve_env_names() -> list[str]:
    """All RLVE environment names (the keys of ``identifier2environment``), sorted."""
    return sorted(_gym()[0])


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            value = value.item()
        except Exception:
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _run_limited(fn: Callable[[], Any], timeout_s: float | None) -> Any:
    """``fn()`` in a daemon thread; raise TimeoutError after ``timeout_s`` (the thread is left to
    finish on its own: Python cannot kill it, and a daemon thread does not block exit)."""
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="spadekit-rlve")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"timed out after {timeout_s:g} s")
    if "error" in box:
        exc = box["error"]
        raise exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")
    return box.get("value")


@contextmanager
def _preserve_global_rng():
    """RLVE's ``manual_seed`` reseeds ``random``, numpy and torch globally; undo that."""
    import sys

    saved: list[tuple[Callable, Any]] = [(random.setstate, random.getstate())]
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if np is not None:
        saved.append((np.random.set_state, np.random.get_state()))
    if torch is not None:
        saved.append((torch.random.set_rng_state, torch.random.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            saved.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
    hashseed = os.environ.get("PYTHONHASHSEED")
    try:
        yield
    finally:
        for setter, state in saved:
            setter(state)
        os.environ.pop("PYTHONHASHSEED", None)
        os.environ.update({} if hashseed is None else {"PYTHONHASHSEED": hashseed})


# -- problems -------------------------------------------------------------------------------------

class RLVEGenerationError(SpadekitError):
    """No problem could be generated (every attempt failed); ``details["attempts"]`` says why."""

    reason = "rlve_generation"


@dataclass(frozen=True)
class RLVEProblem:
    """One generated problem. ``config`` is RLVE's ``get_config()`` (seed, generated parameter,
    passing_reward_threshold) and is enough to rebuild a verifier; ``seed`` is the seed that
    succeeded (the requested one, or a derived one after a failed attempt)."""

    env: str
    difficulty: int
    seed: int
    prompt: str
    config: dict

    @property
    def reference_answer(self) -> Any:
        """The generator's reference answer, when the environment stores one (most do)."""
        return (self.config.get("parameter") or {}).get("reference_answer")

    @property
    def pass_threshold(self) -> float:
        """The reward at or above which RLVE counts a play as correct (1.0 for most envs)."""
        return float(self.config.get("passing_reward_threshold", 1.0))


_PARAMETER_LEVELS: dict[str, tuple[Any, list[list[dict]]]] = {}
_CACHE_LOCK = threading.Lock()


def parameter_list(name: str, difficulty: int) -> list[dict]:
    """The controller's parameter list at ``difficulty`` (level 0 = a fresh controller, level k =
    after k ``update()`` calls). Controllers are cached and advanced lazily."""
    with _CACHE_LOCK:
        if name not in _PARAMETER_LEVELS:
            controller = _gym()[1][name]()
            _PARAMETER_LEVELS[name] = (controller, [copy.deepcopy(controller.get_parameter_list())])
        controller, levels = _PARAMETER_LEVELS[name]
        while len(levels) <= difficulty:
            controller.update()
            levels.append(copy.deepcopy(controller.get_parameter_list()))
        return copy.deepcopy(levels[difficulty])


def derived_seed(seed: int, attempt: int) -> int:
    """The seed of retry ``attempt`` (attempt 0 is ``seed`` itself)."""
    return seed if attempt == 0 else zlib.crc32(f"rlve:{seed}:{attempt}".encode()) & 0x7FFFFFFF


def generate_problem(name: str, difficulty: int, seed: int, *, attempts: int = 3,
                     timeout_s: float = 10.0, max_prompt_chars: int = 65536) -> RLVEProblem:
    """Generate a problem of environment ``name`` at ``difficulty``, as RLVE does: one parameter
    dict drawn from the controller's list at that level, then ``generator(seed, parameter)``.
    A failed attempt (False, an exception, a timeout, an oversized prompt) is retried with a
    derived seed, ``attempts`` times in all; then RLVEGenerationError."""
    environments = _gym()[0]
    if name not in environments:
        raise ConfigError(f"unknown RLVE environment {name!r}")
    failures: list[str] = []
    for attempt in range(max(1, attempts)):
        s = derived_seed(seed, attempt)
        try:
            choices = parameter_list(name, difficulty)
            parameter = random.Random(s).choice(choices)
            env = environments[name](answer_markers=ANSWER_MARKERS)

            def make() -> str | None:
                return env.prompt_generator() if env.generator(s, parameter, timeout_s) else None

            with _preserve_global_rng():
                prompt = _run_limited(make, timeout_s * 1.2 + 0.5)
            if not isinstance(prompt, str) or not prompt.strip():
                failures.append(f"seed {s}: generator returned False")
            elif len(prompt) > max_prompt_chars:
                failures.append(f"seed {s}: prompt of {len(prompt)} chars")
            else:
                config = copy.deepcopy(env.get_config())
                return RLVEProblem(name, difficulty, s, prompt, config)
        except Exception as exc:
            failures.append(f"seed {s}: {type(exc).__name__}: {exc}"[:300])
    raise RLVEGenerationError(f"could not generate {name} at difficulty {difficulty}: "
                              + "; ".join(failures), env=name, difficulty=difficulty, seed=seed,
                              attempts=failures)


# -- the environment ------------------------------------------------------------------------------

class RLVEEnv:
    """One RLVE problem as a single-turn text environment (Gymnasium contract).

    ``reset`` returns the problem's prompt; ``step(reply)`` verifies the reply's answer and ends
    the episode with reward in [0, 1]. It never raises: a missing answer, an oversized one, a
    verifier exception or timeout all give reward 0 with ``info["error"]``. ``info["verifier"]``
    holds RLVE's raw result (JSON-safe), ``info["correct"]`` RLVE's accuracy."""

    def __init__(self, problem: RLVEProblem, *, max_answer_chars: int = 65536,
                 verify_timeout_s: float | None = 30.0):
        self.problem = problem
        self.max_answer_chars = max_answer_chars
        self.verify_timeout_s = verify_timeout_s
        self._done = False

    def _info(self, **extra: Any) -> dict[str, Any]:
        p = self.problem
        return {"rlve_env": p.env, "difficulty": p.difficulty, "seed": p.seed, **extra}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self._done = False  # the problem is fixed at generation: ``seed`` does not change it
        return self.problem.prompt, self._info()

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self._done:
            return "", 0.0, True, False, self._info(error="the episode has already ended")
        self._done = True
        answer = None
        if isinstance(action, str):
            answer = extract_boxed(action)
            answer = extract_answer(action) if answer is None else answer
        if answer is None:
            return self._end(0.0, "no answer found: write the final answer inside \\boxed{...}")
        if len(answer) > self.max_answer_chars:
            return self._end(0.0, f"answer too long ({len(answer)} chars)", answer)
        try:
            result = _run_limited(lambda: self._verify(answer), self.verify_timeout_s)
            raw = float(result["reward"])
        except Exception as exc:  # anything the verifier does becomes reward 0
            return self._end(0.0, f"verifier failed: {type(exc).__name__}: {exc}"[:1000], answer)
        if not math.isfinite(raw):
            return self._end(0.0, f"verifier gave reward {raw}", answer, result)
        correct = raw >= self.problem.pass_threshold - _EPS
        return self._end(min(1.0, max(0.0, raw)), None, answer, result, correct)

    def _end(self, reward: float, error: str | None, answer: str | None = None,
             result: Any = None, correct: bool = False) -> tuple[str, float, bool, bool, dict]:
        info = self._info(answer=answer if answer is None or len(answer) <= 1000
                          else answer[:1000] + "...",
                          verifier=None if result is None else _jsonable(result),
                          correct=bool(correct))
        if error:
            info["error"] = error
        return "", float(reward), True, False, info

    def _verify(self, answer: str) -> dict:
        begin, end = ANSWER_MARKERS
        env = _gym()[0][self.problem.env](answer_markers=ANSWER_MARKERS)
        env.set_config(copy.deepcopy(self.problem.config))
        if self.problem.env in _RAW_ANSWER_ENVS:
            return env.verifier(answer)
        clean = answer.replace(begin, "").replace(end, "")
        # RLVE's processor drops everything before the first "Assistant:"; lead with one so an
        # answer that itself contains "Assistant:" is kept whole.
        return env.verifier("Assistant:" + begin + clean + end)


# -- the ladder -----------------------------------------------------------------------------------

class DifficultyLadder:
    """RLVE's adaptive difficulty for one environment (pure logic; no rlve-gym needed).

    ``upper`` (h) starts at 0; problems are drawn uniformly from levels ``[max(0, h - levels + 1),
    h]``. Only plays at difficulty h count. Once ``window = window_factor * num_generations`` are
    in, h rises by 1 if their accuracy is at least ``threshold``; either way the counters reset (as
    RLVE's ``RLVEManager.update``). The window is checked after every play (RLVE checks once per
    batch, so its window may overshoot).
    """

    def __init__(self, *, threshold: float = 0.9, window_factor: int = 8, levels: int = 4,
                 num_generations: int = 1, upper: int = 0):
        self.threshold = float(threshold)
        self.window_factor = int(window_factor)
        self.levels = int(levels)
        self.num_generations = int(num_generations)
        self.upper = int(upper)
        self.correct = 0
        self.total = 0

    @property
    def window(self) -> int:
        return max(1, self.window_factor * self.num_generations)

    @property
    def lowest(self) -> int:
        return max(0, self.upper - self.levels + 1)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.total if self.total else None

    def sample(self, rng: random.Random) -> int:
        """A difficulty drawn uniformly from ``[lowest, upper]``."""
        return rng.randint(self.lowest, self.upper)

    def record(self, difficulty: int, correct: bool) -> bool:
        """Count one play; return True when it raised h. Plays not at h are ignored."""
        if difficulty != self.upper:
            return False
        self.total += 1
        self.correct += int(bool(correct))
        if self.total < self.window:
            return False
        raised = self.correct / self.total >= self.threshold
        self.upper += int(raised)
        self.correct = self.total = 0
        return raised

    _STATE = ("upper", "correct", "total", "num_generations")

    def state_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in self._STATE:
            setattr(self, key, int(state.get(key, 0 if key != "num_generations" else 1)))


# -- the curriculum -------------------------------------------------------------------------------

class RLVECurriculum(Curriculum):
    """RLVE's baseline curriculum over ``envs`` (None: all 400).

    Each round takes ``envs`` environments from a fair rotation (a shuffled cycle through all of
    them, so every environment is played once before any repeats), draws a difficulty from its
    ladder and a generation seed from the round's rng, generates the problem once, and returns
    ``num_generations`` plays of it. An environment whose problem cannot be generated is skipped
    for the round (reason in ``self.skipped``) and replaced by the next one in the rotation.
    Tags also carry ``pass_threshold`` (RLVE's per-problem bar for "correct", 1.0 for nearly all).
    """

    name = "rlve"

    def __init__(self, envs: Sequence[str] | None = None, *, threshold: float = 0.9,
                 window_factor: int = 8, levels: int = 4, system_prompt: str | None = None,
                 generation_attempts: int = 3, generation_timeout_s: float = 10.0):
        known = _gym()[0]
        names = sorted(known) if envs is None else list(dict.fromkeys(envs))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"unknown RLVE environment(s): {', '.join(map(repr, unknown[:10]))}"
                              f" (the names are the keys of Gym.environments."
                              f"identifier2environment, e.g. 'Multiplication', 'TwoSAT')")
        if not names:
            raise ConfigError("RLVECurriculum needs at least one environment")
        if not 0.0 < threshold <= 1.0 or window_factor < 1 or levels < 1:
            raise ConfigError("need 0 < threshold <= 1, window_factor >= 1 and levels >= 1")
        self.env_names = names
        self.knobs = {"threshold": threshold, "window_factor": window_factor, "levels": levels}
        self.system_prompt = system_prompt or RLVE_SYSTEM
        self.generation_attempts = generation_attempts
        self.generation_timeout_s = generation_timeout_s
        self.ladders = {n: DifficultyLadder(**self.knobs) for n in names}
        self._order: list[str] = []
        self._pos = 0
        self.skipped: list[dict[str, Any]] = []
        self.generation_failures = 0

    def _draw(self, rng: random.Random, taken: set[str]) -> str:
        if self._pos >= len(self._order):  # new cycle; names already in this round go last
            fresh = [n for n in self.env_names if n not in taken]
            used = [n for n in self.env_names if n in taken]
            rng.shuffle(fresh)
            rng.shuffle(used)
            self._order, self._pos = fresh + used, 0
        self._pos += 1
        return self._order[self._pos - 1]

    def episodes(self, step: int, rng: random.Random, envs: int,
                 num_generations: int) -> list[EpisodeSpec]:
        specs: list[EpisodeSpec] = []
        taken: set[str] = set()
        self.skipped = []
        groups, draws = 0, 0
        while groups < envs and draws < envs + len(self.env_names):
            draws += 1
            name = self._draw(rng, taken)
            ladder = self.ladders[name]
            ladder.num_generations = num_generations
            difficulty = ladder.sample(rng)
            seed = rng.randrange(2**31)
            try:
                problem = generate_problem(name, difficulty, seed,
                                           attempts=self.generation_attempts,
                                           timeout_s=self.generation_timeout_s)
            except (RLVEGenerationError, ConfigError) as exc:
                self.generation_failures += 1
                self.skipped.append({"step": step, "env": name, "difficulty": difficulty,
                                     "seed": seed, "reason": exc.message})
                continue
            taken.add(name)
            groups += 1
            tag = {"env": f"rlve:{name}:{difficulty}:{problem.seed}", "skill": name,
                   "difficulty": difficulty, "rlve_env": name, "with_hint": False,
                   "designed": False, "pass_threshold": problem.pass_threshold}
            factory = functools.partial(RLVEEnv, problem)
            specs.extend(EpisodeSpec(None, seed=problem.seed, env_factory=factory, tag=dict(tag),
                                     system=self.system_prompt) for _ in range(num_generations))
        return specs

    def observe(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        raised, plays, correct = set(), 0, 0
        for tr in trajectories:
            tag = tr.spec.tag or {}
            name = tag.get("rlve_env")
            if name not in self.ladders:
                continue
            threshold = float(tag.get("pass_threshold", 1.0))
            ok = tr.failure is None and tr.episode_return >= min(threshold, 1.0) - _EPS
            plays += 1
            correct += int(ok)
            if self.ladders[name].record(int(tag.get("difficulty", -1)), ok):
                raised.add(name)
        uppers = [ladder.upper for ladder in self.ladders.values()]
        return {"rlve/mean_upper_bound": sum(uppers) / len(uppers),
                "rlve/max_upper_bound": float(max(uppers)),
                "rlve/envs_raised": float(len(raised)),
                "rlve/accuracy": correct / plays if plays else 0.0,
                "rlve/plays": float(plays),
                "rlve/generation_skips": float(len(self.skipped))}

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "knobs": dict(self.knobs),
                "ladders": {n: lad.state_dict() for n, lad in self.ladders.items()},
                "order": list(self._order), "pos": self._pos,
                "generation_failures": self.generation_failures}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, ladder_state in (state.get("ladders") or {}).items():
            if name in self.ladders:
                self.ladders[name].load_state_dict(ladder_state)
        order = [n for n in state.get("order", []) if n in self.ladders]
        intact = len(order) == len(state.get("order", []))
        self._order = order  # if names were dropped, start a fresh cycle
        self._pos = int(state.get("pos", 0)) if intact else len(order)
        self.generation_failures = int(state.get("generation_failures", 0))

