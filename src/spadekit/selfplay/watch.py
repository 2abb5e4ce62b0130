"""Trust after admission: the checks that retire a pooled program during training.

Validation admits a program once; a program can still behave only while it is being watched.
During self-play every pooled program is watched again, and one that misbehaves is retired
(blacklisted with a reason, removed from the pool and the memory, never validated again) and its
pending designer sample gets the fixed reward ``RETIRE_PENALTY`` (-0.5, the SPEC's hang penalty):

* ``play_timeout``: a step (or reset) of an agent's play timed out (SPEC point 3: a hang);
* ``slow_in_play``: its mean step time in a round's plays exceeds ``WatchConfig.step_time_limit_s``,
  or exceeds ``slow_step_factor`` times its median call time in validation (and
  ``slow_step_min_s``);
* ``garbage_wins``: a spot-check episode of random garbage actions reached reward 1.0;
* ``nondeterministic_in_play``: replaying validation's reference episode (the same seed and
  garbage actions) gave different rewards or another ending than validation recorded.

What validation recorded is read from the environment's validation details: the reference
episode (``details["reference_episode"]``: seed, actions, rewards, terminated, truncated) and the
call latencies (``details["step_ms"]["p50"]``). Garbage is ``spadekit.sandbox.probes.garbage_actions``
(the validator's), from a fresh seed each time. Spot-check episodes run in their own sandboxes,
outside the rollout: they never become training samples and are not recorded as plays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError, SandboxError
from spadekit.sandbox.probes import garbage_actions
from spadekit.selfplay.rewards import HANG_PENALTY

__all__ = ["WatchConfig", "PoolWatch", "RETIRE_PENALTY", "RETIRE_REASONS", "ProbeResult",
           "run_probes", "spot_check_verdicts", "slow_verdict"]

RETIRE_PENALTY = HANG_PENALTY
"""The designer's fixed reward for a program retired during training (the hang penalty)."""
RETIRE_REASONS = ("play_timeout", "slow_in_play", "garbage_wins", "nondeterministic_in_play")
WIN = 1.0
"""A reward this high is a win (the validator's and the solution check's threshold)."""


@dataclass(frozen=True)
class WatchConfig:
    """How pooled programs are watched during self-play (``spadekit.selfplay.watch``)."""

    spot_checks: int = 1
    """Garbage spot-check episodes per pooled designed environment per round, each with fresh
    random actions and seed, plus one replay of validation's reference episode (determinism);
    0 turns spot checks off (hangs and slow steps in play are still watched)."""
    step_time_limit_s: float = 1.0
    """A program whose mean step time in one round's plays exceeds this many seconds is retired
    (``slow_in_play``)."""
    slow_step_factor: float = 20.0
    """... or whose mean step time exceeds this multiple of its median call time in
    validation,"""
    slow_step_min_s: float = 0.05
    """... provided it is also above this many seconds (a 0.1 ms step becoming 3 ms is noise)."""

    def __post_init__(self) -> None:
        if isinstance(self.spot_checks, bool) or not isinstance(self.spot_checks, int) \
                or self.spot_checks < 0:
            raise ConfigError(f"watch.spot_checks must be an int >= 0, got {self.spot_checks!r}")
        for name in ("step_time_limit_s", "slow_step_factor", "slow_step_min_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"watch.{name} must be a number > 0, got {value!r}")


@dataclass
class ProbeResult:
    """One scripted episode: what each step returned and how long it took."""

    seed: int
    actions: list[str]
    rewards: list[float] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)
    """Per step: terminated or truncated."""
    step_s: list[float] = field(default_factory=list)
    error: SandboxError | None = None

    @property
    def mean_step_s(self) -> float | None:
        return sum(self.step_s) / len(self.step_s) if self.step_s else None

    @property
    def ended(self) -> bool:
        """Whether the program ended the episode (terminated or truncated) at its last step."""
        return bool(self.ends and self.ends[-1])


def run_probes(envs: Any, probes: list[tuple[EnvProgram, int, list[str]]],
               max_turns: int) -> list[ProbeResult]:
    """Play each ``(program, seed, actions)`` (constructed with ``max_turns``), all in lockstep,
    until its actions run out or the episode ends; a typed failure ends that probe only
    (``ProbeResult.error``). ``envs``: where plays run, an ``EnvBackend`` or a ``SandboxPool``
    (one sandbox per distinct program, loaded in parallel, released at the end). Step times
    are each step's own where the backend measures them (the local pool), else not kept."""
    from spadekit.rollout.engine import EnvBackend, LocalPoolBackend

    backend = envs if isinstance(envs, EnvBackend) else LocalPoolBackend(envs)
    results = [ProbeResult(seed=seed, actions=list(actions)) for _p, seed, actions in probes]
    with backend.session() as session:
        started = session.start([(p.sha256, p.code, max_turns, seed) for p, seed, _a in probes])
        live: list[tuple[int, Any]] = []
        for i, got in enumerate(started):
            if isinstance(got, SandboxError):
                results[i].error = got
            else:
                live.append((i, got[0]))
        turn = 0
        while live:
            live = [(i, env) for i, env in live if turn < len(results[i].actions)]
            if not live:
                break
            session.step_seconds = None
            outs = session.step([(env, results[i].actions[turn]) for i, env in live])
            seconds = session.step_seconds or [None] * len(live)
            still = []
            for (i, env), out, sec in zip(live, outs, seconds):
                res = results[i]
                if isinstance(out, SandboxError):
                    res.error = out
                    continue
                _obs, reward, term, trunc, _info = out
                res.rewards.append(float(reward))
                res.ends.append(bool(term or trunc))
                if sec is not None:
                    res.step_s.append(sec)
                if not (term or trunc):
                    still.append((i, env))
            live = still
            turn += 1
    for res in results:  # what was not played is not part of the episode
        del res.actions[len(res.rewards) + (res.error is not None):]
    return results


def spot_check_verdicts(fresh: list[ProbeResult], replay: ProbeResult | None,
                        admitted: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """The retirement reason (or None) from one program's spot checks this round: garbage that
    won, a replay that differs from validation's reference episode (``admitted``: its seed,
    actions, rewards, terminated, truncated), or a timeout. Other typed failures (an
    environment raising on garbage) are not a reason: plays fail on them already."""
    for res in fresh + ([replay] if replay is not None else []):
        if res.error is not None and res.error.reason == "timeout":
            return "play_timeout", {"seed": res.seed, "error": res.error.to_dict()}
    for res in fresh:
        if any(r >= WIN for r in res.rewards):
            return "garbage_wins", {"seed": res.seed, "actions": res.actions,
                                    "rewards": res.rewards}
    if replay is not None and admitted is not None and replay.error is None:
        ended = bool(admitted.get("terminated") or admitted.get("truncated"))
        if replay.rewards != list(admitted["rewards"]) or replay.ended != ended:
            return "nondeterministic_in_play", {"seed": replay.seed,
                                                "validated_rewards": admitted["rewards"],
                                                "replayed_rewards": replay.rewards}
    return None, {}


def slow_verdict(step_s: list[float], base: float | None,
                 config: WatchConfig) -> tuple[str | None, dict[str, Any]]:
    """``slow_in_play`` when the mean of one program's step times this round is over the
    absolute limit, or over ``slow_step_factor`` times ``base`` (its median call time in
    validation, seconds; None: unknown) and over ``slow_step_min_s``; else None."""
    if not step_s:
        return None, {}
    mean = sum(step_s) / len(step_s)
    details = {"mean_step_s": mean, "validation_step_s": base, "steps": len(step_s)}
    if mean > config.step_time_limit_s:
        return "slow_in_play", {**details, "limit_s": config.step_time_limit_s}
    if base is not None and mean > config.slow_step_min_s and \
            mean > config.slow_step_factor * base:
        return "slow_in_play", {**details, "factor": config.slow_step_factor}
    return None, {}


class PoolWatch:
    """The watch of one self-play run (rank 0): after each round's plays, ``after_play`` finds
    the programs to retire, retires them (``retire``) and returns their sha256s with the
    round's ``watch/*`` metrics."""

    def __init__(self, config: WatchConfig, store: Any, memory: Any, envs: Any, max_turns: int,
                 tooluse: bool) -> None:
        """``envs``: where the spot checks run (the run's ``EnvBackend``, or a
        ``SandboxPool``)."""
        self.config, self.store, self.memory, self.envs = config, store, memory, envs
        self.max_turns, self.tooluse = max_turns, tooluse

    def validated(self, sha: str) -> tuple[dict[str, Any] | None, float | None]:
        """What validation recorded of a stored environment: its reference episode and its
        median call time in seconds (None each when absent: bootstrap programs, or runs from
        before the validator recorded them)."""
        validation = self.store.get_environment(sha).get("validation") or {}
        details = validation.get("details") or {}
        episode = details.get("reference_episode")
        if not (isinstance(episode, dict) and {"seed", "actions", "rewards"} <= set(episode)):
            episode = None
        p50 = (details.get("step_ms") or {}).get("p50")
        base = p50 / 1000.0 if isinstance(p50, (int, float)) and p50 > 0 else None
        return episode, base

    def after_play(self, step: int, trajs: list[Any], rng: random.Random
                   ) -> tuple[set[str], dict[str, float]]:
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        by_env: dict[str, list[Any]] = {}
        for tr in trajs:
            if tr.spec.program is not None:
                by_env.setdefault(tr.spec.program.sha256, []).append(tr)
        for sha, group in by_env.items():
            hung = [t for t in group if (t.failure or {}).get("reason") == "timeout"]
            if hung:
                found[sha] = ("play_timeout", {"episodes": len(hung),
                                               "error": hung[0].failure})
                continue
            reason, details = slow_verdict([turn.step_s for t in group for turn in t.turns],
                                           self.validated(sha)[1], self.config)
            if reason:
                found[sha] = (reason, details)
        checked, errors = self._spot_checks(rng, found)
        metrics = {"watch/spot_checked_envs": float(checked),
                   "watch/spot_check_errors": float(errors)}
        for reason in RETIRE_REASONS:
            metrics[f"watch/{reason}"] = float(sum(1 for r, _d in found.values() if r == reason))
        penalised = sum(self.retire(sha, reason, step, details)
                        for sha, (reason, details) in found.items())
        metrics.update({"watch/retired": float(len(found)),
                        "watch/designer_penalised": float(penalised)})
        return set(found), metrics

    def _spot_checks(self, rng: random.Random,
                     found: dict[str, tuple[str, dict[str, Any]]]) -> tuple[int, int]:
        """Spot-check every pooled designed environment not already condemned; adds verdicts to
        ``found``; returns (environments checked, probes that ended in another typed error)."""
        if self.config.spot_checks == 0:
            return 0, 0
        rows = [r for r in self.store.environments(status="pooled")
                if not (r.get("lineage") or {}).get("bootstrap") and r["sha256"] not in found]
        probes, owners = [], []
        for row in rows:
            program = self.store.get_program(row["sha256"])
            for _ in range(self.config.spot_checks):
                probes.append((program, rng.randrange(2 ** 31), garbage_actions(
                    rng.randrange(2 ** 31), self.max_turns, self.tooluse)))
                owners.append((row["sha256"], "fresh"))
            admitted = self.validated(row["sha256"])[0]
            if admitted is not None:
                probes.append((program, int(admitted["seed"]), list(admitted["actions"])))
                owners.append((row["sha256"], "replay"))
        results = run_probes(self.envs, probes, self.max_turns) if probes else []
        fresh: dict[str, list[ProbeResult]] = {}
        replay: dict[str, ProbeResult] = {}
        errors = 0
        for (sha, kind), res in zip(owners, results):
            if res.error is not None and res.error.reason != "timeout":
                errors += 1
            if kind == "fresh":
                fresh.setdefault(sha, []).append(res)
            else:
                replay[sha] = res
        for row in rows:
            sha = row["sha256"]
            admitted, base = self.validated(sha)
            reason, details = spot_check_verdicts(fresh.get(sha, []), replay.get(sha), admitted)
            if reason is None:
                times = [s for r in fresh.get(sha, []) + ([replay[sha]] if sha in replay else [])
                         for s in r.step_s]
                reason, details = slow_verdict(times, base, self.config)
            if reason:
                found[sha] = (reason, {**details, "spot_check": True})
        return len(rows), errors

    def retire(self, sha: str, reason: str, step: int, details: dict[str, Any]) -> int:
        """Blacklist ``sha`` (out of the pool, never validated again), drop it from the memory,
        give its queued designer samples ``RETIRE_PENALTY``, and log an ``env_retired`` event.
        Returns the number of designer samples penalised."""
        self.store.blacklist(sha, reason, step)
        penalised = self.store.fix_delayed_reward(sha, RETIRE_PENALTY, reason)
        if sha in self.memory:
            self.memory.remove(sha)
        self.store.append_event({"kind": "env_retired", "step": step, "env": sha,
                                 "reason": reason, "designer_penalised": penalised,
                                 "details": _jsonable(details)})
        return penalised


def _jsonable(value: Any) -> Any:
    """``value`` with anything JSON cannot hold turned into short text (event details)."""
    import json

    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)[:500]
