"""The SPADE self-play loop: design, validate, hint, play, reward, advantages, update, checkpoint.

``SelfPlay._round`` is Algorithm 1 of the paper, one named call per step, all inside one
database transaction (``RunStore.round``):

1. ``design_environments``: at each regeneration (every ``regen_interval`` rounds) the designer
   writes ``envs_per_round`` environments for the active skills (``spadekit.selfplay.design``);
2. ``validate``: each is checked in the sandbox (an invalid one gets its fixed designer reward);
3. ``hint``: each valid one gets its privileged hint and joins the pool;
4. ``play``: bootstrap environments (reference library) join the pool while the designer is
   weak; the agent plays every pooled environment ``plays_per_env`` times without the hint
   (``ceil(agent_samples_per_round / pooled environments)``, 8 at the paper's 192 / 24, or a
   fixed ``num_generations``), and each new designer environment ``hint_generations`` times with
   the hint (16 in the paper), every play capped at ``config.turn_cap``, with the watch's
   scripted spot checks (garbage, the solution on the same seeds, the reference replay)
   shuffled into the same batch; then ``spadekit.selfplay.watch`` retires programs that hung,
   slowed down or were gamed in play or in those spot checks (designer -0.5), and their plays
   are not trained on;
5. ``reward``: the designer samples due now (generated ``regen_interval`` rounds ago) get the
   configured designer signal (default 0.4 * regret_norm + 0.6 * plateau(lifetime win rate));
   regret compares the hinted plays with the same round's no-hint plays (matched timing);
6. ``advantages``: GRPO z-scores within each environment's no-hint plays for the agent; the
   designer's rewards centred per skill, weighted by ``min(n_agent / n_designer *
   regen_interval, cap)``, importance-corrected (TIS) by the trainer;
7. ``update``: one GRPO step of the one policy (then ``sync_generation`` and ``retire``:
   environments past their interval retire to memory);
8. ``checkpoint_dir`` / ``save_checkpoint`` (weights, optimizer, RNG), ``evaluate``, then
   ``commit``; ``resume`` continues from the last commit.

A process killed at any moment loses at most the round in flight: the checkpoint is written
before the round commits, and the round's pointer to it is part of the commit. Opening and
resuming a run are the steps of ``spadekit.selfplay.setup``.

Several processes (one per GPU, DDP or FSDP): ``torchrun --nproc_per_node 8 -m spadekit selfplay
...``. The loop here is written as one process runs it; ``spadekit.selfplay.distributed`` wraps
each named step with where it runs (rank 0 owns the run directory and the environment side,
every rank trains its shard) and where the ranks meet.
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
from spadekit.selfplay.distributed import PeerFailed, control_group, join_launch, place_steps
from spadekit.selfplay.pipeline import AsyncRound, Pipeline, check_async_setup
from spadekit.selfplay.rewards import EmaTracker
from spadekit.selfplay.samples import (DueRewards, agent_samples, designer_rewards,
                                       designer_samples_from, update_ema)
from spadekit.selfplay.setup import ResumeError, SetupSteps
from spadekit.train.sample import Sample

__all__ = ["PeerFailed", "ResumeError", "SelfPlay"]


@dataclass
class RoundState:
    """What one round carries from step to step: its number, open transaction, timings and
    metrics (what lands in the run database), the agent-sample count and the checkpoint."""

    step: int
    transaction: contextlib.ExitStack | None
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    n_agent: int = 0
    checkpoint: Path | None = None
    started: float = field(default_factory=time.perf_counter)
    streams: RoundStreams | None = None
    """The round's named random streams (``spadekit.common.streams``), set by the loop."""


class SelfPlay(SetupSteps, AsyncRound):
    """A self-play run in ``run_dir`` (created, or resumed when it already holds rounds)."""

    single_process = False
    """True where another system owns the ranks (``spadekit.integrations.slime``): the run never
    joins a torch.distributed launch."""

    def __init__(self, config: SelfPlayConfig, run_dir: str | Path, *, policy: Any = None,
                 designer_policy: Any = None, resume: bool = False, console: Any = None):
        self.run_dir = Path(run_dir)
        self.store = self.pool = self.tb = self.curriculum = None  # for close() on any failure
        self.tracking = None
        self.gen_policy = self.frozen_designer = None
        # under a launcher: join the process group (same decision on every rank: same config),
        # and let spadekit.selfplay.distributed place each named step on its ranks
        if self.single_process:
            from spadekit.train.distributed import DistContext

            self.dist = DistContext()
        else:
            self.dist = join_launch(config)
        self.is_main = self.dist.is_main
        self.console = console if self.is_main else None
        place_steps(self, self.dist, control_group(self.dist))
        try:
            self._setup(config, policy, designer_policy, resume)
        except BaseException:
            self.close()
            raise

    def _setup(self, config: SelfPlayConfig, policy: Any, designer_policy: Any,
               resume: bool) -> None:
        """Open (or resume) the run: config, model, run directory, trainer, environment side,
        then the last checkpoint and loop state."""
        config, run_dir = self.open_run(config, resume)
        self.config, self.run_dir = config, Path(run_dir)
        policy = self.load_model(policy)
        self.prepare_generation(policy)
        check_async_setup(self, policy, designer_policy)  # before any file is written
        if not resume:
            self.create_run()  # only once the model is known to work
        self.policy = policy
        self.designer_policy = (designer_policy or self.frozen_designer or self.gen_policy
                                or policy)
        self.ema: dict[str, EmaTracker] = {}
        self._bootstrap_created: dict[str, int] = {}
        self._broken: str | None = None
        self._eval_cache: dict[str, Any] = {}
        self.validator = self.engine = self.memory = self.corpus = self.design = None
        self.build_trainer()
        last, pointer = self.start_environment_side(resume)
        self.pipeline = Pipeline(self.store, config.rollout.max_staleness)
        if last is not None:
            loaded = self.load_checkpoint(pointer)
            self.restore_loop_state()
            self.resume_pipeline(last, pointer, loaded)
        self.next_step = 0 if last is None else last + 1
        self.sync_generation("start" if last is None else "resume")

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if getattr(self, "tracking", None) is not None:
            self.tracking.close()  # never raises (spadekit.runs.tracking); before the store
        if getattr(self, "env_backend", None) is not None:
            self.env_backend.close()
        if getattr(self, "pool", None) is not None:
            self.pool.close()
        if getattr(self, "store", None) is not None:
            self.store.close()
        if getattr(self, "tb", None) is not None:
            self.tb.close()

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
        """One round of Algorithm 1, as one process runs it (with several processes,
        ``spadekit.selfplay.distributed.PLACEMENT`` decides where each step runs). With
        ``rollout.max_staleness >= 1``: ``async_round`` (``spadekit.selfplay.pipeline``)."""
        with contextlib.ExitStack() as transaction:  # committed by commit(); else rolled back
            r = RoundState(step, transaction, metrics={"step": step},
                           streams=self._streams(step))
            set_round(step)  # the fault points (spadekit.common.faults) are named by round
            self.apply_schedule(r)
            fault_point("begin")
            self.begin_round(r)
            if self.config.rollout.max_staleness:
                return self.async_round(r)
            samples = self.generate_round(r)
            fault_point("update")
            self.update(r, samples)
            fault_point("sync")
            self.sync_generation(f"round {step}", r)
            fault_point("retire")
            self.retire(r)
            fault_point("save")
            self.save_checkpoint(r, self.checkpoint_dir(r))
            fault_point("evaluate")
            self.evaluate(r)
            return self.commit(r)

    def produce_samples(self, step: int, timings: dict[str, float],
                        metrics: dict[str, Any]) -> tuple[list[Sample], list[Sample]]:
        """Round ``step``'s environment side, inside its open transaction: design (or the
        baseline curriculum), validate, hint, play, reward and advantages; returns the agent and
        designer samples (an external trainer such as slime's calls this). The round's
        ``schedule`` applies first, as in ``_round``."""
        r = RoundState(step, None, timings, metrics,
                       streams=self._streams(step))
        self.apply_schedule(r)
        samples = self.generate_round(r)
        return samples[:r.n_agent], samples[r.n_agent:]

    def _streams(self, step: int) -> RoundStreams:
        """Round ``step``'s named random streams, under the run's seed and secret key."""
        return RoundStreams(self.config.seed, step, self.config.stream_key or "")

    def generate_round(self, r: RoundState) -> list[Sample]:
        """The generation half of round ``r``: design (or the baseline curriculum), validate,
        hint, play, reward and advantages, with their fault points; returns the round's samples,
        the agent's ``r.n_agent`` first. The synchronous round, the pipelined round
        (``async_round``) and an external trainer (``produce_samples``) all call this."""
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

    # -- the steps of a round ----------------------------------------------------------------

    def designs_now(self, step: int) -> bool:
        """Whether the designer writes environments this round (SPADE, every regen_interval)."""
        return (self.config.curriculum.kind == "spade"
                and step % self.config.regen_interval == 0)

    def apply_schedule(self, r: RoundState) -> None:
        """This round's config: the base config plus ``config.schedule``'s entries so far."""
        r.metrics.update(self._apply_schedule(r.step))

    def begin_round(self, r: RoundState) -> None:
        """The round's database transaction: nothing of the round lands before commit()."""
        r.transaction.enter_context(self.store.round(r.step))

    def design_environments(self, r: RoundState) -> Drafts:
        """1. The designer writes ``envs_per_round`` programs for the active skills."""
        return self.design.design(r.step, r.streams, phase=self._phase)

    def validate(self, r: RoundState, drafts: Drafts) -> Drafts:
        """2. Each program is checked in the sandbox (and repaired, judged, if configured)."""
        return self.design.validate(drafts, r.streams, phase=self._phase)

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

    def reward(self, r: RoundState, plays: list[Trajectory]) -> DueRewards:
        """5. Rewards: each play's return (already in ``plays``); the designer samples due this
        round get the configured designer signal (regret + plateau by default)."""
        r.metrics.update(self._mix)
        return designer_rewards(self.store, self.memory, self.ema, self.config, r.step,
                                r.metrics)

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

    def update(self, r: RoundState, samples: list[Sample]) -> None:
        """7. One GRPO step of the one policy on both roles' samples."""
        t = time.perf_counter()
        with self._phase(f"round {r.step}: update ({r.n_agent} agent + "
                         f"{len(samples) - r.n_agent} designer samples)"):
            stats = self.trainer.train_step(samples) if samples else {}
        r.timings["update"] = time.perf_counter() - t
        self.update_metrics(r, stats)
        self.pipeline.trained_now(samples, stats)

    def update_metrics(self, r: RoundState, stats: dict[str, Any]) -> None:
        r.metrics.update({f"train/{k}": v for k, v in stats.items()
                          if isinstance(v, (int, float))})

    def sync_generation(self, what: str, r: RoundState | None = None) -> None:
        """Push the trained weights into the generation engine (``config.generation_model``),
        at the start, after a resume (``what``) and after each update (``r``)."""
        if not self.config.generation_model:
            return
        from spadekit.policy.openai_wire import EngineLost
        from spadekit.policy.weight_sync import WeightSyncError, push_weights

        t = time.perf_counter()
        try:
            sync = push_weights(self.gen_policy, self.trainer) or {}
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

    def retire(self, r: RoundState) -> None:
        """Environments past their interval retire to memory; the loop state is stored."""
        self._retire(r.step)
        self._save_state()

    def checkpoint_dir(self, r: RoundState) -> str | None:
        """8. Where this round's checkpoint goes (every ``checkpoint_every`` rounds), or None."""
        if (r.step + 1) % self.config.checkpoint_every != 0:
            return None
        r.checkpoint = self.store.checkpoint_dir(r.step, create=True)
        return str(r.checkpoint.resolve())

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

    def evaluate(self, r: RoundState) -> None:
        """The in-loop evaluation suites, every ``eval.every`` rounds."""
        cfg = self.config
        if not (cfg.eval.every and (r.step + 1) % cfg.eval.every == 0):
            return
        t = time.perf_counter()
        with self._phase(f"round {r.step}: evaluate ({', '.join(cfg.eval.suites)})"):
            r.metrics.update(self._evaluate(r.step))
        r.timings["eval"] = time.perf_counter() - t

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
        base = getattr(self, "_base_config", None) or self.config
        self._base_config = base
        if not base.schedule:
            return {}
        self.config = scheduled_config(base, step)
        if self.design is not None:
            self.design.config = self.config
        values = schedule_values(self.config)
        if values == getattr(self, "_schedule_last", None):
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

    def _retire(self, step: int) -> None:
        cfg = self.config
        for row in self.store.environments(status="pooled"):
            sha = row["sha256"]
            update_ema(self.store, self.ema, cfg, sha, step)  # this round's win rate
            born = self._bootstrap_created.get(sha, row.get("created_step") or 0)
            bootstrap = (row.get("lineage") or {}).get("bootstrap")
            if bootstrap or step - born + 1 >= cfg.regen_interval:
                self.store.set_status(sha, "retired", step)
                if sha in self.memory:
                    self.memory.refresh_from_store(sha, step=step)

    def _save_state(self) -> None:
        self.store.put_state("loop", {
            "corpus": self.corpus.state() if self.corpus is not None else None,
            "ema": {sha: t.state_dict() for sha, t in self.ema.items()},
            "curriculum": (self.curriculum.state_dict() if self.curriculum is not None
                           else None)})
