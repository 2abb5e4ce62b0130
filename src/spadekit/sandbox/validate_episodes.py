"""The episode checks of a validation (``spadekit.sandbox.validate``): determinism, decoys,
the solution replay, the lockstep batch and the action-dependence measure.

``EpisodeChecks`` is a mixin of the validator's per-validation runner (``_Runner`` in
``validate.py``, which supplies the plumbing: ``fresh``, ``draw``, ``_play``, ``_budget``, the
call timings and ``settings``). The checks, their order and reason codes are described in
``validate.py``'s module docstring; this file holds them so that each file stays readable.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from spadekit.common.errors import EnvRaised, InvalidResult, SandboxError
from spadekit.envs.scan_limits import PARENT_REASONS
from spadekit.sandbox.lockstep import LockstepError, play_lockstep
from spadekit.sandbox.play import episode_return
from spadekit.sandbox.probes import garbage_action, garbage_actions, random_policy_actions

BASELINE_EPISODES = 3
"""Garbage and random-policy episodes per drawn solution seed (each measured)."""
BLIND_PICK = 6
"""At least this many first-pass seeds for each blind reply (so decoys lucky on a few seeds
rarely crowd out a reply that pays on every one)."""
BLIND_FINALISTS = 6
"""Blind replies measured on ``blind_episodes`` fresh seeds after the first pass."""
BLIND_BUDGET_EPISODES = 96
"""The blind phase's time budget is ``total_timeout`` per this many planned episodes."""


class _Fail(Exception):
    def __init__(self, stage: str, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.stage, self.reason, self.message, self.details = stage, reason, message, details


def _err(exc: SandboxError) -> dict[str, Any]:
    return {"error": exc.to_dict()}


class EpisodeChecks:
    """determinism -> solution -> lockstep -> action_dependent (see the module docstring)."""

    def _garbage_episode(self, stage: str) -> dict:
        """A fresh instance plays drawn garbage from a drawn seed until it ends or the cap."""
        env, cap = self.fresh(stage)
        seed, action_seed = self.draw(), self.draw()
        actions = garbage_actions(action_seed, cap, self.tooluse, self.advertised, self.schemas,
                                  **self.echoed())
        trace = self._play(stage, env, seed, actions)
        return _episode(seed, actions, trace, cap, action_seed=action_seed)

    def echoed(self) -> dict[str, Any]:
        """The texts whose words garbage replies may repeat: the program's first observation
        and its hint (``garbage_actions``' ``observation`` and ``hint``)."""
        return {"observation": getattr(self, "observation", None),
                "hint": getattr(self, "hint", None)}

    def decoys(self) -> None:
        """A drawn number of instances, each reset and played for 0 to 2 garbage actions."""
        for _ in range(self.rng.randint(0, self.settings.decoy_instances)):
            env, _cap = self.fresh("determinism")
            actions = [garbage_action(self.rng, self.tooluse, self.advertised, self.schemas)
                       for _ in range(self.rng.randint(0, 2))]
            self._play("determinism", env, self.draw(), actions)

    def determinism(self) -> dict:
        episode = self._garbage_episode("determinism")
        env, _cap = self.fresh("determinism")
        _same_or_fail("determinism", episode["trace"], self._play(
            "determinism", env, episode["seed"], episode["actions"]), "on a new instance")
        self.episodes.append(episode)
        self.decoys()
        return {"reference_episode": {k: episode[k] for k in
                                      ("seed", "actions", "rewards", "terminated", "truncated")}}

    def solution(self) -> dict:
        """Each seed on a fresh instance: reset, ``solution()``, replay; full score required."""
        self.solved: list[dict] = []
        own = len(self.settings.seeds) + self.settings.solution_drawn_seeds
        plays = list(dict.fromkeys(getattr(self, "play_seeds", ())))
        self.scale = (own + len(plays)) / own  # the caller's seeds: the budgets grow with them
        if not self.sb.program.get("has_solution"):
            return self._without("absent", "the program has no solution() method")
        seeds = list(self.settings.seeds) + [self.draw()
                                              for _ in range(self.settings.solution_drawn_seeds)]
        seeds += [s for s in plays if s not in seeds]
        self.seeds["solution"] = seeds
        for seed in seeds:
            env, cap = self.fresh("solution")
            self._reset("solution", env, seed)
            try:
                actions = env.solution()
            except InvalidResult as exc:
                if exc.reason == "not_replayable":  # a reference-style prose solution
                    return self._without("not_replayable", exc.message)
                if exc.reason in PARENT_REASONS:  # the parent could not read it: no hang
                    raise _Fail("solution", exc.reason, exc.message, seed=seed,
                                **_err(exc)) from None
                raise _Fail("solution", "solution_fails", exc.message) from None
            except EnvRaised as exc:
                if exc.exc_type == "NotImplementedError":
                    return self._without("absent", "solution() raises NotImplementedError")
                raise _Fail("solution", "solution_fails", f"solution() failed: {exc.message}",
                            **_err(exc)) from None
            except SandboxError as exc:
                raise _Fail("solution", "solution_fails" if exc.reason == "env_raised"
                            else exc.reason, f"solution() failed: {exc.message}",
                            **_err(exc)) from None
            if len(actions) > cap:
                raise _Fail("solution", "solution_fails", f"solution() for seed {seed} has "
                            f"{len(actions)} actions, more than max_turns={cap}", seed=seed)
            env2, _ = self.fresh("solution")  # replayed on an instance that only saw the reset
            trace = self._play("solution", env2, seed, actions)
            last = trace[-1]
            if len(last) < 4 or last[1] < 1.0 or not last[2]:
                got = "no steps" if len(last) < 4 else (f"reward {last[1]:g}, terminated="
                                                        f"{last[2]}")
                raise _Fail("solution", "solution_fails", f"replaying solution() for seed {seed} "
                            f"does not reach reward 1.0 ({got} after {len(trace) - 1} of "
                            f"{len(actions)} actions)", seed=seed)
            self.solved.append(_episode(seed, list(actions), trace, cap))
        return {"solution": "replayed", "solution_turns": [len(e["rewards"])
                                                           for e in self.solved]}

    def _without(self, what: str, why: str) -> dict:
        if self.settings.require_solution:
            raise _Fail("solution", "no_solution", f"{why}: a program must come with a "
                        "solution() that returns the actions that win the episode of the seed "
                        "it was reset with", solution=what)
        return {"solution": what} | ({"solution_note": why} if what == "not_replayable" else {})

    def lockstep(self) -> dict:
        """The scored episodes, interleaved in one worker in a drawn order, as play runs them:
        each solution replay and, on the same seeds, a garbage and a random-policy episode; the
        determinism reference replayed; garbage episodes to fill ``lockstep_instances``."""
        cap = self.episodes[0]["cap"]
        plan: list[tuple[str, int, list[str], dict | None]] = [
            ("replay", self.episodes[0]["seed"], self.episodes[0]["actions"], self.episodes[0])]
        fixed = set(self.settings.seeds) if self.settings.solution_drawn_seeds else set()
        args = (cap, self.tooluse, self.advertised, self.schemas)
        echo = self.echoed()
        for sol in self.solved:  # the baselines count on drawn seeds: the fixed ones are public
            public = sol["seed"] in fixed
            plan += [("solution", sol["seed"], sol["actions"], sol),
                     ("mutant", sol["seed"], garbage_actions(
                         self.draw(), *args, solution=sol["actions"], **echo), None)]
            for _ in range(1 if public else BASELINE_EPISODES):
                plan.append(("public" if public else "garbage", sol["seed"],
                             garbage_actions(self.draw(), *args, **echo), None))
            for _ in range(0 if public else BASELINE_EPISODES):
                plan.append(("random", sol["seed"], random_policy_actions(
                    self.draw(), *args, solution=sol["actions"]), None))
        if not self.solved:  # no solution to replay: garbage on the caller's seeds all the same
            plan += [("garbage", seed, garbage_actions(self.draw(), *args, **echo), None)
                     for seed in dict.fromkeys(getattr(self, "play_seeds", ()))
                     for _ in range(BASELINE_EPISODES)]
        while len(plan) < max(self.settings.lockstep_instances, 1 + self.settings.garbage_episodes):
            plan.append(("garbage", self.draw(), garbage_actions(
                self.draw(), cap, self.tooluse, self.advertised, self.schemas, **echo), None))
        self.rng.shuffle(plan)
        result = self._batch([(seed, acts) for _k, seed, acts, _o in plan], cap)
        turns = len(result.turn_seconds)
        self.scored: dict[str, list[dict]] = {"garbage": [], "random": [], "solution": [],
                                              "mutant": [], "public": []}
        for (kind, seed, actions, alone), trace in zip(plan, result.traces):
            if alone is not None:
                _same_or_fail("lockstep", alone["trace"], trace, "while other instances of the "
                              "program stepped between its steps, in the same worker (as in "
                              "play)", kind=kind, seed=seed)
            if kind != "replay":
                self.scored[kind].append(_episode(seed, actions, trace, cap))
        self.scored["public"].append(self.episodes[0])
        self.seeds["garbage"] = [e["seed"] for e in self.scored["garbage"]]
        self.turn_max = max(result.turn_seconds, default=0.0)  # reported in step_ms
        self._blind(cap)
        return {"lockstep": {"instances": len(plan), "turns": turns}}

    def _batch(self, episodes: list[tuple[int, list[str]]], cap: int) -> Any:
        """``play_lockstep`` of ``episodes`` in one worker under the turn budget."""
        slow_turns: list[float] = []
        turn_budget = self.settings.turn_budget_s * getattr(self, "scale", 1.0)

        def after_turn(total: float, steps: list[float]) -> None:
            self._budget("lockstep")
            self.times += steps
            self.slow += sum(dt > self.settings.slow_step_s for dt in steps)
            if total > turn_budget:
                slow_turns.append(round(total, 3))
            if self.slow >= self.settings.slow_steps or len(slow_turns) >= self.settings.slow_steps:
                self._slow_fail(slow_turns)

        try:
            result = play_lockstep(self.sb, episodes, cap, self.settings.max_turns, after_turn)
        except LockstepError as exc:
            fail = _Fail("lockstep", exc.error.reason, exc.error.message, **_err(exc.error))
            if exc.action is not None:
                fail.details["action"] = exc.action[:200]
            raise fail from None
        if slow_turns and len(slow_turns) >= min(self.settings.slow_steps,
                                                 len(result.turn_seconds)):
            self._slow_fail(slow_turns)
        return result

    def _blind(self, cap: int) -> None:
        """The blind-reply baseline: replies that do not read the episode, of two kinds. Each
        action the program prints, replied every turn (``printed``), and each solved seed's
        solution, replayed as it is on other seeds (``solution``), are played first on a few
        drawn seeds each (about ``2 * blind_episodes`` episodes in all, at least ``BLIND_PICK``
        each); the leaders (``BLIND_FINALISTS``, and the best of each kind) are measured on
        ``blind_episodes`` fresh seeds, their best mean per kind recorded (a single pick's mean
        would be biased upward, and decoys that win by luck could hide the reply that pays).
        Every episode has a seed of its own, batches are of ``lockstep_instances`` under the
        same turn budget, the phase has its own ``total_timeout`` (grown with its episodes:
        ``BLIND_BUDGET_EPISODES``), and the first fresh episode of each kind's best is
        replayed alone and must match."""
        n, group = self.settings.blind_episodes, max(self.settings.lockstep_instances, 1)
        self.seeds["blind"] = {"pick": [], "measure": []}
        candidates = list(dict.fromkeys(
            [("printed",) + (a,) * cap for a in self.advertised]
            + [("solution",) + tuple(e["actions"]) for e in self.solved if e["actions"]]))
        if not n or not candidates:
            return
        each = min(n, max(BLIND_PICK, -(-2 * n // len(candidates))))
        planned = each * len(candidates) + n * (BLIND_FINALISTS + 2)
        started, clock = time.monotonic(), self.clock
        # the phase's own budget, grown with its episodes; the rest of validation keeps its own
        self.clock, self.phase_scale = started, max(1.0, planned / BLIND_BUDGET_EPISODES)

        def play(plan: list[tuple[int, tuple]]) -> list[dict]:
            out: list[dict] = []
            for i in range(0, len(plan), group):
                chunk = plan[i:i + group]
                traces = self._batch([(seed, list(c[1:])) for seed, c in chunk], cap).traces
                out += [_episode(seed, list(c[1:]), trace, cap)
                        for (seed, c), trace in zip(chunk, traces)]
            return out

        def means(plan: list[tuple[int, tuple]]) -> dict[tuple, list[dict]]:
            self.rng.shuffle(plan)
            by: dict[tuple, list[dict]] = {}
            for (_seed, c), episode in zip(plan, play(plan)):
                by.setdefault(c, []).append(episode)
            return by

        pick = means([(self.draw(), c) for c in candidates for _ in range(each)])
        score = {c: _mean(pick[c]) for c in candidates}
        ranked = sorted(candidates, key=lambda c: -score[c])
        finalists = list(dict.fromkeys(ranked[:BLIND_FINALISTS] + [
            next(c for c in ranked if c[0] == kind) for kind in sorted({c[0] for c in
                                                                         candidates})]))
        measured = means([(self.draw(), c) for c in finalists for _ in range(n)])
        for c in finalists:
            best = self.blind.get(c[0])
            if best is None or _mean(measured[c]) > _mean(best[1]):
                self.blind[c[0]] = (list(c[1:]), measured[c])
        for kind, (actions, episodes) in self.blind.items():
            first = episodes[0]
            env, _ = self.fresh("lockstep")
            alone = self._play("lockstep", env, first["seed"], actions)
            _same_or_fail("lockstep", alone, first["trace"], "while other instances played "
                          "blind replies in the same worker", kind=f"blind {kind}",
                          seed=first["seed"])
        self.seeds["blind"] = {"pick": sorted({e["seed"] for v in pick.values() for e in v}),
                               "measure": sorted({e["seed"] for v in measured.values()
                                                  for e in v})}
        self.clock, self.phase_scale = clock + (time.monotonic() - started), 1.0

    def _chance(self, out: dict[str, Any], *others: float) -> float:
        """Record the blind-reply baseline (each kind's picked reply, its mean return on the
        fresh seeds; ``blind_*`` the better kind) and the chance return: the best of it and
        ``others``. Returns the printed kind's mean (0 without one): the one held to the
        margin, since a seed-independent answer (another seed's solution wins) is the watch's
        ``constant_answer`` to judge in play, and only lowers what the plateau reads."""
        means: dict[str, tuple[float, str]] = {}
        for kind, (acts, episodes) in self.blind.items():
            shown = " then ".join(a[:40] for a in acts[:3]) + (" ..." if len(acts) > 3 else "")
            means[kind] = (_mean(episodes),
                           f"replying {acts[0][:80]} (an action the program prints) every turn"
                           if kind == "printed" else
                           f"replaying another seed's solution ({shown})")
        best, reply = max(means.values(), key=lambda m: m[0], default=(0.0, None))
        printed, printed_reply = means.get("printed", (0.0, None))
        out.update(blind_mean_return=round(best, 4), blind_reply=reply,
                   printed_mean_return=round(printed, 4), printed_reply=printed_reply,
                   chance_return=round(max([best, *others]), 4))
        return printed

    def _slow_fail(self, slow_turns: list[float]) -> None:
        if slow_turns:
            raise _Fail("lockstep", "slow", f"{len(slow_turns)} lockstep turns of the program's "
                        f"instances took the worker longer than "
                        f"{self.settings.turn_budget_s * getattr(self, 'scale', 1.0):g}s "
                        f"all together (up to {max(slow_turns):.2f}s): play waits for the "
                        "worker's whole turn", slow_turns=slow_turns)
        raise _Fail("lockstep", "slow", f"{self.slow} calls took longer than "
                    f"{self.settings.slow_step_s:g}s: the program is too slow to play",
                    slow_calls=self.slow)

    def action_dependent(self) -> dict:
        garbage, rand = self.scored["garbage"], self.scored["random"]
        if not self.solved:  # without a solution every garbage episode counts
            garbage = self.scored["public"] + garbage
        best = max((r for e in garbage + rand for r in e["rewards"]), default=0.0)
        out: dict[str, Any] = {"garbage_best_reward": best,
                               "garbage_steps": sum(len(e["rewards"]) for e in garbage)}
        if not self.solved:  # no solution (require_solution off): the absolute criterion
            for episode in garbage:
                for i, reward in enumerate(episode["rewards"]):
                    if reward >= 1.0:
                        raise _Fail("action_dependent", "trivially_won", "garbage actions "
                                    f"reached reward 1.0 (seed {episode['seed']}, garbage "
                                    f"action {i + 1}: {episode['actions'][i][:80]!r})",
                                    garbage_seed=episode["seed"],
                                    garbage_actions=episode["actions"][:i + 1], **out)
            self._chance(out, _mean(garbage) if garbage else 0.0)
            return out
        solved = [e["return"] for e in self.scored["solution"]]
        same = {e["seed"] for e in rand}
        g = [e["return"] for e in garbage if e["seed"] in same]
        r = [e["return"] for e in rand]
        sol_mean = statistics.fmean(e["return"] for e in self.scored["solution"]
                                    if e["seed"] in same)
        out.update(mutant_returns=[e["return"] for e in self.scored["mutant"]],
                   solution_returns=solved, solution_mean_return=round(sol_mean, 4),
                   garbage_returns=g, garbage_mean_return=round(statistics.fmean(g), 4),
                   random_returns=r, random_mean_return=round(statistics.fmean(r), 4),
                   action_margin=self.settings.action_margin,
                   random_margin=self.settings.random_margin)
        self._chance(out, out["garbage_mean_return"], out["random_mean_return"])
        where = "on the solution's seeds"
        for who, mean, margin, on in (
                ("garbage", out["garbage_mean_return"], self.settings.action_margin, where),
                ("the random policy", out["random_mean_return"], self.settings.random_margin,
                 where),
                (out["printed_reply"], out["printed_mean_return"],
                 self.settings.random_margin, "on fresh drawn seeds")):
            if sol_mean - mean < margin - 1e-9:
                raise _Fail("action_dependent", "action_independent", f"{who} scores a mean "
                            f"return of {mean:g} {on}, less than {margin:g} below the "
                            f"solution's {sol_mean:g}: the reward does not depend enough on "
                            "the actions", **out)
        self._each_play_seed(garbage, out)
        return out

    def _each_play_seed(self, garbage: list[dict], out: dict[str, Any]) -> None:
        """On each seed the caller will play (``play_seeds``), garbage must not do as well as
        the solution in every one of its episodes: the caller scores seed by seed, and a mean
        over the other seeds would hide a seed that pays any reply."""
        plays = set(getattr(self, "play_seeds", ()))
        if not plays:
            return
        solved = {e["seed"]: e["return"] for e in self.scored["solution"]}
        for seed in sorted(plays & set(solved)):
            returns = [e["return"] for e in garbage if e["seed"] == seed]
            if returns and min(returns) >= solved[seed] - 1e-9:
                raise _Fail("action_dependent", "action_independent", f"every garbage episode "
                            f"({len(returns)}) on seed {seed}, one the caller plays, returns "
                            f"as much as the solution ({solved[seed]:g}): on that seed the "
                            "reward does not depend on the actions", play_seed=seed,
                            play_seed_garbage_returns=returns, **out)



def _mean(episodes: list[dict]) -> float:
    return statistics.fmean(e["return"] for e in episodes)


def _episode(seed: int, actions: list[str], trace: list[tuple], cap: int, **extra: Any) -> dict:
    steps = trace[1:]
    last = steps[-1] if steps else (None, None, False, False)
    return {"seed": seed, "cap": cap, "actions": actions[:len(steps)],
            "rewards": [s[1] for s in steps], "terminated": last[2], "truncated": last[3],
            "return": episode_return(last[1], bool(last[2])), "trace": trace, **extra}


def _same_or_fail(stage: str, first: list[tuple], second: list[tuple], where: str,
                  **details: Any) -> None:
    if first == second:
        return
    at = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b) \
        if len(first) == len(second) else min(len(first), len(second))
    raise _Fail(stage, "nondeterministic", "the same seed and actions gave a different "
                f"{'reset observation' if at == 0 else f'step {at} result'} {where}; use "
                "random.Random(seed) for all randomness, and no state shared between "
                "instances", first_difference=at, **details)
