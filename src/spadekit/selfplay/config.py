"""The self-play configuration: one tree of frozen dataclasses, YAML presets, ``--set`` overrides.

``SelfPlayConfig`` holds every knob of a run; each field declares its type, range and default
once, and pydantic checks them (SPEC.md's values where the paper fixes them; small ones in the
``cpu-tiny`` preset, the default). Presets are the YAML files in ``spadekit/selfplay/presets``;
a config file or ``--set key=value`` overrides any field by dotted path (``--set
train.learning_rate=1e-5``). A bad value is a ``ConfigError`` naming the dotted knob and its
allowed range, raised when the config loads (before any run directory exists). The resolved
config is written to the run directory as ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

import pydantic

from spadekit.common.errors import ConfigError
from spadekit.policy.base import MIN_TEMPERATURE
from spadekit.rollout.engine import RolloutConfig
from spadekit.runs.tracking import LoggingConfig
from spadekit.sandbox.config import SandboxConfig
from spadekit.selfplay.checkpoints import CheckpointConfig
from spadekit.selfplay.rewards import RewardConfig
from spadekit.selfplay.warm_cache import WarmstartConfig
from spadekit.selfplay.watch import WatchConfig
from spadekit.train.config import (Count, NonNegative, Number, PosInt, Positive, Str,
                                   TrainConfig, Unit, config_error, section)

PRESET_DIR = Path(__file__).resolve().parent / "presets"


@section
class DesignerConfig:
    temperature: pydantic.StrictFloat = 0.6
    """Equal to ``rollout.temperature`` (which holds the range): one sampling temperature."""
    top_p: Unit = 1.0
    max_new_tokens: PosInt = 1024
    """Designer output budget (paper: 16384)."""
    hint_mode: Literal["second_call", "designer"] = "second_call"
    """``second_call``: the same policy writes the hint after reading the code (temperature
    ``hint_temperature``); ``designer``: take the hint from the designer's own output."""
    hint_temperature: Number = 0.3
    hint_max_new_tokens: PosInt = 128
    positive_seeds: Count = 2
    max_words: PosInt | None = None
    """Grounding document truncation; None: 6000 words for games, 4000 for tool use."""
    repair_attempts: Count = 0
    """Inference-only repair turns for a program that fails validation (the failure report is
    fed back); the designer still trains on its first attempt only (``spadekit.selfplay.repair``)."""
    judge: Str | pydantic.StrictBool = "auto"
    """The policy as judge after the mechanical checks (rejects fatal bugs only): ``auto`` (on
    for tool use, off for games), ``on`` or ``off`` (YAML's true/false too; ``spadekit.selfplay.judge``)."""
    judge_temperature: Number = 0.3
    judge_max_new_tokens: PosInt = 512
    hint_model: Str | None = None
    """A separate hint writer (a policy spec, e.g. ``openai:NAME@URL``) instead of the policy."""
    model: Str | None = None
    """A frozen designer: a policy spec (``hf:PATH``, ``vllm:...``, ``openai:NAME@URL``, ...)
    that writes the environments (and the hints, unless ``hint_model`` is set) instead of the
    trained policy; its samples are rewarded and logged but never trained
    (``designer_samples_dropped``). None: the trained policy designs (the paper)."""
    prompt_style: Str = "full"
    """``full``: the paper's designer prompt; ``compact``: the contract in a few lines and each
    reference as its class name and rules (for small models, ``spadekit.selfplay.prompts``);
    ``kit`` (games): a game-kit program (``spadekit.envs.gamekit``)."""
    response_prefix: Str = ""
    """Format aid: text that opens the designer's reply (prompt tokens, never trained; the
    extractor reads prefix + reply, ``spadekit.rollout.aids``). Empty: none."""
    grammar: Str | None = None
    """``kit`` (with ``prompt_style: kit``): the reply is decoded within the kit grammar
    (``spadekit.selfplay.kit_grammar``), so every composition it allows loads. None: free text."""

    def __post_init__(self) -> None:
        from spadekit.selfplay.kit_grammar import GRAMMARS
        from spadekit.selfplay.prompts import PROMPT_STYLES

        if self.grammar is not None and self.grammar not in GRAMMARS:
            raise ConfigError(f"designer.grammar: must be one of {GRAMMARS} or null (got "
                              f"{self.grammar!r})")
        if self.grammar == "kit" and (self.prompt_style != "kit" or self.response_prefix):
            raise ConfigError("designer.grammar=kit constrains the whole reply to a kit "
                              "program: it needs designer.prompt_style=kit and no "
                              "designer.response_prefix (or set designer.grammar=null)")
        if self.prompt_style not in PROMPT_STYLES:
            raise ConfigError(f"designer.prompt_style: must be one of {PROMPT_STYLES} (got "
                              f"{self.prompt_style!r})")


def check_grammars(config: Any) -> None:
    """``ConfigError`` for a designer or agent grammar the run cannot hold: a turn cap below 2
    (no kit game fits), a generator that cannot constrain its sampling (an ``openai:``
    engine), repair turns (free text after a grammar), or a thinking chat template (both
    grammars leave no room for ``<think>``)."""
    ruled = [role for role, on in (("designer", config.designer.grammar),
                                   ("agent", config.rollout.action_grammar)) if on]
    if not ruled:
        return
    knobs = " and ".join({"designer": "designer.grammar", "agent": "rollout.action_grammar"}[r]
                         for r in ruled)
    if config.designer.grammar and config.turn_cap < 2:
        raise ConfigError(f"designer.grammar=kit needs a turn cap of at least 2 (a kit game "
                          f"looks or answers, then answers), got {config.turn_cap}")
    engines = [("generation_model", config.generation_model),
               ("designer.model", config.designer.model)]
    for name, spec in engines:
        if isinstance(spec, str) and spec.startswith("openai:"):
            raise ConfigError(f"{knobs} cannot hold with {name}={spec}: an OpenAI-compatible "
                              "server is sent no grammar; use a local engine or set "
                              f"{knobs} off")
    if config.designer.grammar and config.designer.repair_attempts:
        raise ConfigError("designer.repair_attempts > 0 with designer.grammar=kit: a repair "
                          "turn is free text, outside the grammar; set one of them off")
    for role in ruled:
        if config.chat_template.for_role(role).get("enable_thinking"):
            raise ConfigError(f"chat_template enables thinking for the {role}, but {knobs} "
                              "leaves no room for <think>; set one of them off")


CHAT_ROLES = ("agent", "designer", "hint")
"""The roles whose prompts go through the chat template (the judge and repair turns are the
designer's)."""


@section
class ChatTemplateConfig:
    """Keyword options for the tokenizer's chat template (``apply_chat_template(...,
    **options)``; vLLM's and TRL's ``chat_template_kwargs``), e.g. Qwen3's ``{enable_thinking:
    false}``. ``all`` applies to every role; ``agent``, ``designer`` (also the judge and repair
    turns) and ``hint`` add to it or override it key by key."""

    all: dict[Str, Any] = field(default_factory=dict)
    agent: dict[Str, Any] = field(default_factory=dict)
    designer: dict[Str, Any] = field(default_factory=dict)
    hint: dict[Str, Any] = field(default_factory=dict)

    def for_role(self, role: str) -> dict[str, Any]:
        """The options of one role (``all`` overlaid with the role's own)."""
        if role not in CHAT_ROLES:
            raise ConfigError(f"chat_template: unknown role {role!r}; known: "
                              f"{', '.join(CHAT_ROLES)}")
        return {**self.all, **getattr(self, role)}


@section
class ScheduleEntry:
    """From round ``from_round`` on, set the dotted keys of ``set`` (a later-phase change, e.g.
    the paper's 4B plateau band [0.2, 0.4]). Only keys in :data:`SCHEDULABLE` may be set."""

    from_round: Count = 0
    set: dict[Str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.set:
            raise ConfigError("schedule: each entry needs a non-empty 'set' mapping of "
                              "dotted keys to values")


#: Keys a schedule may change by round: every ``reward.*`` field and a few per-round sizes that
#: the loop reads afresh each round. Structural keys (model, setting, regen_interval, memory,
#: rollout/train/sandbox settings baked into objects at start) are refused.
SCHEDULABLE_PREFIXES = ("reward.",)
SCHEDULABLE = ("envs_per_round", "agent_samples_per_round", "num_generations",
               "hint_generations", "bootstrap_per_round", "skills_per_epoch", "train_designer")


@section
class CurriculumConfig:
    """What the agent trains on: SPADE's designer (``spade``) or a baseline with the same
    trainer and budget: ``fixed`` (a static pool) or ``rlve`` (RLVE's adaptive ladder)."""

    kind: Literal["spade", "fixed", "rlve"] = "spade"
    pool: Str = "library"
    """``fixed``: the programs' source: library, a pool directory or a run directory."""
    rlve_envs: list[Str] | None = None
    """``rlve``: environment names of rlve-gym (None: all 400)."""
    rlve_threshold: Unit = 0.9
    rlve_window_factor: PosInt = 8
    """Raise an environment's difficulty bound after this many x num_generations plays at it."""
    rlve_levels: PosInt = 4
    """Difficulties sampled from the last this-many levels up to the bound."""


@section
class EvalLoopConfig:
    """Evaluation inside the run: ``suites`` every ``every`` rounds, logged with the metrics
    (``eval/<suite>/win_rate`` ...) and written in full to ``run_dir/evals/step-N.json``."""

    suites: list[Str] = field(default_factory=list)
    every: Count = 0
    """Rounds between evaluations; 0 turns in-loop evaluation off."""
    limit: PosInt | None = 2
    """Items per dataset (keep it small: the run waits for it)."""
    k: PosInt | None = 1
    max_new_tokens: PosInt | None = 256
    max_turns: PosInt | None = None
    temperature: Number | None = None
    seed: pydantic.StrictInt = 0

    def __post_init__(self) -> None:
        if self.every and not self.suites:
            raise ConfigError("eval.every is set but eval.suites is empty")


@section
class DistributedConfig:
    """Where environments run: ``local`` (this machine's sandbox pool) or ``ray`` (sandbox
    workers as Ray actors on any node, each applying its own isolation tier)."""

    env_backend: Literal["local", "ray"] = "local"
    ray_address: Str | None = None
    """None: a local Ray; ``auto`` (a running cluster) or ``ray://host:10001``."""
    env_workers: PosInt = 2
    """Ray actors, each with its own warm sandbox pool."""


@section
class ValidationConfig:
    """How designed programs are checked before they enter the pool
    (``spadekit.sandbox.validate.ValidatorSettings``; the turn cap comes from ``turn_cap``)."""

    require_solution: pydantic.StrictBool = True
    """Refuse programs without a replayable ``solution()`` (reason ``no_solution``)."""
    solution_drawn_seeds: Count = 3
    """Drawn seeds on which the solution must win too, besides the fixed 0, 1, 2 (the
    garbage and random-policy baselines are measured on these)."""
    action_margin: Unit = 0.5
    """The solution's mean return must beat garbage's by this much."""
    random_margin: Unit = 0.25
    """... and a random policy's (plausible moves, which earn partial credit in honest games)
    by this much, and so must a blind reply (an action the program prints, replied every turn,
    or another seed's solution)."""
    blind_episodes: Count = 16
    """Drawn seeds on which the blind replies are played (each printed action every turn,
    each solved seed's solution on other seeds): the blind-reply baseline, part of the chance
    return ``reward.above_chance`` reads."""
    lockstep_instances: PosInt = 8
    """At least this many instances are played interleaved in one worker (a training group)."""
    turn_budget_s: Positive = 2.0
    """A worker's total seconds for one lockstep turn above this is slow (reason ``slow``)."""

    def settings(self, max_turns: int) -> Any:
        """The ``ValidatorSettings`` these fields and the turn cap give."""
        from spadekit.sandbox.validate import ValidatorSettings

        return ValidatorSettings(max_turns=max_turns, require_solution=self.require_solution,
                                 solution_drawn_seeds=self.solution_drawn_seeds,
                                 action_margin=self.action_margin,
                                 random_margin=self.random_margin,
                                 blind_episodes=self.blind_episodes,
                                 lockstep_instances=self.lockstep_instances,
                                 turn_budget_s=self.turn_budget_s)


@section
class SelfPlayConfig:
    setting: Literal["games", "tooluse"] = "games"
    """``games`` (reasoning puzzles) or ``tooluse`` (multi-turn API calling)."""
    model: Str = "smollm2-135m"
    generation_model: Str | None = None
    """A separate generation engine whose weights follow the trainer after every update:
    ``vllm:PATH`` (in-process), ``openai:NAME@URL`` (a server that takes weight pushes),
    ``hf:PATH``/``tiny`` (a copy in this process), ``auto`` (in-process vLLM when installed,
    else none). Its samples are importance-corrected. None: the trained model generates."""
    rounds: PosInt = 2
    envs_per_round: PosInt = 4
    """Environments the designer writes at each regeneration (paper: 24)."""
    agent_samples_per_round: PosInt | None = None
    """The agent's no-hint budget per round, as the paper states it (192): every pooled
    environment is played ``ceil(agent_samples_per_round / environments in the pool)`` times
    (8 at 192 / 24). Exactly one of this and ``num_generations`` is set (the other null)."""
    num_generations: PosInt | None = 4
    """TRL's name: a fixed count of no-hint plays of every pooled environment per round
    (``plays_per_env``); null when ``agent_samples_per_round`` is set."""
    hint_generations: Count = 4
    """Hinted plays of each new designer environment at its generation step, for regret (paper:
    16). Regret compares them with the same round's no-hint plays (``plays_per_env`` of them)."""
    regen_interval: PosInt = 4
    """Rounds an environment stays in the pool; also the designer update delay k."""
    skills_per_epoch: PosInt = 3
    env_max_turns: PosInt = 12
    """The episode cap (SPEC: 12; paper 25). ``turn_cap = min(env_max_turns,
    rollout.max_turns)`` is the one cap of the designer's contract, the validator and play."""
    bootstrap: Str | None = "library"
    """Environments the agent plays while the designer is still weak: ``library`` (the
    reference environments of the active skills), a pool directory, or None."""
    bootstrap_per_round: Count = 2
    corpus: Str | None = None
    """Grounding corpus: None for the offline default, or a path (JSONL, Parquet, folder)."""
    memory_seed_library: pydantic.StrictBool = True
    """Start the environment memory with the reference library (designer seeds from round 0)."""
    memory_seed: Str | None = None
    """An environment source (a pool, program or run directory) whose programs also start the
    memory (lineage in a ``memory_seeded`` event); None: none."""
    memory_size: PosInt = 200
    dedup_threshold: NonNegative = 0.9
    """A program this similar to one in memory is a duplicate (above 1: none is)."""
    grounding: pydantic.StrictBool = True
    """Ablation switch: False gives the designer no grounding document (no corpus is loaded)."""
    use_memory: pydantic.StrictBool = True
    """Ablation switch: False shows the designer no memory seeds (positive or negative); the
    memory still records environments and still rejects near duplicates."""
    train_designer: pydantic.StrictBool = True
    """Ablation switch: False drops the designer's samples before the update (no designer-role
    gradient); they are still rewarded and logged (``designer_samples_dropped``)."""
    schedule: list[ScheduleEntry] = field(default_factory=list)
    """Per-round changes: the config of round N is this one plus every entry with
    ``from_round <= N``, applied in order (see :func:`scheduled_config`)."""
    seed: pydantic.StrictInt = 0
    stream_key: Str | None = None
    """The run's secret key for its random streams (``spadekit.common.streams``), so a program
    cannot compute the seeds it will be played on. None: 32 random hex digits drawn at creation
    and stored in ``config.yaml`` (a resume repeats its draws); set it for two runs to match."""
    checkpoint_every: PosInt = 1
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Which checkpoints stay on disk (``keep_last``, ``keep_every``;
    ``spadekit.selfplay.checkpoints``)."""
    tensorboard: pydantic.StrictBool = True
    """Also write each round's metrics to ``run_dir/tensorboard`` (needs ``tensorboard``)."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Experiment trackers (W&B, trackio) each round also goes to (``spadekit.runs.tracking``,
    ``docs/tracking.md``); none by default."""
    designer: DesignerConfig = field(default_factory=DesignerConfig)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(
        max_turns=12, max_new_tokens=256, temperature=0.6, max_context_tokens=4096))
    reward: RewardConfig = field(default_factory=RewardConfig)
    chat_template: ChatTemplateConfig = field(default_factory=ChatTemplateConfig)
    """Chat-template options per role (``enable_thinking`` ...)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The GRPO update (TRL's knob names); its ``temperature`` is set from the rollout's."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    eval: EvalLoopConfig = field(default_factory=EvalLoopConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    """Pooled programs watched during training; a program that hangs, slows down, is won by
    garbage or turns nondeterministic is retired (``spadekit.selfplay.watch``)."""
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    """A warm start of ``model`` before self-play, built once and cached
    (``spadekit.selfplay.warm_cache``); off unless ``warmstart.pool`` is set."""

    @property
    def turn_cap(self) -> int:
        """The one episode cap of the designer prompt, the validator and play:
        ``min(env_max_turns, rollout.max_turns)``."""
        return min(self.env_max_turns, self.rollout.max_turns)

    def __post_init__(self) -> None:
        if (self.num_generations is None) == (self.agent_samples_per_round is None):
            raise ConfigError(
                "set exactly one of agent_samples_per_round (the paper's budget: plays per "
                "environment = ceil(samples / pooled environments)) and num_generations (a fixed "
                "count per environment); set the other to null, e.g. --set num_generations=null")
        games_only = [f"{key}={value}" for key, value in (
            ("warmstart.pool", self.warmstart.pool), ("designer.prompt_style",
                                                      self.designer.prompt_style))
            if value in ("procedural", "kit")]
        if games_only and self.setting != "games":
            raise ConfigError(
                f"{' and '.join(games_only)} {'is' if len(games_only) == 1 else 'are'} for "
                f"games (the procedural pool, the game kit); for setting={self.setting} also set "
                + " ".join(f"--set {k}" for k in (
                    "warmstart.pool=null" if "warmstart.pool=procedural" in games_only else "",
                    "designer.prompt_style=compact"
                    if "designer.prompt_style=kit" in games_only else "") if k)
                + " (or use --preset tooluse-4b)")
        check_grammars(self)
        if not (math.isfinite(self.rollout.temperature)
                and self.rollout.temperature >= MIN_TEMPERATURE):
            raise ConfigError(f"rollout.temperature must be >= {MIN_TEMPERATURE:g}, got "
                              f"{self.rollout.temperature!r}: GRPO learns from differences "
                              "between sampled answers (greedy ones are all alike), and the "
                              "trainer divides logits by it")
        if self.designer.temperature != self.rollout.temperature:
            raise ConfigError("designer.temperature and rollout.temperature must be equal: the "
                              "trainer scores both roles' samples with one temperature, and "
                              "importance ratios need the sampling temperature")
        # the loop gives the trainer rollout.temperature and the top-level seed: a different
        # train.temperature / train.seed would be silently replaced, so it is refused
        base = TrainConfig()
        for knob, owner, value in (("temperature", "rollout.temperature",
                                    self.rollout.temperature), ("seed", "seed", self.seed)):
            if getattr(self.train, knob) not in (getattr(base, knob), value):
                raise ConfigError(
                    f"train.{knob}={getattr(self.train, knob)!r} would be replaced: self-play "
                    f"trains with {owner} ({value!r}); set {owner} instead, or leave "
                    f"train.{knob} unset")
        if self.rollout.max_staleness:
            check_async(self)
        if self.schedule:
            check_schedule(self)

    def plays_per_env(self, pooled: int) -> int:
        """No-hint plays of each environment in a round whose pool holds ``pooled``
        environments: ``num_generations``, or ``ceil(agent_samples_per_round / pooled)``."""
        if self.num_generations is not None:
            return self.num_generations
        assert self.agent_samples_per_round is not None
        return -(-self.agent_samples_per_round // max(1, pooled))


def check_async(config: "SelfPlayConfig") -> None:
    """What ``rollout.max_staleness >= 1`` needs (``spadekit.selfplay.pipeline``); ConfigError."""
    max_staleness = config.rollout.max_staleness
    if not config.generation_model:
        raise ConfigError(
            f"rollout.max_staleness={max_staleness} generates while the trainer updates, so "
            "generation needs an engine of its own: set generation_model (auto: vLLM when "
            "installed; vllm:PATH, hf:PATH or an openai: server), or rollout.max_staleness=0")
    if config.checkpoint_every != 1:
        raise ConfigError(
            f"rollout.max_staleness={max_staleness} needs checkpoint_every=1: a resume must "
            "load the weights the queued samples' policy versions were counted against (with "
            f"checkpoint_every={config.checkpoint_every} the queue would outlive its weights)")


# ---------------------------------------------------------------------------------------------
# per-round schedule


def _schedule_nested(entry: ScheduleEntry) -> dict[str, Any]:
    for key in entry.set:
        if not (key in SCHEDULABLE or (key.startswith(SCHEDULABLE_PREFIXES)
                                       and key.count(".") == 1)):
            raise ConfigError(
                f"schedule (from_round {entry.from_round}): {key!r} cannot be scheduled; "
                f"allowed: reward.<field>, {', '.join(SCHEDULABLE)}")
    return nested(entry.set.items())


def check_schedule(config: "SelfPlayConfig") -> None:
    """Validate every entry (keys allowed and existing, values typed) by building the config
    each entry leads to; raises ConfigError."""
    _apply_schedule(config, max(e.from_round for e in config.schedule))


def _apply_schedule(config: "SelfPlayConfig", round_: int) -> "SelfPlayConfig":
    effective = dataclasses.replace(config, schedule=[])
    for entry in config.schedule:
        if entry.from_round <= round_:
            try:
                effective = build(SelfPlayConfig, _schedule_nested(entry), base=effective)
            except ConfigError as exc:
                raise ConfigError(f"schedule (from_round {entry.from_round}): {exc}") from None
    return effective


def scheduled_config(config: "SelfPlayConfig", round_: int) -> "SelfPlayConfig":
    """The effective config of round ``round_``: ``config`` plus every schedule entry with
    ``from_round <= round_``, in order. Deterministic in the round number (resume-safe)."""
    if not config.schedule:
        return config
    return dataclasses.replace(_apply_schedule(config, round_), schedule=config.schedule)


def schedule_values(config: "SelfPlayConfig") -> dict[str, Any]:
    """The current values of every key the schedule touches (for logging)."""
    out: dict[str, Any] = {}
    for entry in config.schedule:
        for key in entry.set:
            value: Any = config
            for part in key.split("."):
                value = getattr(value, part)
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# loading, overriding, saving


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(preset: str | None = "cpu-tiny", path: str | Path | None = None,
                overrides: list[str] | None = None) -> SelfPlayConfig:
    """Preset, then file, then ``key=value`` overrides, each on top of the previous."""
    data: dict[str, Any] = {}
    if preset:
        data = _merge(data, _preset_data(preset))
    if path:
        try:
            loaded = read_yaml(Path(path).read_text())
        except (OSError, ConfigError) as exc:
            raise ConfigError(f"cannot read config {path}: {getattr(exc, 'message', exc)}") \
                from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping")
        # a --config file layers its own keys on the chosen preset: its ``extends:`` is ignored
        # (so an ablation preset file applies to any base: --preset games-4b --config FILE)
        data = _merge(data, {k: v for k, v in loaded.items() if k != "extends"})
    pairs = []
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        pairs.append((key.strip(), read_yaml(value)))
    return build(SelfPlayConfig, _merge(data, nested(pairs)))


class _Loader(__import__("yaml").SafeLoader):
    """YAML with ``1e-5``, ``nan`` and ``inf`` read as numbers (YAML 1.1 wants ``1.0e-5``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+"
               r"|(?i:nan|inf|infinity))$"),
    list("-+0123456789.nNiI"))


def read_yaml(text: str) -> Any:
    """Parse YAML text (a preset, a config file or one ``--set`` value); ConfigError if bad."""
    import yaml

    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, RecursionError) as exc:  # RecursionError: too deep
        raise ConfigError(f"cannot read YAML: {exc}") from None


def nested(pairs: Any) -> dict[str, Any]:
    """``{"a.b": v}`` pairs as nested mappings ``{"a": {"b": v}}``."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        cursor = out
        parts = key.split(".")
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
            if not isinstance(cursor, dict):
                raise ConfigError(f"{key}: {part} is not a section")
        cursor[parts[-1]] = value
    return out


def _preset_data(preset: str, chain: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's settings; ``extends: NAME`` loads preset NAME underneath (cycles refused)."""
    if preset in chain:
        raise ConfigError(f"preset cycle: {' -> '.join((*chain, preset))}")
    file = PRESET_DIR / f"{preset}.yaml"
    if not file.is_file():
        raise ConfigError(f"unknown preset {preset!r}; available: {', '.join(preset_names())}")
    loaded = read_yaml(file.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"preset {preset!r} must be a mapping")
    parent = loaded.pop("extends", None)
    if parent is None:
        return loaded
    if not isinstance(parent, str):
        raise ConfigError(f"preset {preset!r}: extends must be a preset name")
    return _merge(_preset_data(parent, (*chain, preset)), loaded)


@functools.cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def build(cls: type, data: dict[str, Any], base: Any = None) -> Any:
    """The ``cls`` (a config dataclass) that nested mappings ``data`` give on top of ``base``
    (or of ``cls()``): a section named in ``data`` keeps the fields it does not set."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
    full = to_dict(base if base is not None else cls())
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(full.get(key), dict):
            value = {**full[key], **value}
        full[key] = value
    try:
        return _adapter(cls).validate_python(full)
    except pydantic.ValidationError as exc:
        raise config_error(exc, cls) from None


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain nested mappings and lists (what ``config.yaml`` holds)."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def save_config(config: SelfPlayConfig, path: Path) -> None:
    import yaml

    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
