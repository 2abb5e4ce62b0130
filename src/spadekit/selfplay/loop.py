"""The SPADE self-play loop: ``SelfPlay._round`` is Algorithm 1 of the paper, one named step
per line, inside one database transaction (``RunStore.round``): ``generate_round`` (design,
validate, hint, play, reward, advantages) then ``finish_round`` (update, sync the generation
engine, retire, checkpoint, evaluate, commit). The pipelined round (``rollout.max_staleness >=
1``, ``spadekit.selfplay.pipeline.async_round``) and an external trainer (slime) end the same way.

Guarantees: a process killed at any moment loses at most the round in flight (the checkpoint is
written before the round commits, and the round's pointer to it is part of the commit); a
failed round is never committed. Each step declares where it runs under several processes
(``spadekit.selfplay.distributed.placed``); the run's parts are one ``RunParts``
(``spadekit.selfplay.setup``). The steps in detail: ``docs/async.md``.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spadekit.common.faults import fault_point, set_round
from spadekit.common.streams import RoundStreams
from spadekit.envs.program import EnvProgram
from spadekit.rollout.engine import EpisodeSpec, Trajectory
from spadekit.runs.tracking import scalar_metrics
from spadekit.selfplay.checkpoints import (CheckpointWriteError, disk_use, forget_unkept, sweep,
                                           unkept_folders)
from spadekit.selfplay.config import SelfPlayConfig, schedule_values, scheduled_config
from spadekit.selfplay.design import Drafts, active_skills
from spadekit.selfplay.distributed import (EVERY, MAIN, SHARED, PeerFailed, control_group,
                                           join_launch, placed)
from spadekit.selfplay.pipeline import async_round, train_metrics
from spadekit.selfplay.samples import (DueRewards, agent_samples, designer_rewards,
                                       designer_samples_from, update_ema)
from spadekit.selfplay.setup import ResumeError, RunParts
from spadekit.train.distributed import DistContext
from spadekit.train.sample import Sample

__all__ = ["PeerFailed", "ResumeError", "SelfPlay"]


@dataclass
class RoundState:
    """What one round carries from step to step: its number, open transaction, timings and
    metrics (what lands in the run database), the agent-sample count and the checkpoint."""

    step: int
    transaction: contextlib.ExitStack
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    n_agent: int = 0
    checkpoint: Path | None = None
    started: float = field(default_factory=time.perf_counter)
    streams: RoundStreams | None = None
    """The round's named random streams (``spadekit.common.streams``), set by the loop."""


class SelfPlay:
    """A self-play run in ``run_dir`` (created, or resumed when it already holds rounds). Its
    parts (``self.parts``) read as its own attributes: ``loop.store`` is ``loop.parts.store``.
    ``trainer``: one an external system gives (it owns the weights and their checkpoints; the
    run stays one process and writes no checkpoint)."""

    def __init__(self, config: SelfPlayConfig, run_dir: str | Path, *, policy: Any = None,
                 designer_policy: Any = None, resume: bool = False, console: Any = None,
                 trainer: Any = None):
        # under a launcher: join the process group (same decision on every rank: same config)
        self.dist = DistContext() if trainer is not None else join_launch(config)
        self.control = control_group(self.dist)
        self.is_main = self.dist.is_main
        self.console = console if self.is_main else None
        self.parts = RunParts(config, Path(run_dir), self.dist, self.control, self.console)
        self.config = config
        self.owns_weights = trainer is None
        self.next_step = 0
        self._broken: str | None = None
        self._base_config: SelfPlayConfig | None = None
        self._schedule_last: dict[str, Any] | None = None
        self._bootstrap_created: dict[str, int] = {}
        self._eval_cache: dict[str, Any] = {}
        self._mix: dict[str, int] = {}
        try:
            self.next_step = self.parts.build(policy, designer_policy, resume, trainer)
            self.config = self.parts.config
            self.sync_generation("start" if self.next_step == 0 else "resume")
        except BaseException:
            self.close()
            raise

    def __getattr__(self, name: str) -> Any:  # only for names not set on the loop itself
        parts = self.__dict__.get("parts")
        if parts is None:
            raise AttributeError(name)
        return getattr(parts, name)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self.parts.close()

    def __enter__(self) -> "SelfPlay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _phase(self, text: str):
        """Show what the round is doing (a spinner with elapsed time) when there is a console."""
        if self.console is None:
            yield
            return
        t = time.perf_counter()
        with self.console.status(text):
            yield
        self.console.log(f"{text} [dim]{time.perf_counter() - t:.1f}s[/dim]")

    def run(self, rounds: int | None = None) -> list[dict[str, Any]]:
        """Play ``rounds`` more rounds (default: the config's); returns each round's metrics."""
        results = []
        for _ in range(rounds if rounds is not None else self.config.rounds):
            results.append(self.round(self.next_step))
            self.next_step += 1
        return results

    # -- one round -------------------------------------------------------------------------

    def round(self, step: int) -> dict[str, Any]:
        """Play round ``step``. If it fails, nothing of it is committed, but this object's model
        weights and random streams may have moved on: continue with a new ``SelfPlay(...,
        resume=True)``, which reloads the last committed state (the CLI does this for you)."""
        if self._broken is not None:
            raise ResumeError(f"an earlier round failed ({self._broken}); open the run again "
                              f"with resume=True to continue from round {self.next_step}")
        try:
            return self._round(step)
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"[:300]
            raise

    def _round(self, step: int) -> dict[str, Any]:
        """One round of Algorithm 1, as one process runs it (with several processes each step
        runs where it is ``placed``). With ``rollout.max_staleness >= 1``: ``async_round``."""
        with contextlib.ExitStack() as transaction:  # committed by commit(); else rolled back
            r = RoundState(step, transaction, metrics={"step": step},
                           streams=self._streams(step))
            set_round(step)  # the fault points (spadekit.common.faults) are named by round
            self.apply_schedule(r)
            fault_point("begin")
            self.begin_round(r)
            if self.config.rollout.max_staleness:
                return async_round(self, r)
            samples = self.generate_round(r)  # 1-6: design, validate, hint, play, reward,
            return self.finish_round(r, samples)  # advantages; 7-8: update ... commit

    def _streams(self, step: int) -> RoundStreams:
        """Round ``step``'s named random streams, under the run's seed and secret key."""
        return RoundStreams(self.config.seed, step, self.config.stream_key or "")

    def generate_round(self, r: RoundState) -> list[Sample]:
        """The generation half of round ``r``: design (or the baseline curriculum), validate,
        hint, play, reward and advantages, with their fault points; returns the round's samples,
        the agent's ``r.n_agent`` first (both the synchronous and the pipelined round)."""
        if self.designs_now(r.step):
            fault_point("design")
            drafts = self.design_environments(r)
            fault_point("validate")
            drafts = self.validate(r, drafts)
            fault_point("hint")
            self.hint(r, drafts)
        fault_point("play")
        plays = self.play(r)
        fault_point("reward")
        return self.advantages(r, plays, self.reward(r, plays))

    def finish_round(self, r: RoundState, samples: list[Sample] | None) -> dict[str, Any]:
        """The end of every round: 7. ``update`` on ``samples`` (None: the pipelined round
        trained beside generation), the push to the generation engine, retirement, 8. the
        checkpoint, the in-loop evaluation and the commit, with their fault points."""
        fault_point("update")
        if samples is not None:
            self.update(r, samples)
        fault_point("sync")
        self.sync_generation(f"round {r.step}", r)
        fault_point("retire")
        self.retire(r)
        fault_point("save")
        self.save_checkpoint(r, self.checkpoint_dir(r))
        fault_point("evaluate")
        self.evaluate(r)
        return self.commit(r)

    # -- the steps of a round ----------------------------------------------------------------

    def designs_now(self, step: int) -> bool:
        """Whether the designer writes environments this round (SPADE, every regen_interval)."""
        return (self.config.curriculum.kind == "spade"
                and step % self.config.regen_interval == 0)

    @placed(EVERY)
    def apply_schedule(self, r: RoundState) -> None:
        """This round's config: the base config plus ``config.schedule``'s entries so far."""
        r.metrics.update(self._apply_schedule(r.step))

    @placed(MAIN)
    def begin_round(self, r: RoundState) -> None:
        """The round's database transaction: nothing of the round lands before commit()."""
        r.transaction.enter_context(self.store.round(r.step))

    @placed(MAIN, full_weights=True)
    def design_environments(self, r: RoundState) -> Drafts:
        """1. The designer writes ``envs_per_round`` programs for the active skills."""
        return self.design.design(r.step, r.streams, phase=self._phase)

    @placed(MAIN, full_weights=True)
    def validate(self, r: RoundState, drafts: Drafts) -> Drafts:
        """2. Each program is checked in the sandbox (and repaired, judged, if configured)."""
        return self.design.validate(drafts, r.streams, phase=self._phase)

    @placed(MAIN, full_weights=True)
    def hint(self, r: RoundState, drafts: Drafts) -> None:
        """3. Each valid program gets its privileged hint and joins the pool."""
        outcome = self.design.hint(drafts, r.streams, phase=self._phase)
        r.timings.update(outcome.timings)
        r.metrics.update(designed=outcome.attempted, valid=outcome.valid,
                         valid_share=outcome.valid_share, pooled=len(outcome.pooled),
                         designer_tokens=outcome.designer_tokens,
                         hints_ok=outcome.hints["ok"], hints_leaked=outcome.hints["leaks"],
                         hints_leaked_literal=outcome.hints["leaks_literal"],
                         hints_leaked_empirical=outcome.hints["leaks_empirical"],
                         invalid_reasons=outcome.reasons, repaired=outcome.repaired,
                         repair_calls=outcome.repair_calls,
                         judge_rejected=outcome.judge.get("reject", 0),
                         blacklist_skipped=outcome.blacklisted,
                         **{f"thinking_cut/{role}": n
                            for role, n in outcome.thinking_cut.items()})

    @placed(MAIN, full_weights=True)
    def play(self, r: RoundState) -> list[Trajectory]:
        """4. The agent plays the pool (with bootstrap environments), with and without hints;
        the watch retires programs that hung, slowed down or were gamed, untrained on. A
        baseline curriculum picks the plays instead."""
        step, t = r.step, time.perf_counter()
        if self.curriculum is not None:
            with self._phase(f"round {step}: play ({self.curriculum.name} curriculum)"):
                trajs = self._play_curriculum(step, r.streams)
            r.timings["play"] = time.perf_counter() - t
            r.metrics.update(self.curriculum.observe(step, trajs))
            return trajs
        self._bootstrap(step, r.streams)
        with self._phase(f"round {step}: play"):
            trajs = self._play(step, r.streams)
        r.timings["play"] = time.perf_counter() - t
        t = time.perf_counter()
        retired, watched = self.watch.after_play(step, trajs, r.streams)
        r.timings["watch"] = time.perf_counter() - t
        plays = [tr for tr in trajs if not tr.scripted]  # spot checks are never trained on
        kept = [tr for tr in plays if tr.spec.tag["env"] not in retired]
        r.metrics.update(watched, **{"watch/episodes_dropped": len(plays) - len(kept)})
        return kept

    @placed(MAIN)
    def reward(self, r: RoundState, plays: list[Trajectory]) -> DueRewards:
        """5. Rewards: each play's return (already in ``plays``); the designer samples due this
        round get the configured designer signal (regret + plateau by default)."""
        r.metrics.update(self._mix)
        return designer_rewards(self.store, self.memory, self.ema, self.config, r.step,
                                r.metrics)

    @placed(SHARED)
    def advantages(self, r: RoundState, plays: list[Trajectory],
                   due: DueRewards) -> list[Sample]:
        """6. GRPO advantages per role: the agent's within each environment, the designer's
        centred per skill and upweighted. Agent samples first, then designer samples."""
        agent = agent_samples(plays, self.config, r.metrics)
        designer = designer_samples_from(due, self.store, self.config, r.step, len(agent),
                                         r.metrics)
        if not self.config.train_designer or self.config.designer.model:
            # ablation, or a frozen designer model: rewarded and logged, never trained
            r.metrics["designer_samples_dropped"] = len(designer)
            designer = []
        r.n_agent = len(agent)
        return agent + designer

    @placed(EVERY)
    def update(self, r: RoundState, samples: list[Sample]) -> None:
        """7. One GRPO step of the one policy on both roles' samples."""
        t = time.perf_counter()
        with self._phase(f"round {r.step}: update ({r.n_agent} agent + "
                         f"{len(samples) - r.n_agent} designer samples)"):
            stats = self.trainer.train_step(samples) if samples else {}
        r.timings["update"] = time.perf_counter() - t
        r.metrics.update(train_metrics(stats))
        self.pipeline.trained_now(samples, stats)

    @placed(MAIN, full_weights=True)
    def sync_generation(self, what: str, r: RoundState | None = None) -> None:
        """Push the trained weights into the generation engine (``config.generation_model``),
        at the start, after a resume (``what``) and after each update (``r``)."""
        if not self.config.generation_model:
            return
        from spadekit.policy.openai_wire import EngineLost
        from spadekit.policy.weight_items import WeightSyncError

        t = time.perf_counter()
        try:
            sync = self.weight_sync.push(self.trainer) or {}
        except EngineLost:
            raise  # the engine is gone: the round cannot commit
        except WeightSyncError as exc:
            if r is None or not self.config.rollout.max_staleness:
                raise
            # asynchronous: the engine keeps its old weights (the push restored them), its
            # next batches are staler, and one past the bound is cancelled; counted, never silent
            r.metrics["async/push_failed"] = 1
            r.metrics["weight_sync/failed"] = 1
            self.store.append_event({"kind": "push_failed", "step": r.step,
                                     "error": type(exc).__name__, "message": str(exc)[:500],
                                     "generator_version": self.pipeline.versions.generator})
            r.timings["weight_sync"] = time.perf_counter() - t
            return
        self.pipeline.versions.generator = self.pipeline.versions.trainer
        if r is not None:
            r.metrics.update({f"weight_sync/{k}": v for k, v in sync.items()
                              if isinstance(v, (int, float))})
            r.timings["weight_sync"] = time.perf_counter() - t

    @placed(MAIN)
    def retire(self, r: RoundState) -> None:
        """Environments past their interval retire to memory; the loop state is stored."""
        cfg, step = self.config, r.step
        for row in self.store.environments(status="pooled"):
            sha = row["sha256"]
            update_ema(self.store, self.ema, cfg, sha, step)  # this round's win rate
            born = self._bootstrap_created.get(sha, row.get("created_step") or 0)
            bootstrap = (row.get("lineage") or {}).get("bootstrap")
            if bootstrap or step - born + 1 >= cfg.regen_interval:
                self.store.set_status(sha, "retired", step)
                if sha in self.memory:
                    self.memory.refresh_from_store(sha, step=step)
        self.store.put_state("loop", {
            "corpus": self.corpus.state() if self.corpus is not None else None,
            "ema": {sha: t.state_dict() for sha, t in self.ema.items()},
            "curriculum": (self.curriculum.state_dict() if self.curriculum is not None
                           else None)})

    @placed(SHARED)
    def checkpoint_dir(self, r: RoundState) -> str | None:
        """8. Where this round's checkpoint goes (every ``checkpoint_every`` rounds), or None
        (also always None when an external trainer owns the weights)."""
        if not self.owns_weights or (r.step + 1) % self.config.checkpoint_every != 0:
            return None
        r.checkpoint = self.store.checkpoint_dir(r.step, create=True)
        return str(r.checkpoint.resolve())

    @placed(EVERY)
    def save_checkpoint(self, r: RoundState, path: str | None) -> None:
        """8. Weights, optimizer and RNG to ``path`` (every rank takes part; rank 0 writes)."""
        if path is None:
            return
        with self._phase(f"round {r.step}: checkpoint"):
            try:
                self.trainer.save(Path(path))
            except Exception as exc:  # OSError, and safetensors' and torch's own errors
                free = shutil.disk_usage(Path(path).parent).free if Path(path).parent.exists() \
                    else None
                raise CheckpointWriteError(
                    f"could not write the checkpoint of round {r.step} to {path}: {exc}"
                    + (f" ({free / 2**20:.0f} MB free)" if free is not None else "")
                    + "; the round is not committed, the previous checkpoint is kept",
                    step=r.step) from exc

    @placed(MAIN, full_weights=True)
    def evaluate(self, r: RoundState) -> None:
        """The in-loop evaluation suites, every ``eval.every`` rounds."""
        cfg = self.config
        if not (cfg.eval.every and (r.step + 1) % cfg.eval.every == 0):
            return
        t = time.perf_counter()
        with self._phase(f"round {r.step}: evaluate ({', '.join(cfg.eval.suites)})"):
            r.metrics.update(self._evaluate(r.step))
        r.timings["eval"] = time.perf_counter() - t

    @placed(SHARED)
    def commit(self, r: RoundState) -> dict[str, Any]:
        """The checkpoint pointer, the metrics and the events, then the commit."""
        step, metrics = r.step, r.metrics
        if r.checkpoint is not None:
            # with the versions and ledger as this round leaves them: a resume that has to
            # fall back to this checkpoint rolls the pipeline back to them
            self.store.record_checkpoint(step, r.checkpoint,
                                         meta={"pipeline": self.pipeline.state()})
        # retention: older pointers go with this commit, their folders right after it
        keep = forget_unkept(self.store, self.config.checkpoint)
        stale = unkept_folders(self.run_dir, keep)
        metrics["checkpoints_kept"] = len(keep)
        metrics["run_dir_mb"] = round((disk_use(self.run_dir) - sum(
            disk_use(f) for f in stale)) / 2**20, 2)
        metrics["world_size"] = self.trainer.dist.world_size
        metrics["timings_s"] = {k: round(v, 3) for k, v in r.timings.items()}
        metrics["seconds"] = round(time.perf_counter() - r.started, 3)
        self.pipeline.record(step, metrics)  # the token ledger, checked to balance
        self.store.log_metrics(step, {k: v for k, v in metrics.items()
                                      if isinstance(v, (int, float)) and k != "step"})
        self.store.append_event({"kind": "round", **metrics})
        fault_point("commit")
        r.transaction.close()  # commit the round
        fault_point("committed")
        sweep(stale)
        scalars = scalar_metrics(metrics)  # after the commit, like events.jsonl
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.tracking is not None:  # the same scalars; never raises
            self.tracking.log_round(step, scalars)
        return metrics

    # -- helpers of the steps ----------------------------------------------------------------

    def _apply_schedule(self, step: int) -> dict[str, Any]:
        """``config.schedule``: make ``self.config`` round ``step``'s effective config (the
        base plus every entry with ``from_round <= step``; the same after a resume). Returns
        ``schedule/<key>`` metrics on the first round of this process and whenever it changes."""
        base = self._base_config = self._base_config or self.config
        if not base.schedule:
            return {}
        self.config = scheduled_config(base, step)
        if self.design is not None:
            self.design.config = self.config
        values = schedule_values(self.config)
        if values == self._schedule_last:
            return {}
        self._schedule_last = values
        return {"schedule/changed": 1, **{f"schedule/{k}": v for k, v in values.items()}}

    def _play_curriculum(self, step: int, streams: RoundStreams) -> list[Trajectory]:
        """A baseline's round: the curriculum picks the plays; no designer, no hints."""
        cfg = self.config
        specs = self.curriculum.episodes(step, streams.get("curriculum"), cfg.envs_per_round,
                                         cfg.plays_per_env(cfg.envs_per_round))
        trajs = self.engine.run(specs) if specs else []
        rows: dict[str, str] = {}
        for tr in trajs:
            key = tr.spec.tag["env"]
            if key not in rows:
                rows[key] = self._baseline_env_row(tr, step)
            self.store.record_episode(tr, step=step, env_sha=rows[key], with_hint=False,
                                      role="agent", play=True)
        self._mix = {"pool_designed": 0, "pool_bootstrap": 0, "pool_baseline": len(rows)}
        return trajs

    def _baseline_env_row(self, tr: Trajectory, step: int) -> str:
        """The environments row a baseline's play points at: the program itself, or for a
        packaged problem (rlve) a descriptor row saying what was played."""
        program = tr.spec.program
        if program is None:
            tag = tr.spec.tag
            prompt = tr.messages[1]["content"] if len(tr.messages) > 1 else ""
            program = EnvProgram(
                code=f"# packaged problem {tag['env']} (played in-process, not a program)\n",
                skill=tag.get("skill"), domain=self.config.setting,
                source=str(tag["env"]).split(":", 1)[0] + ":" + str(tag.get("skill")),
                meta={"difficulty": tag.get("difficulty"), "prompt": prompt[:4000]})
        if not self.store.has_environment(program.sha256):
            self.store.add_environment(program, step=step, status="retired",
                                       lineage={"baseline": self.curriculum.name})
        return program.sha256

    def _evaluate(self, step: int) -> dict[str, float]:
        """The configured suites on the current weights (``spadekit.eval.inloop``)."""
        from spadekit.eval.inloop import evaluate_in_loop

        return evaluate_in_loop(self.gen_policy or self.policy, self.pool, self.config,
                                self.run_dir, step,
                                self._eval_cache)

    def _bootstrap(self, step: int, streams: RoundStreams) -> None:
        """Reference environments of the active skills join the pool for this round."""
        cfg = self.config
        if cfg.bootstrap != "library" or cfg.bootstrap_per_round == 0:
            if cfg.bootstrap not in (None, "library"):
                self._bootstrap_pool_dir(step, streams)
            return
        from spadekit.envs import library

        skills = set(active_skills(cfg.setting, cfg.skills_per_epoch,
                                   step // cfg.regen_interval))
        entries = [e for e in library.list_library() if e.setting == cfg.setting]
        chosen = [e for e in entries if e.skill in skills] or entries
        streams.get("bootstrap").shuffle(chosen)
        self._pool_bootstrap([library.program(e) for e in chosen[:cfg.bootstrap_per_round]],
                             step)

    def _bootstrap_pool_dir(self, step: int, streams: RoundStreams) -> None:
        from spadekit.runs.pool import load_pool

        programs = load_pool(self.config.bootstrap)
        streams.get("bootstrap").shuffle(programs)
        self._pool_bootstrap(programs[:self.config.bootstrap_per_round], step)

    def _pool_bootstrap(self, programs: list[EnvProgram], step: int) -> None:
        for program in programs:
            if self.memory.blacklist_reason(program) is not None:  # retired (or a near
                continue  # duplicate of a retired program): never again
            if not self.store.has_environment(program.sha256):
                self.store.add_environment(program, step=step, lineage={"bootstrap": True})
            self.store.set_status(program.sha256, "pooled", step)
            self._bootstrap_created[program.sha256] = step

    def _play(self, step: int, streams: RoundStreams) -> list[Trajectory]:
        """The round's plays: each environment's seeds from the ``play`` (and ``play_hint``)
        stream keyed by the environment, so another environment's plays never move them."""
        cfg = self.config
        specs = []
        pooled = self.store.environments(status="pooled")
        plays = cfg.plays_per_env(len(pooled))  # agent_samples_per_round / pool, or fixed
        for row in pooled:
            program = self.store.get_program(row["sha256"])
            designed = not (row.get("lineage") or {}).get("bootstrap")
            tag = {"env": row["sha256"], "skill": row.get("skill"), "designed": designed}
            seeds = streams.get("play", row["sha256"])
            for _ in range(plays):
                specs.append(EpisodeSpec(program, seed=seeds.randrange(2 ** 31),
                                         tag={**tag, "with_hint": False}))
            hint = program.hint
            if designed and hint and row.get("created_step") == step:
                seeds = streams.get("play_hint", row["sha256"])
                for _ in range(cfg.hint_generations):
                    specs.append(EpisodeSpec(program, seed=seeds.randrange(2 ** 31), hint=hint,
                                             tag={**tag, "with_hint": True}))
        designed_envs = {s.tag["env"] for s in specs if s.tag["designed"]}
        self._mix = {"pool_designed": len(designed_envs),
                     "pool_bootstrap": len({s.tag["env"] for s in specs}) - len(designed_envs)}
        # the watch's spot checks (scripted garbage, solution and replay episodes) ride in the
        # same batch, shuffled among the plays: same session, worker and lockstep
        probes = self.watch.spot_check_specs(streams) if specs else []
        if probes:
            specs += probes
            streams.get("order").shuffle(specs)
        trajs = self.engine.run(specs) if specs else []
        for tr in trajs:
            if tr.scripted:  # not an agent play: not recorded, not trained on
                continue
            self.store.record_episode(tr, step=step, env_sha=tr.spec.tag["env"],
                                      with_hint=tr.spec.tag["with_hint"], role="agent",
                                      play=True)
        return trajs

