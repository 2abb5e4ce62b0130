"""The SPADE self-play loop: design, validate, hint, play, reward, update, checkpoint, resume.

One round (``step``), all of it inside one database transaction (``RunStore.round``):

1. at each regeneration (every ``regen_interval`` rounds) the designer writes
   ``envs_per_round`` environments for the active skills (``spadekit.design``);
2. bootstrap environments (reference library) join the pool while the designer is weak;
3. the agent plays every pooled environment ``plays_per_env`` times without the hint
   (``ceil(agent_samples_per_round / pooled environments)``, 8 at the paper's 192 / 24, or a
   fixed ``num_generations``), and each new designer environment ``hint_generations`` times with
   the hint (16 in the paper); regret compares those hinted plays with the same round's no-hint
   plays (matched timing, SPEC point 5); every play is capped at ``config.turn_cap``; then
   ``spadekit.watch`` retires programs that hung, slowed down or were gamed in play or in its
   garbage spot checks (designer -0.5), and their plays are not trained on;
4. agent samples: GRPO z-scores within each environment's no-hint plays of this round;
   designer samples due now (generated ``regen_interval`` rounds ago): the configured designer
   signal (default 0.4 * regret_norm + 0.6 * plateau(lifetime win rate)), centred per skill,
   weighted by ``min(n_agent / n_designer * regen_interval, cap)``, importance-corrected (TIS);
5. one GRPO update of the one policy; environments past their interval retire to memory;
6. checkpoint (weights, optimizer, RNG) then commit; ``resume`` continues from the last commit.

A process killed at any moment loses at most the round in flight: the checkpoint is written
before the round commits, and the round's pointer to it is part of the commit.

Several processes (one per GPU, DDP or FSDP): ``torchrun --nproc_per_node 8 -m spadekit selfplay
...``; rank 0 owns the run directory and the environment side, every rank trains its shard
(``spadekit.loop_dist`` says exactly what each rank does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from pathlib import Path
from typing import Any, Callable

from spadekit.advantages import Sample
from spadekit.config import SelfPlayConfig, build, save_config, schedule_values, scheduled_config
from spadekit.design import DesignPhase, active_skills
from spadekit.envs.program import EnvProgram
from spadekit.errors import ConfigError, SpadekitError
from spadekit.memory import EnvironmentMemory, SeedlessMemory
from spadekit.rewards import EmaTracker
from spadekit.rollout import EpisodeSpec, RolloutEngine, Trajectory
from spadekit.sandbox.pool import SandboxPool
from spadekit.store import RunStore
from spadekit.policy.loading import quiet_transformers
from spadekit.round_samples import agent_samples, designer_samples, update_ema
from spadekit.loop_dist import PeerFailed, control_group, generation_context, join_launch, meet
from spadekit.watch import PoolWatch
from spadekit.validate import Validator, ValidatorSettings

__all__ = ["PeerFailed", "ResumeError", "SelfPlay"]


class ResumeError(SpadekitError):
    """A run directory cannot be continued (its checkpoint is missing or unreadable)."""

    reason = "resume"


class SelfPlay:
    """A self-play run in ``run_dir`` (created, or resumed when it already holds rounds)."""

    def __init__(self, config: SelfPlayConfig, run_dir: str | Path, *, policy: Any = None,
                 designer_policy: Any = None, resume: bool = False, console: Any = None):
        self.run_dir = Path(run_dir)
        self.store = self.pool = self.tb = self.curriculum = None  # for close() on any failure
        # under a launcher: join the process group (same decision on every rank: same config)
        self.dist = join_launch(config)
        self._control = control_group(self.dist)
        self.is_main = main = self.dist.is_main
        self.console = console if main else None
        try:
            self._setup(config, policy, designer_policy, resume, main)
        except BaseException:
            self.close()
            raise

    def _setup(self, config: SelfPlayConfig, policy: Any, designer_policy: Any, resume: bool,
               main: bool) -> None:
        def open_run():  # rank 0: the run directory, and the config every rank uses
            if resume:
                self.store = RunStore.open(self.run_dir)
                return self._stored_config(config), str(self.run_dir)
            if (self.run_dir / "run.sqlite").exists():
                raise ConfigError(f"{self.run_dir} already holds a run; use --resume to "
                                  "continue it, or choose another --run-dir")
            return config, str(self.run_dir)

        config, run_dir = self._together(open_run if main else None, "open the run")
        self.config, self.run_dir = config, Path(run_dir)

        def load_model():  # every rank
            nonlocal policy
            quiet_transformers()  # the run shows its own progress
            if policy is None:
                from spadekit.policy.registry import load_policy

                policy = load_policy(config.model, seed=config.seed)
            if "train" not in getattr(policy, "capabilities", ()):
                raise ConfigError(
                    f"self-play updates the policy in this process, but {config.model!r} "
                    f"({getattr(policy, 'name', type(policy).__name__)}) cannot be trained "
                    "here (no 'train' capability): use a transformers model (hf:PATH, "
                    "smollm2-135m, tiny); servers and vLLM serve generation only")
            if main:
                from spadekit.curriculum import build_curriculum

                self.curriculum = build_curriculum(config)  # a bad source fails before any file
                if config.generation_model:
                    from spadekit.policy.weight_sync import generation_policy

                    self.gen_policy = generation_policy(config.generation_model, policy,
                                                        seed=config.seed)

        self._together(load_model, "load the model", share=False)

        def create_run():  # the run directory appears only once the model is known to work
            self.store = RunStore(self.run_dir, create=True)
            save_config(config, self.run_dir / "config.yaml")

        if not resume:
            self._together(create_run if main else None, "create the run directory")
        self.policy = policy
        self.gen_policy = getattr(self, "gen_policy", None)
        self.designer_policy = designer_policy or self.gen_policy or policy
        self.rng = random.Random(config.seed)
        self.ema: dict[str, EmaTracker] = {}
        self._bootstrap_created: dict[str, int] = {}
        self._broken: str | None = None
        self._eval_cache: dict[str, Any] = {}
        self.validator = self.engine = self.memory = self.corpus = self.design = None

        def make_trainer():  # every rank (wrapping the model for DDP/FSDP is collective)
            from spadekit.train.trainer import PolicyTrainer

            train = dataclasses.replace(config.train, temperature=config.rollout.temperature,
                                        seed=config.seed)
            if config.generation_model and "agent" not in train.importance_sampling_roles:
                # another engine sampled the agent's tokens: correct them like delayed samples
                train = dataclasses.replace(train, importance_sampling_roles=(
                    *train.importance_sampling_roles, "agent"))
            self.trainer = PolicyTrainer(policy, train)
            if self.trainer.dist.world_size != self.dist.world_size:
                raise ConfigError(
                    f"launched as {self.dist.world_size} processes but the trainer runs in "
                    f"{self.trainer.dist.world_size} (train.distributed_strategy="
                    f"{config.train.distributed_strategy!r}): use auto, ddp or fsdp")

        self._together(make_trainer, "build the trainer", share=False)

        def environment_side():  # rank 0: sandboxes, memory, corpus, designer; where to resume
            self.pool = SandboxPool(config.sandbox, warm=min(4, config.envs_per_round + 1))
            from spadekit.integrations.ray_envs import RayValidator, make_env_backend

            d, settings = config.distributed, ValidatorSettings(max_turns=config.turn_cap)
            self.env_backend = make_env_backend(d.env_backend, config.sandbox, pool=self.pool,
                                                num_workers=d.env_workers, address=d.ray_address)
            self.validator = (RayValidator(self.env_backend, settings) if d.env_backend == "ray"
                              else Validator(self.pool, settings))
            # one turn cap for the designer's prompt, the validator and play (defect 2)
            self.engine = RolloutEngine(
                self.gen_policy or policy, self.env_backend, dataclasses.replace(
                    config.rollout, max_turns=config.turn_cap),
                chat_template_kwargs=config.chat_template.for_role("agent"))
            self.memory = EnvironmentMemory(self.store, cap=config.memory_size,
                                            duplicate_threshold=config.dedup_threshold)
            from spadekit.corpus import load_corpus

            # ablation switches (config.grounding / config.use_memory): no document, no seeds
            self.corpus = (load_corpus(config.corpus, seed=config.seed) if config.grounding
                           else None)
            self.design = DesignPhase(config, self.designer_policy, self.pool, self.validator,
                                      self.store, self.memory if config.use_memory
                                      else SeedlessMemory(self.memory), self.corpus)
            self.watch = PoolWatch(config.watch, self.store, self.memory, self.env_backend,
                                   config.turn_cap, config.setting == "tooluse")
            self.tb = _tensorboard(self.run_dir) if config.tensorboard else None
            last = self.store.latest_complete_step()
            if last is None:
                fresh = not resume and len(self.memory) == 0
                if fresh and config.memory_seed_library:
                    self.memory.seed_from_library()
                if fresh and config.memory_seed:
                    self.memory.seed_from_source(config.memory_seed, config.setting)
                return None, None
            pointer = self.store.latest_checkpoint()
            return last, None if pointer is None else {"step": pointer["step"],
                                                       "path": str(pointer["path"])}

        last, pointer = self._together(environment_side if main else None,
                                       "start the environment side")
        if last is None:
            self.next_step = 0
            self._sync_generation("start")
            return

        def restore():  # every rank loads the checkpoint; rank 0 also the loop state
            self._load_checkpoint(pointer)
            if main:
                self._restore_loop_state()

        self._together(restore, f"resume from round {last}", share=False)
        self.next_step = last + 1
        self._sync_generation("resume")

    # -- lifecycle -------------------------------------------------------------------------

    def _stored_config(self, given: SelfPlayConfig) -> SelfPlayConfig:
        import yaml

        data = yaml.safe_load((self.run_dir / "config.yaml").read_text())
        stored = build(SelfPlayConfig, data)
        return dataclasses.replace(stored, rounds=given.rounds)

    def _restore(self, step: int) -> None:
        """One process: load the last checkpoint and the loop state (also used by
        ``spadekit.integrations.slime``)."""
        pointer = self.store.latest_checkpoint()
        self._load_checkpoint(pointer)
        self._restore_loop_state()

    def _load_checkpoint(self, pointer: dict[str, Any] | None) -> None:
        if pointer is None:
            return
        try:
            self.trainer.load(pointer["path"])
        except Exception as exc:  # whatever the file problem, the run cannot go on from it
            raise ResumeError(f"cannot resume {self.run_dir}: the checkpoint of round "
                              f"{pointer['step']} ({pointer['path']}) does not load: {exc}",
                              step=pointer["step"]) from exc

    def _restore_loop_state(self) -> None:
        state = self.store.get_state("loop", {})
        if "rng" in state:
            self.rng.setstate(_tuplify(state["rng"]))
        if "corpus" in state and self.corpus is not None:
            self.corpus.set_state(state["corpus"])
        if self.curriculum is not None and state.get("curriculum") is not None:
            self.curriculum.load_state_dict(state["curriculum"])
        for sha, tracker in state.get("ema", {}).items():
            self.ema[sha] = EmaTracker()
            self.ema[sha].load_state_dict(tracker)

    def _together(self, work: Callable[[], Any] | None, what: str, *,
                  share: bool = True) -> Any:
        """A meeting point of the ranks (``spadekit.loop_dist.meet``)."""
        return meet(getattr(self, "dist", None), getattr(self, "_control", None), work, what,
                    share=share)

    def _generation(self):
        """Generation with the full weights (``spadekit.loop_dist.generation_context``)."""
        return generation_context(self.trainer)

    def close(self) -> None:
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
        """One round; with several processes every rank runs it (see the module docstring):
        the work is cut at meeting points (``_together``) that every rank reaches in order."""
        main = getattr(self, "is_main", True)
        timings: dict[str, float] = {}
        metrics: dict[str, Any] = {"step": step}
        metrics.update(self._apply_schedule(step))  # config.schedule: this round's config
        cfg = self.config
        t_round = time.perf_counter()
        ckpt: Path | None = None
        with contextlib.ExitStack() as tx:  # rank 0: the round's transaction
            def environment_side():  # rank 0: design, play, rewards, advantages
                tx.enter_context(self.store.round(step))
                agent, designer = self.produce_samples(step, timings, metrics)
                return agent + designer, len(agent)

            with self._generation():  # FSDP: every rank gathers the full weights
                samples, n_agent = self._together(environment_side if main else None,
                                                  f"play round {step}")
            t = time.perf_counter()
            with self._phase(f"round {step}: update ({n_agent} agent + "
                             f"{len(samples) - n_agent} designer samples)"):
                stats = self._together(
                    lambda: self.trainer.train_step(samples) if samples else {},
                    f"update round {step}", share=False)
            timings["update"] = time.perf_counter() - t
            if cfg.generation_model:
                t = time.perf_counter()
                sync = self._sync_generation(f"round {step}")
                metrics.update({f"weight_sync/{k}": v for k, v in (sync or {}).items()
                                if isinstance(v, (int, float))})
                timings["weight_sync"] = time.perf_counter() - t

            def bookkeeping():  # rank 0: retire, loop state, where the checkpoint goes
                nonlocal ckpt
                metrics.update({f"train/{k}": v for k, v in stats.items()
                                if isinstance(v, (int, float))})
                self._retire(step)
                self._save_state()
                if (step + 1) % cfg.checkpoint_every == 0:
                    ckpt = self.store.checkpoint_dir(step, create=True)
                    return str(ckpt.resolve())
                return None

            target = self._together(bookkeeping if main else None, f"finish round {step}")
            if target is not None:
                with self._phase(f"round {step}: checkpoint"):  # every rank saves, rank 0 writes
                    self._together(lambda: self.trainer.save(ckpt if main else target),
                                   f"checkpoint round {step}", share=False)
            if cfg.eval.every and (step + 1) % cfg.eval.every == 0:
                t = time.perf_counter()
                with self._generation(), \
                        self._phase(f"round {step}: evaluate ({', '.join(cfg.eval.suites)})"):
                    self._together((lambda: metrics.update(self._evaluate(step))) if main
                                   else None, f"evaluate round {step}", share=False)
                timings["eval"] = time.perf_counter() - t

            def commit():  # rank 0: the pointer, the metrics, then the commit
                if ckpt is not None:
                    self.store.record_checkpoint(step, ckpt)
                metrics["world_size"] = self.trainer.dist.world_size
                metrics["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
                metrics["seconds"] = round(time.perf_counter() - t_round, 3)
                self.store.log_metrics(step, {k: v for k, v in metrics.items()
                                              if isinstance(v, (int, float)) and k != "step"})
                self.store.append_event({"kind": "round", **metrics})
                tx.close()  # commit the round
                if self.tb is not None:  # after the commit, like events.jsonl
                    for key, value in metrics.items():
                        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                                and key != "step":
                            self.tb.add_scalar(key, value, step)
                    self.tb.flush()
                return metrics

            return self._together(commit if main else None, f"commit round {step}")

    def produce_samples(self, step: int, timings: dict[str, float],
                        metrics: dict[str, Any]) -> tuple[list[Sample], list[Sample]]:
        """Round ``step``'s environment side, inside its open transaction: design (or the
        baseline curriculum), play, rewards and advantages; returns the agent and designer
        samples (an external trainer such as slime's calls this too)."""
        if self.curriculum is not None:
            t = time.perf_counter()
            with self._phase(f"round {step}: play ({self.curriculum.name} curriculum)"):
                trajs = self._play_curriculum(step)
            timings["play"] = time.perf_counter() - t
            metrics.update(self.curriculum.observe(step, trajs))
        else:
            trajs = self._spade_play(step, timings, metrics)
        metrics.update(self._mix)
        agent = self._agent_samples(trajs, metrics)
        designer = self._designer_samples(step, len(agent), metrics)
        if not self.config.train_designer:  # ablation: rewarded and logged, never trained
            metrics["designer_samples_dropped"] = len(designer)
            designer = []
        return agent, designer

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

    def _sync_generation(self, what: str) -> dict[str, Any] | None:
        """Push the trained weights into the generation engine (rank 0; under FSDP every rank
        gathers the full weights first). Nothing to do without ``generation_model``."""
        if not self.config.generation_model:
            return None
        from spadekit.policy.weight_sync import push_weights

        main = getattr(self, "is_main", True)
        with self._generation():
            return self._together((lambda: push_weights(self.gen_policy, self.trainer))
                                  if main else None, f"push weights ({what})")

    def _spade_play(self, step: int, timings: dict, metrics: dict) -> list[Trajectory]:
        """SPADE's pool: design at each regeneration, bootstrap, then play every pooled env."""
        if step % self.config.regen_interval == 0:
            outcome = self.design.run(step, self.rng, phase=self._phase)
            timings.update(outcome.timings)
            metrics.update(designed=outcome.attempted, valid=outcome.valid,
                           valid_share=outcome.valid_share, pooled=len(outcome.pooled),
                           designer_tokens=outcome.designer_tokens,
                           hints_ok=outcome.hints["ok"], hints_leaked=outcome.hints["leaks"],
                           invalid_reasons=outcome.reasons, repaired=outcome.repaired,
                           repair_calls=outcome.repair_calls,
                           judge_rejected=outcome.judge.get("reject", 0),
                           blacklist_skipped=outcome.blacklisted,
                           **{f"thinking_cut/{role}": n
                              for role, n in outcome.thinking_cut.items()})
        self._bootstrap(step)
        t = time.perf_counter()
        with self._phase(f"round {step}: play"):
            trajs = self._play(step)
        timings["play"] = time.perf_counter() - t
        t = time.perf_counter()  # hangs, slow steps, spot checks: retire, and train on none
        retired, watched = self.watch.after_play(step, trajs, self.rng)
        timings["watch"] = time.perf_counter() - t
        kept = [tr for tr in trajs if tr.spec.tag["env"] not in retired]
        metrics.update(watched, **{"watch/episodes_dropped": len(trajs) - len(kept)})
        return kept

    def _play_curriculum(self, step: int) -> list[Trajectory]:
        """A baseline's round: the curriculum picks the plays; no designer, no hints."""
        cfg = self.config
        specs = self.curriculum.episodes(step, self.rng, cfg.envs_per_round,
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

    def _bootstrap(self, step: int) -> None:
        """Reference environments of the active skills join the pool for this round."""
        cfg = self.config
        if cfg.bootstrap != "library" or cfg.bootstrap_per_round == 0:
            if cfg.bootstrap not in (None, "library"):
                self._bootstrap_pool_dir(step)
            return
        from spadekit.envs import library

        skills = set(active_skills(cfg.setting, cfg.skills_per_epoch,
                                   step // cfg.regen_interval))
        entries = [e for e in library.list_library() if e.setting == cfg.setting]
        chosen = [e for e in entries if e.skill in skills] or entries
        self.rng.shuffle(chosen)
        self._pool_bootstrap([library.program(e) for e in chosen[:cfg.bootstrap_per_round]],
                             step)

    def _bootstrap_pool_dir(self, step: int) -> None:
        from spadekit.generate import load_pool

        programs = load_pool(self.config.bootstrap)
        self.rng.shuffle(programs)
        self._pool_bootstrap(programs[:self.config.bootstrap_per_round], step)

    def _pool_bootstrap(self, programs: list[EnvProgram], step: int) -> None:
        for program in programs:
            if self.store.is_blacklisted(program.sha256):  # retired by the watch: never again
                continue
            if not self.store.has_environment(program.sha256):
                self.store.add_environment(program, step=step, lineage={"bootstrap": True})
            self.store.set_status(program.sha256, "pooled", step)
            self._bootstrap_created[program.sha256] = step

    def _play(self, step: int) -> list[Trajectory]:
        cfg = self.config
        specs = []
        pooled = self.store.environments(status="pooled")
        plays = cfg.plays_per_env(len(pooled))  # agent_samples_per_round / pool, or fixed
        for row in pooled:
            program = self.store.get_program(row["sha256"])
            designed = not (row.get("lineage") or {}).get("bootstrap")
            tag = {"env": row["sha256"], "skill": row.get("skill"), "designed": designed}
            for _ in range(plays):
                specs.append(EpisodeSpec(program, seed=self.rng.randrange(2 ** 31),
                                         tag={**tag, "with_hint": False}))
            hint = program.hint
            if designed and hint and row.get("created_step") == step:
                for _ in range(cfg.hint_generations):
                    specs.append(EpisodeSpec(program, seed=self.rng.randrange(2 ** 31), hint=hint,
                                             tag={**tag, "with_hint": True}))
        designed_envs = {s.tag["env"] for s in specs if s.tag["designed"]}
        self._mix = {"pool_designed": len(designed_envs),
                     "pool_bootstrap": len({s.tag["env"] for s in specs}) - len(designed_envs)}
        trajs = self.engine.run(specs) if specs else []
        for tr in trajs:
            self.store.record_episode(tr, step=step, env_sha=tr.spec.tag["env"],
                                      with_hint=tr.spec.tag["with_hint"], role="agent",
                                      play=True)
        return trajs

    def _agent_samples(self, trajs: list[Trajectory], metrics: dict) -> list[Sample]:
        return agent_samples(trajs, self.config, metrics)

    def _designer_samples(self, step: int, n_agent: int, metrics: dict) -> list[Sample]:
        return designer_samples(self.store, self.memory, self.ema, self.config, step, n_agent,
                                metrics)

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
            "rng": self.rng.getstate(),
            "corpus": self.corpus.state() if self.corpus is not None else None,
            "ema": {sha: t.state_dict() for sha, t in self.ema.items()},
            "curriculum": (self.curriculum.state_dict() if self.curriculum is not None
                           else None)})


def _tensorboard(run_dir: Path):
    """A TensorBoard writer into ``run_dir/tensorboard``, or None without the package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _tuplify(value: Any) -> Any:
    """JSON turned random.getstate()'s tuples into lists; turn them back."""
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value
