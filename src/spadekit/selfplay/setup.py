"""The parts of a self-play run (store, trainer, environment side, pipeline, tracking) and
the one function that builds them, :meth:`RunParts.build`: open or resume the run, load the
model, build the trainer and the environment side, restore the last checkpoint and loop state.

Every part is declared on :class:`RunParts`; each build step declares where it runs under
several processes (``spadekit.selfplay.distributed.placed``). ``spadekit.selfplay.loop.SelfPlay``
holds one ``RunParts``.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.text import Text

from spadekit.common.errors import ConfigError, SpadekitError
from spadekit.policy.loading import quiet_transformers
from spadekit.rollout.engine import RolloutEngine
from spadekit.runs.store import RunStore
from spadekit.runs.tracking import Tracking
from spadekit.sandbox.pool import SandboxPool
from spadekit.sandbox.validate import Validator
from spadekit.selfplay.checkpoints import load_latest_good, set_aside_damaged, sweep_orphans
from spadekit.selfplay.config import SelfPlayConfig, build, save_config, to_dict
from spadekit.selfplay.design import DesignPhase
from spadekit.selfplay.distributed import EVERY, MAIN, SHARED, placed
from spadekit.selfplay.memory import EnvironmentMemory, SeedlessMemory
from spadekit.selfplay.pipeline import Pipeline, check_async_setup
from spadekit.selfplay.rewards import EmaTracker
from spadekit.selfplay.staleness import LedgerError
from spadekit.selfplay.watch import PoolWatch

__all__ = ["ResumeError", "RunParts"]


class ResumeError(SpadekitError):
    """A run directory cannot be continued (its checkpoint is missing or unreadable)."""

    reason = "resume"


@dataclass
class RunParts:
    """Every part of a run, declared here (None until its step builds it; on ranks other than
    0 the rank-0-only parts stay None). :meth:`build` is the one function that builds them."""

    config: SelfPlayConfig
    run_dir: Path
    dist: Any
    control: Any = None
    console: Any = None
    model_spec: str = ""
    warm_dir: Path | None = None
    store: RunStore | None = None
    policy: Any = None
    designer_policy: Any = None
    gen_policy: Any = None
    weight_sync: Any = None
    frozen_designer: Any = None
    curriculum: Any = None
    trainer: Any = None
    pool: SandboxPool | None = None
    env_backend: Any = None
    validator: Any = None
    engine: RolloutEngine | None = None
    memory: EnvironmentMemory | None = None
    corpus: Any = None
    design: DesignPhase | None = None
    watch: PoolWatch | None = None
    pipeline: Pipeline | None = None
    tb: Any = None
    tracking: Tracking | None = None
    roles: dict[str, Any] = field(default_factory=dict)
    ema: dict[str, EmaTracker] = field(default_factory=dict)

    def build(self, policy: Any, designer_policy: Any, resume: bool,
              trainer: Any = None) -> int:
        """Open (or resume) the run: config, model, run directory, trainer (``trainer``: one
        given by an external system that owns the weights, such as slime), environment side,
        then the last checkpoint and loop state. Returns the next round."""
        self.config, run_dir = self.open_run(self.config, resume)
        self.run_dir = Path(run_dir)
        policy = self.load_model(policy) if trainer is None else policy
        self.prepare_generation(policy)
        check_async_setup(self, policy, designer_policy)  # before any file is written
        if not resume:
            self.create_run()  # only once the model is known to work
        self.policy = policy
        self.designer_policy = (designer_policy or self.frozen_designer or self.gen_policy
                                or policy)
        if trainer is None:
            self.build_trainer()
        else:
            self.trainer = trainer
        last, pointer = self.start_environment_side(resume)
        self.pipeline = Pipeline(self.store, self.config.rollout.max_staleness)
        if last is not None:
            loaded = self.load_checkpoint(pointer)
            self.restore_loop_state()
            self.resume_pipeline(last, pointer, loaded)
        return 0 if last is None else last + 1

    def close(self) -> None:
        """Close what was built (tracking first, never raising, then the store)."""
        for part in (self.tracking, self.env_backend, self.pool, self.store, self.tb):
            if part is not None:
                part.close()

    @placed(SHARED)
    def open_run(self, config: SelfPlayConfig, resume: bool) -> tuple[SelfPlayConfig, str]:
        """The run's config (the stored one on resume) and directory."""
        if resume:
            self.store = RunStore.open(self.run_dir)
            return self._stored_config(config), str(self.run_dir)
        if (self.run_dir / "run.sqlite").exists():
            raise ConfigError(f"{self.run_dir} already holds a run; use --resume to "
                              "continue it, or choose another --run-dir")
        if config.stream_key is None:  # the run's secret, recorded in config.yaml
            config = dataclasses.replace(config, stream_key=secrets.token_hex(16))
        return config, str(self.run_dir)

    @placed(EVERY)
    def load_model(self, policy: Any) -> Any:
        """The trained policy (loaded from ``config.model`` unless given); it must train here."""
        config = self.config
        quiet_transformers()  # the run shows its own progress
        self.model_spec = config.model
        if policy is None:
            from spadekit.policy.registry import load_policy
            from spadekit.selfplay.warm_cache import progress_bars, warm_model_dir

            with progress_bars() as progress:
                warm = warm_model_dir(config, progress=progress)
            if warm is not None:  # the warm-started model, built once and cached: the
                # run's base from now on (config.yaml names it, so a resume and `spadekit
                # eval RUN` load this base under the run's adapter)
                self.model_spec, self.warm_dir = f"hf:{warm}", warm.parent
                self.config = config = dataclasses.replace(
                    config, model=self.model_spec, warmstart=dataclasses.replace(
                        config.warmstart, base=config.warmstart.base or config.model))
            policy = load_policy(self.model_spec, seed=config.seed)
        if "train" not in getattr(policy, "capabilities", ()):
            raise ConfigError(
                f"self-play updates the policy in this process, but {config.model!r} "
                f"({getattr(policy, 'name', type(policy).__name__)}) cannot be trained "
                "here (no 'train' capability): use a transformers model (hf:PATH, "
                "smollm2-135m, tiny); servers and vLLM serve generation only")
        return policy

    @placed(MAIN)
    def prepare_generation(self, policy: Any) -> None:
        """The baseline curriculum (a bad source fails before any file is written) and the
        generation engine of ``config.generation_model``."""
        config = self.config
        from spadekit.curriculum import build_curriculum

        self.curriculum = build_curriculum(config)
        from spadekit.selfplay.warm_cache import resolve_generation_model

        if config.generation_model == "auto":  # the fastest engine installed (recorded)
            config = self.config = dataclasses.replace(config, generation_model=(
                resolve_generation_model("auto", self.model_spec or config.model)))
        if config.generation_model:
            from spadekit.train.weight_sync import WeightSync, generation_policy

            self.gen_policy = generation_policy(config.generation_model, policy,
                                                seed=config.seed)
            self.weight_sync = WeightSync(self.gen_policy)
        if config.designer.model:  # a frozen designer (and hint writer) of its own
            from spadekit.policy.registry import load_beside

            self.frozen_designer = load_beside(config.designer.model, policy, seed=config.seed)

    @placed(MAIN)
    def create_run(self) -> None:
        """The run directory: ``run.sqlite`` and the resolved ``config.yaml``."""
        self.store = RunStore(self.run_dir, create=True)
        save_config(self.config, self.run_dir / "config.yaml")

    @placed(EVERY)
    def build_trainer(self) -> None:
        """The GRPO trainer of the policy (wrapping it for DDP/FSDP is collective)."""
        from spadekit.train.trainer import PolicyTrainer

        config = self.config
        train = dataclasses.replace(config.train, temperature=config.rollout.temperature,
                                    seed=config.seed)
        if config.generation_model and "agent" not in train.importance_sampling_roles:
            # another engine sampled the agent's tokens: correct them like delayed samples
            train = dataclasses.replace(train, importance_sampling_roles=(
                *train.importance_sampling_roles, "agent"))
        self.trainer = PolicyTrainer(self.policy, train)
        if self.trainer.dist.world_size != self.dist.world_size:
            raise ConfigError(
                f"launched as {self.dist.world_size} processes but the trainer runs in "
                f"{self.trainer.dist.world_size} (train.distributed_strategy="
                f"{config.train.distributed_strategy!r}): use auto, ddp or fsdp")

    @placed(SHARED)
    def start_environment_side(self, resume: bool
                               ) -> tuple[int | None, dict[str, Any] | None]:
        """Sandboxes, validator, rollout engine, memory, corpus, designer and watch; returns the
        last committed round and its checkpoint pointer (None, None for a new run)."""
        config = self.config
        self.pool = SandboxPool(config.sandbox, warm=min(4, config.envs_per_round + 1))
        from spadekit.rollout.ray_envs import RayValidator, make_env_backend

        d, settings = config.distributed, config.validation.settings(config.turn_cap)
        self.env_backend = make_env_backend(d.env_backend, config.sandbox, pool=self.pool,
                                            num_workers=d.env_workers, address=d.ray_address)
        self.validator = (RayValidator(self.env_backend, settings) if d.env_backend == "ray"
                          else Validator(self.pool, settings))
        # one turn cap for the designer's prompt, the validator and play
        self.engine = RolloutEngine(
            self.gen_policy or self.policy, self.env_backend, dataclasses.replace(
                config.rollout, max_turns=config.turn_cap),
            chat_template_kwargs=config.chat_template.for_role("agent"))
        self.memory = EnvironmentMemory(self.store, cap=config.memory_size,
                                        duplicate_threshold=config.dedup_threshold,
                                        win_rate_input=config.reward.win_rate_input)
        from spadekit.selfplay.corpus_pin import run_corpus

        # ablation switches (config.grounding / config.use_memory): no document, no seeds; the
        # default corpus is pinned in the run directory (corpus_pin), so a resume reads it back
        self.corpus = (run_corpus(config.corpus, self.run_dir, seed=config.seed, resume=resume)
                       if config.grounding else None)
        changed = self.corpus.info.get("corpus_changed") if self.corpus is not None else None
        if changed:  # resumed under a spadekit that ships another default corpus: said, kept
            self.store.append_event({"kind": "corpus_changed",
                                     "step": self.store.latest_complete_step(), **changed})
        self.design = DesignPhase(config, self.designer_policy, self.pool, self.validator,
                                  self.store, self.memory if config.use_memory
                                  else SeedlessMemory(self.memory), self.corpus)
        self.watch = PoolWatch(config.watch, self.store, self.memory, self.env_backend,
                               config.turn_cap, config.setting == "tooluse", pool=self.pool)
        self.tb = _tensorboard(self.run_dir) if config.tensorboard else None
        self.tracking = self._tracking(resume)
        self.roles = self._record_roles()
        last = self.store.latest_complete_step()
        if last is None:
            fresh = not resume and len(self.memory) == 0
            if fresh and config.memory_seed_library:
                self.memory.seed_from_library()
            if fresh and config.memory_seed:
                self.memory.seed_from_source(config.memory_seed, config.setting)
            warm = self.warm_dir
            if fresh and warm is not None and config.warmstart.seed_memory:
                # what the designer learnt from: its references, and what the dedup gate
                # keeps out of the pool (a copy of a warm-start program is a near-duplicate)
                self.memory.seed_from_source(str(warm / "programs"), config.setting)
            return None, None
        sweep_orphans(self.store)  # folders a killed round left (pointers are pruned later)
        pointers = [{"step": p["step"], "path": str(p["path"]), "meta": p["meta"]}
                    for p in self.store.checkpoints()[::-1]]  # newest first
        if not pointers:
            return last, None
        return last, {**pointers[0], "older": pointers[1:], "last_round": last}

    def _tracking(self, resume: bool) -> Tracking | None:
        """The run's experiment trackers (``config.logging``; rank 0 only: this step runs
        there), warning on the run's console; None without any."""
        if not self.config.logging.backends:
            return None
        console = self.console
        warn = (lambda _text: None) if console is None else \
            (lambda text: console.print(Text(text, style="yellow")))
        try:
            return Tracking(self.config.logging, self.store, self.run_dir,
                            to_dict(self.config), resume=resume, warn=warn)
        except Exception as exc:  # noqa: BLE001 - Tracking handles its backends' failures;
            warn(f"warning: experiment tracking is off: {exc}")  # this is a last resort
            return None

    def _record_roles(self) -> dict[str, dict[str, Any]]:
        """Which policy and engine plays each role, in the run database (state ``roles`` and a
        ``roles`` event each time the run is opened)."""
        def describe(policy: Any, trained: bool) -> dict[str, Any]:
            return {"policy": getattr(policy, "name", None) or type(policy).__name__,
                    "engine": type(policy).__name__, "trained": trained}

        frozen = bool(self.config.designer.model)
        roles = {"agent": describe(self.gen_policy or self.policy, True),
                 "designer": describe(self.designer_policy,
                                      not frozen and self.config.train_designer),
                 "hint": describe(self.design.hint_policy, False)}
        if self.gen_policy is not None:
            roles["agent"]["trained_copy"] = describe(self.policy, True)["policy"]
        self.store.put_state("roles", roles)
        self.store.append_event({"kind": "roles", "step": self.store.latest_complete_step(),
                                 **roles})
        return roles

    def _stored_config(self, given: SelfPlayConfig) -> SelfPlayConfig:
        import yaml

        data = yaml.safe_load((self.run_dir / "config.yaml").read_text())
        stored = build(SelfPlayConfig, data)
        # the trackers are not part of the run: ones given now (--log) replace the stored ones
        return dataclasses.replace(stored, rounds=given.rounds, logging=(
            given.logging if given.logging.backends else stored.logging))

    @placed(EVERY)
    def load_checkpoint(self, pointer: dict[str, Any] | None) -> dict[str, Any] | None:
        """The trainer's state (weights, optimizer, RNG) from the checkpoint ``pointer``; when
        it does not load, from the newest older one that does (``pointer["older"]``), after a
        warning naming the rounds whose updates are lost (``checkpoints.load_latest_good``).
        Returns the pointer that loaded (None without one)."""
        if pointer is None:
            return None
        chain = [pointer, *pointer.get("older", [])]
        store, console = self.store, self.console
        try:
            return load_latest_good(
                chain, self.trainer.load, pointer.get("last_round"),
                warn=None if console is None else
                (lambda text: console.print(Text(f"warning: {text}", style="yellow"))),
                record=None if store is None else store.append_event,
                set_aside=None if store is None else
                (lambda damaged: set_aside_damaged(store, damaged)))
        except Exception as exc:  # none loads: the run cannot go on from them
            raise ResumeError(f"cannot resume {self.run_dir}: the checkpoint of round "
                              f"{pointer['step']} ({pointer['path']}) does not load: {exc}"
                              + (f" (nor the {len(chain) - 1} older one(s))"
                                 if len(chain) > 1 else ""),
                              step=pointer["step"]) from exc

    @placed(MAIN)
    def resume_pipeline(self, last: int, pointer: dict[str, Any] | None,
                        loaded: dict[str, Any] | None) -> None:
        """The rollout pipeline's versions and ledger on resume: as the last round committed
        them when its checkpoint loaded; when an older one loaded instead (the newest was
        damaged), as committed with that checkpoint, the lost rounds' queued batches dropped
        (``Pipeline.fall_back``; a ``pipeline_fallback`` event says what went)."""
        pipe = self.pipeline
        if pointer is None or loaded is None or loaded["step"] == pointer["step"]:
            try:
                pipe.load_state(self.store.get_state("pipeline"))
            except LedgerError as exc:
                raise ResumeError(f"cannot resume {self.run_dir}: {exc}", step=last) from exc
            return
        state = (loaded.get("meta") or {}).get("pipeline")
        if state is None and not pipe.max_staleness:
            # a synchronous run's checkpoint from before the versions were kept with it:
            # nothing is queued; the versions only count updates, so they stay as committed
            pipe.load_state(self.store.get_state("pipeline"))
            self.store.append_event({"kind": "pipeline_fallback", "loaded": loaded["step"],
                                     "dropped_steps": [], "versions_rolled_back": False})
            return
        try:
            dropped = pipe.fall_back(state, last)
        except LedgerError as exc:
            raise ResumeError(f"cannot resume {self.run_dir} from the checkpoint of round "
                              f"{loaded['step']}: {exc}", step=loaded["step"]) from exc
        self.store.append_event({"kind": "pipeline_fallback", "loaded": loaded["step"],
                                 "dropped_steps": dropped, "versions_rolled_back": True,
                                 **pipe.state()})

    @placed(MAIN)
    def restore_loop_state(self) -> None:
        """The corpus, curriculum and win-rate trackers, as committed (the random streams are
        functions of the seed and the round, ``spadekit.common.streams``: nothing to restore;
        the single stream a run from before them stored is not read)."""
        state = self.store.get_state("loop", {})
        if "corpus" in state and self.corpus is not None:
            self.corpus.set_state(state["corpus"])
        if self.curriculum is not None and state.get("curriculum") is not None:
            self.curriculum.load_state_dict(state["curriculum"])
        for sha, tracker in state.get("ema", {}).items():
            self.ema[sha] = EmaTracker()
            self.ema[sha].load_state_dict(tracker)


def _tensorboard(run_dir: Path):
    """A TensorBoard writer into ``run_dir/tensorboard``, or None without the package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))
