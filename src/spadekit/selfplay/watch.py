"""Trust after admission: the checks that retire a pooled program during training.

Every pooled program is watched again during self-play; one that misbehaves is retired
(blacklisted with a reason, removed from pool and memory) and its pending designer sample gets
``RETIRE_PENALTY`` (-0.5). Reasons: ``play_timeout``, ``slow_in_play``, ``garbage_wins``,
``solution_fails_in_play``, ``constant_answer``, ``nondeterministic_in_play``. The spot checks
(garbage, solution and reference-replay episodes, plus the agent's replies to OTHER programs,
``spadekit.selfplay.replies``) run inside the round's rollout batch as scripted episodes
(``spot_check_specs``), indistinguishable from real plays and producing no sample; without
them ``after_play`` runs them in their own sandboxes (``run_probes``). Details:
docs/design/selfplay.md.
"""

from __future__ import annotations

import inspect
import random
from typing import Annotated, Any

from pydantic import Field, StrictFloat

from spadekit.common.config_fields import Count, Positive, section
from spadekit.common.errors import SandboxError
from spadekit.common.streams import RoundStreams
from spadekit.envs.program import EnvProgram
from spadekit.sandbox.probes import garbage_actions, model_reply, words_of
from spadekit.selfplay.replies import recent_replies, reply_actions
from spadekit.selfplay.rewards import HANG_PENALTY
from spadekit.selfplay.verdicts import (FOREIGN_MIN, REPLY_MARGIN, WIN, ProbeResult,
                                        constant_answer_verdict, foreign_plan, probe_result,
                                        slow_verdict, spot_check_verdicts, turn_verdict,
                                        worker_turns)

__all__ = ["WatchConfig", "PoolWatch", "RETIRE_PENALTY", "RETIRE_REASONS", "ProbeResult",
           "run_probes", "spot_check_verdicts", "slow_verdict", "turn_verdict",
           "solution_actions_for", "probe_result", "foreign_plan", "constant_answer_verdict",
           "FOREIGN_MIN", "REPLY_MARGIN", "WIN", "worker_turns"]

RETIRE_PENALTY = HANG_PENALTY
"""The designer's fixed reward for a program retired during training (the hang penalty)."""
RETIRE_REASONS = ("play_timeout", "slow_in_play", "garbage_wins", "solution_fails_in_play",
                  "nondeterministic_in_play", "constant_answer")
PROBE_KINDS = ("garbage", "reply", "solution", "replay", "foreign")
FOREIGN_SEEDS = 15
"""Seeds drawn per program and round, besides the spot checks' own, for the constant-answer
check: on each seed with a known solution the solution of the next such seed is played."""
HINT_ECHO_EPISODES = 2
"""Garbage episodes per spot-check seed whose every reply is the program's hint followed by
garbage: a program that pays for repeating its hint pays for the hint, not the task (an honest
hint holds no answer, so these score like garbage)."""
REPLY_EPISODES = 8
"""Episodes per program and round that replay the policy's replies to other programs (scripted,
no generation: cheap), spread over the spot-check seeds."""
@section(knob="watch")
class WatchConfig:
    """How pooled programs are watched during self-play (``spadekit.selfplay.watch``)."""

    spot_checks: Count = 1
    """Garbage spot-check episodes per pooled designed environment per round, each on a fresh
    seed with fresh garbage, each paired with an episode of the program's solution on the same
    seed and (once the run has stored plays) one replaying the policy's replies to other
    programs, plus one replay of validation's reference episode (determinism), all inside the
    round's rollout batch; 0 turns spot checks off (hangs and slow steps in play are still
    watched)."""
    step_time_limit_s: Positive = 1.0
    """A program whose mean step time in one round's plays exceeds this many seconds is retired
    (``slow_in_play``)."""
    slow_step_factor: Positive = 20.0
    """... or whose mean step time exceeds this multiple of its median call time in
    validation,"""
    slow_step_min_s: Positive = 0.05
    """... provided it is also above this many seconds (a 0.1 ms step becoming 3 ms is noise)."""
    turn_time_limit_s: Positive = 5.0
    """... or whose worker spends more than this many seconds on one rollout turn, all its
    episodes of the turn together, on average over the round (a worker serves a program's plays
    one after another: 0.95 s a call holds every turn 7.6 s at 8 plays, though each call is
    under ``step_time_limit_s``)."""
    action_margin: Annotated[StrictFloat, Field(gt=0, le=1)] = 0.5
    """``garbage_wins`` unless garbage's mean return on the spot checks' seeds is at least this
    much below the solution's mean return on the same seeds."""


def run_probes(envs: Any, probes: list[tuple[EnvProgram, int, list[str]]],
               max_turns: int) -> list[ProbeResult]:
    """Play each ``(program, seed, actions)`` (constructed with ``max_turns``), all in lockstep,
    until its actions run out or the episode ends; a typed failure ends that probe only
    (``ProbeResult.error``). ``envs``: where plays run, an ``EnvBackend`` or a ``SandboxPool``
    (one sandbox per distinct program, loaded in parallel, released at the end). Step times
    are each step's own where the backend measures them (the local pool), else not kept.
    Outside a rollout: the watch's fallback, and tests' reference episodes."""
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
                res.terminated = bool(term)
                if sec is not None:
                    res.step_s.append(sec)
                if not (term or trunc):
                    still.append((i, env))
            live = still
            turn += 1
    for res in results:  # what was not played is not part of the episode
        del res.actions[len(res.rewards) + (res.error is not None):]
    return results


def solution_actions_for(pool: Any, program: EnvProgram, seeds: list[int], max_turns: int,
                         tooluse: bool = False) -> tuple[dict[int, list[str]], list[dict]]:
    """The program's ``solution()`` after ``reset(seed=s)`` for each seed, each on an instance of
    its own, computed in a sandbox of its own from ``pool`` (not the rollout's), and its tool
    schemas for a tool-use program.
    A seed whose solution fails (or a program that does not load) is left out."""
    found: dict[int, list[str]] = {}
    tools: list[dict] = []
    if pool is None or not seeds:
        return found, tools
    try:
        sb = pool.acquire(program.code)
    except SandboxError:
        return found, tools
    try:
        env = sb.new_env(max_turns=max_turns)
        if tooluse and sb.program.get("has_tools"):
            try:
                tools = list(env.tools())
            except SandboxError:
                tools = []
        if not sb.program.get("has_solution"):
            return found, tools
        for seed in seeds:  # an instance each, as play has: no "reset again" tell
            try:
                env = sb.new_env(max_turns=max_turns)
                env.reset(seed=seed)
                actions = list(env.solution())
            except SandboxError:
                continue
            if actions and len(actions) <= max_turns:
                found[seed] = actions
    except SandboxError:
        pass
    finally:
        pool.release(sb)
    return found, tools


def _garbage(seed: int, n: int, tooluse: bool, tools: list[dict],
             solution: list[str] | None, hint: str | None = None) -> list[str]:
    """``garbage_actions`` with the program's hint (whose words some replies repeat) where that
    function takes it. Never the solution's mutations: a solution changed in a step that does
    not matter still wins an honest game (the validator records those only, too), so counting
    them as garbage retired honest programs."""
    del solution
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    takes = inspect.signature(garbage_actions).parameters
    if hint and "hint" in takes:
        kwargs["hint"] = hint
    return list(garbage_actions(seed, n, tooluse, **kwargs))


class PoolWatch:
    """The watch of one self-play run (rank 0): ``spot_check_specs`` gives the loop the
    scripted episodes to mix into a round's batch; after the round's plays, ``after_play``
    finds the programs to retire, retires them (``retire``) and returns their sha256s with the
    round's ``watch/*`` metrics."""

    def __init__(self, config: WatchConfig, store: Any, memory: Any, envs: Any, max_turns: int,
                 tooluse: bool, pool: Any = None) -> None:
        """``envs``: where fallback spot checks run (the run's ``EnvBackend``, or a
        ``SandboxPool``); ``pool``: the ``SandboxPool`` the solutions are computed in (default:
        ``envs`` itself when it is one, else its ``pool``)."""
        from spadekit.sandbox.pool import SandboxPool

        self.config, self.store, self.memory, self.envs = config, store, memory, envs
        self.max_turns, self.tooluse = max_turns, tooluse
        self.pool = pool if pool is not None else (
            envs if isinstance(envs, SandboxPool) else getattr(envs, "pool", None))

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

    def _watched_rows(self, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
        return [r for r in self.store.environments(status="pooled")
                if not (r.get("lineage") or {}).get("bootstrap") and r["sha256"] not in exclude]

    def _plan(self, program: EnvProgram, rng: random.Random) -> list[tuple[str, int, list[str]]]:
        """One program's spot checks this round: ``(kind, seed, actions)`` for each garbage
        episode, on the same seeds one replaying the policy's stored replies to other programs
        (``selfplay.replies``; before any is stored, drawn model-like replies repeating the
        hint's words, ``probes.model_reply``), the solution on those seeds (where
        known) and the reference replay."""
        seeds = [rng.randrange(2 ** 31) for _ in range(self.config.spot_checks)]
        action_seeds = [rng.randrange(2 ** 31) for _ in seeds]
        extra = [rng.randrange(2 ** 31) for _ in range(FOREIGN_SEEDS if seeds else 0)]
        solutions, tools = solution_actions_for(self.pool, program, seeds + extra,
                                                self.max_turns, self.tooluse)
        plan = [("garbage", seed, _garbage(a, self.max_turns, self.tooluse, tools,
                                           solutions.get(seed), program.hint))
                for seed, a in zip(seeds, action_seeds)]
        if program.hint:  # the hint's own text before garbage: pays only if the hint does
            plan += [("garbage", seed, [f"{program.hint}\n\n{g}" for g in _garbage(
                rng.randrange(2 ** 31), self.max_turns, self.tooluse, tools, None)])
                for seed in seeds for _ in range(HINT_ECHO_EPISODES)]
        stored = recent_replies(self.store, program.sha256)
        hint = words_of(program.hint)
        reply_seeds = [seeds[i % len(seeds)] for i in range(REPLY_EPISODES)] if seeds else []
        for seed in reply_seeds:  # before any stored reply (round 0): drawn model-like replies
            replies = reply_actions(stored, self.max_turns, rng) or [
                model_reply(rng, self.tooluse, (), tools, (), hint)
                for _ in range(self.max_turns)]
            plan.append(("reply", seed, replies))
        plan += [("solution", seed, solutions[seed]) for seed in seeds if seed in solutions]
        plan += foreign_plan(seeds + extra, solutions)
        admitted = self.validated(program.sha256)[0]
        if admitted is not None:
            plan.append(("replay", int(admitted["seed"]), list(admitted["actions"])))
        return plan

    def spot_check_specs(self, streams: RoundStreams) -> list[Any]:
        """The scripted episodes of this round's spot checks of every pooled designed
        environment (none when ``spot_checks`` is 0), for the loop to shuffle among its plays;
        tagged ``{"env", "probe": kind, "with_hint": False, "designed": True, "skill"}``. Each
        program's plan draws from the round's ``spot_checks`` stream keyed by the program, so
        another program's checks never move its seeds or garbage."""
        from spadekit.rollout.engine import EpisodeSpec

        if self.config.spot_checks == 0:
            return []
        specs = []
        for row in self._watched_rows():
            program = self.store.get_program(row["sha256"])
            tag = {"env": row["sha256"], "skill": row.get("skill"), "designed": True,
                   "with_hint": False}
            for kind, seed, actions in self._plan(
                    program, streams.get("spot_checks", program.sha256)):
                specs.append(EpisodeSpec(program, seed=seed, scripted=tuple(actions),
                                         tag={**tag, "probe": kind}))
        return specs

    def after_play(self, step: int, trajs: list[Any], streams: RoundStreams
                   ) -> tuple[set[str], dict[str, float]]:
        """Verdicts on this round's trajectories (the agent's plays and the in-batch spot
        checks, told apart by ``tag["probe"]``); fallback spot checks for pooled designed
        environments the batch did not check."""
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        by_env: dict[str, list[Any]] = {}
        for tr in trajs:
            if tr.spec.program is not None:
                by_env.setdefault(tr.spec.program.sha256, []).append(tr)
        probed: dict[str, dict[str, list[ProbeResult]]] = {}
        errors = 0
        for sha, group in by_env.items():
            for tr in group:
                kind = tr.spec.tag.get("probe")
                if kind in PROBE_KINDS:
                    res = probe_result(tr)
                    probed.setdefault(sha, {k: [] for k in PROBE_KINDS})[kind].append(res)
                    errors += res.error is not None and res.error_reason != "timeout"
            hung = [t for t in group if (t.failure or {}).get("reason") == "timeout"]
            if hung:
                found[sha] = ("play_timeout", {"episodes": len(hung), "error": hung[0].failure,
                                               "spot_check": any(t.spec.tag.get("probe")
                                                                 for t in hung)})
                continue
            reason, details = slow_verdict([turn.step_s for t in group for turn in t.turns],
                                           self.validated(sha)[1], self.config)
            if not reason:
                reason, details = turn_verdict(worker_turns(group), self.config)
            if reason:
                found[sha] = (reason, details)
        for sha, kinds in probed.items():
            if sha in found:
                continue
            reason, details = self._verdict(sha, kinds)
            if reason:
                found[sha] = (reason, {**details, "spot_check": True, "in_batch": True})
        fallback, fb_errors = self._spot_checks_outside(streams, found, set(probed))
        metrics = {"watch/spot_checked_envs": float(len(probed) + fallback),
                   "watch/spot_check_errors": float(errors + fb_errors),
                   "watch/spot_check_episodes": float(sum(
                       len(v) for kinds in probed.values() for v in kinds.values())),
                   "watch/spot_checked_outside": float(fallback)}
        for reason in RETIRE_REASONS:
            metrics[f"watch/{reason}"] = float(sum(1 for r, _d in found.values() if r == reason))
        penalised = sum(self.retire(sha, reason, step, details)
                        for sha, (reason, details) in found.items())
        metrics.update({"watch/retired": float(len(found)),
                        "watch/designer_penalised": float(penalised)})
        return set(found), metrics

    def _verdict(self, sha: str, kinds: dict[str, list[ProbeResult]]
                 ) -> tuple[str | None, dict[str, Any]]:
        admitted = self.validated(sha)[0]
        replay = kinds["replay"][0] if kinds["replay"] else None
        reason, details = spot_check_verdicts(kinds["garbage"], replay, admitted,
                                              kinds["solution"], self.config.action_margin,
                                              kinds["reply"])
        return (reason, details) if reason else constant_answer_verdict(kinds["foreign"])

    def _spot_checks_outside(self, streams: RoundStreams,
                             found: dict[str, tuple[str, dict[str, Any]]],
                             probed: set[str]) -> tuple[int, int]:
        """The fallback: spot-check, in sandboxes of their own, every pooled designed
        environment neither condemned nor checked in the batch; adds verdicts to ``found``;
        returns (environments checked, probes that ended in another typed error)."""
        if self.config.spot_checks == 0:
            return 0, 0
        rows = self._watched_rows(set(found) | probed)
        probes, owners = [], []
        for row in rows:
            program = self.store.get_program(row["sha256"])
            for kind, seed, actions in self._plan(
                    program, streams.get("spot_checks", program.sha256)):
                probes.append((program, seed, actions))
                owners.append((row["sha256"], kind))
        results = run_probes(self.envs, probes, self.max_turns) if probes else []
        kinds: dict[str, dict[str, list[ProbeResult]]] = {
            row["sha256"]: {k: [] for k in PROBE_KINDS} for row in rows}
        errors = 0
        for (sha, kind), res in zip(owners, results):
            errors += res.error is not None and res.error_reason != "timeout"
            kinds[sha][kind].append(res)
        for row in rows:
            sha = row["sha256"]
            reason, details = self._verdict(sha, kinds[sha])
            mine = [r for group in kinds[sha].values() for r in group]
            if reason is None:
                times = [s for r in mine for s in r.step_s]
                reason, details = slow_verdict(times, self.validated(sha)[1], self.config)
            if reason is None:  # one sandbox steps its probes in turn: their times add up
                per_turn: dict[int, float] = {}
                for r in mine:
                    for k, sec in enumerate(r.step_s):
                        per_turn[k] = per_turn.get(k, 0.0) + sec
                reason, details = turn_verdict([per_turn[k] for k in sorted(per_turn)],
                                               self.config)
            if reason:
                found[sha] = (reason, {**details, "spot_check": True, "in_batch": False})
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
