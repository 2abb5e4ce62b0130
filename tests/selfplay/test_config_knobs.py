"""Every knob of the self-play config changes what the loop does.

The walk is over ``dataclasses.fields`` of the whole ``SelfPlayConfig`` tree, so a field added
later is found without anyone listing it. Each leaf is either

- probed (``PROBES``): set to another value, the real part that consumes it must behave
  differently: the designer's prompt or sampling, the validation verdicts, an agent episode, the
  agent advantages, the designer's reward or loss weight, the update, what a round plays or
  writes; or
- listed in ``DOCUMENTED`` with the reason there is no per-value effect to show here (it may not
  change the numbers by design, it is covered by its component's own tests, or it needs hardware),
  and then the field must at least be read by some module other than the one that defines it.

A field with neither fails ``test_every_field_is_probed_or_documented``. Adding a probe is one
line: ``probe("section.field", other_value, observer)``. Every key a ``schedule`` may set is
probed through ``scheduled_config`` too (the schedule must move it from its round on).

Observers are cheap and use real parts: the design phase with a scripted designer on the real
sandbox, the rollout engine on an in-process environment, the per-round sample functions on a
real run database, the trainer on the tiny model, and one-round runs only for what only the loop
itself reads.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import TEST_CONFIG, TIERS
from knob_observers import (World, agent, base_config, budget, curriculum, design, designer,
                            episode, game_episode, loop, policy_name, tracking, update,
                            write_corpus, write_pool)
from knob_watch import watch
from spadekit.selfplay.config import (SCHEDULABLE, SCHEDULABLE_PREFIXES, RewardConfig,
                                      ScheduleEntry, SelfPlayConfig, build, nested,
                                      scheduled_config)


SRC = Path(__file__).resolve().parents[2] / "src" / "spadekit"


# -- the walk ------------------------------------------------------------------------------------


def leaves(cls: type = SelfPlayConfig, prefix: str = "") -> list[str]:
    """Dotted paths of every non-dataclass field of ``cls``'s tree."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


@dataclasses.dataclass
class Probe:
    value: Any
    """The other value (or a callable of the world giving it, e.g. a path in a temp dir)."""
    observe: Callable[[SelfPlayConfig, Any], Any]
    also: dict[str, Any]
    """Settings of both configs that make the field matter (e.g. the judge on for its budget)."""
    joint: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Settings that go with the change to keep it legal (e.g. the rollout temperature with the
    designer's)."""


PROBES: dict[str, Probe] = {}


def probe(path: str, value: Any, observe: Callable, joint: dict | None = None,
          **also: Any) -> None:
    assert path not in PROBES, path
    PROBES[path] = Probe(value, observe, {k.replace("__", "."): v for k, v in also.items()},
                         dict(joint or {}))


def with_(cfg: SelfPlayConfig, settings: dict[str, Any]) -> SelfPlayConfig:
    return build(SelfPlayConfig, nested(settings.items()), base=cfg)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if not TIERS:
        pytest.skip("no safe sandbox tier works on this machine")
    from spadekit.sandbox import SandboxConfig, SandboxPool

    pool = SandboxPool(SandboxConfig(tier=TIERS[0], **TEST_CONFIG), warm=1)
    yield World(tmp_path_factory.mktemp("knobs"), pool)
    pool.close()


# -- the probes --------------------------------------------------------------------------------

HACKS = Path(__file__).resolve().parents[1] / "data" / "hacks"


def validation(cfg: SelfPlayConfig, w: World) -> Any:
    """Verdicts and what was played for a lottery, a program paying 0.99 for anything, an
    honest one and the library's knapsack (whose random valid packs earn partial credit),
    under the settings the loop builds from ``cfg``."""
    from spadekit.envs import library
    from spadekit.sandbox.validate import Validator

    validator = Validator(w.pool, cfg.validation.settings(cfg.turn_cap), seed=0)
    out = []
    knapsack = library.program(library.get("games_knapsack_reveal")).code
    for name in ("lottery.py", "pays_099.py", "honest_vault.py", knapsack):
        r = validator.validate(name if name == knapsack else (HACKS / name).read_text())
        out.append((r.ok, r.reason, len(r.details["seeds"].get("solution", ())),
                    r.details.get("lockstep", {}).get("instances"),
                    r.details.get("blind_mean_return")))
    return tuple(out)


# what the designer is asked, and how it is sampled and validated
probe("setting", "tooluse", design)
probe("envs_per_round", 2, design)
probe("skills_per_epoch", 1, design)
probe("env_max_turns", 2, design)  # turn_cap min(2, rollout.max_turns 3)
probe("corpus", write_corpus, design)
probe("grounding", False, design)
probe("use_memory", False, design)
probe("memory_seed_library", False, design)
probe("memory_seed", str(Path(__file__).parents[1] / "data" / "refstyle"), design)
probe("memory_size", 1, design)
probe("dedup_threshold", 0.05, design)  # LETTERS is 0.11 like a library game
probe("designer.temperature", 0.9, design, joint={"rollout.temperature": 0.9})
probe("designer.top_p", 0.5, design)
probe("designer.max_new_tokens", 3000, design)
probe("designer.hint_mode", "designer", design)
probe("designer.prompt_style", "compact", design)
probe("designer.hint_temperature", 0.7, design)
probe("designer.hint_max_new_tokens", 40, design)
probe("designer.positive_seeds", 0, design)  # the library has 1 game per skill
probe("designer.max_words", 5, design)
probe("designer.repair_attempts", 1, design)
probe("designer.judge", "on", design)
probe("designer.judge_temperature", 0.9, design, designer__judge="on")
probe("designer.judge_max_new_tokens", 99, design, designer__judge="on")
probe("designer.hint_model", "tiny", design)
probe("designer.response_prefix", "# designed\n", design)
probe("designer.grammar", "kit", design, designer__prompt_style="kit")
probe("chat_template.all", {"enable_thinking": False}, design)
probe("chat_template.designer", {"enable_thinking": False}, design)
probe("chat_template.hint", {"enable_thinking": False}, design)
probe("chat_template.agent", {"enable_thinking": False}, episode)
# one agent episode
probe("rollout.max_turns", 2, episode)
probe("rollout.max_new_tokens", 6, episode)
probe("rollout.action_grammar", ("games",), game_episode)
probe("rollout.max_context_tokens", 60, episode)
probe("rollout.temperature", 0.9, episode, joint={"designer.temperature": 0.9})
probe("rollout.top_p", 0.5, episode)
probe("rollout.stop", ["STOP"], episode)
probe("rollout.system_prompt", "Count.", episode)
probe("rollout.native_tools", False, episode)
probe("rollout.seed", 5, episode)
probe("rollout.strip_thinking", False, episode)
probe("rollout.response_prefix", {"tooluse": "<tool_call>"}, episode)
probe("rollout.demonstrations", ["tooluse"], episode)
# agent samples and the designer's reward and weight
probe("reward.failed_episode_reward", -1.0, agent)
probe("train.sample_granularity", "turn", agent)
probe("reward.signal", "solve_rate", designer)
probe("reward.regret_scale", 0.6, designer)
probe("reward.regret_weight", 0.1, designer)
probe("reward.plateau_weight", 0.2, designer)
probe("reward.plateau_low", 0.1, designer)
probe("reward.plateau_high", 0.9, designer,  # a win rate above 0.6 to move
      reward__win_rate_input="positive_share")
probe("reward.plateau_ramp", 0.5, designer)
probe("reward.designer_weight_cap", 2.0, designer)
probe("reward.ema_alpha_fast", 0.6, designer, reward__signal="learning_potential")
probe("reward.ema_alpha_slow", 0.2, designer, reward__signal="learning_potential")
probe("reward.ema_scale", 2.0, designer, reward__signal="learning_potential")
probe("reward.win_rate_input", "positive_share", designer)
probe("reward.above_chance", True, designer)  # the stored chance return is 0.2
probe("regen_interval", 3, designer)
# how many plays
probe("agent_samples_per_round", 12, budget, joint={"num_generations": None})
probe("num_generations", 3, budget)
# the update
probe("train.learning_rate", 1e-4, update)
probe("train.weight_decay", 0.9, update)
probe("train.adam_beta1", 0.1, update)
probe("train.adam_beta2", 0.5, update)
probe("train.adam_epsilon", 1.0, update)
probe("train.max_grad_norm", 1e-4, update)
probe("train.epsilon", 0.01, update)
probe("train.epsilon_high", 5.0, update)
probe("train.beta", 0.5, update)
probe("train.loss_type", "sequence", update)
probe("train.importance_sampling_cap", 100.0, update)
probe("train.importance_sampling_roles", ["agent", "designer"], update)
probe("train.mask_truncated_completions", True, update)
probe("train.num_iterations", 1, update)
probe("train.use_peft", True, update)
probe("train.lora_r", 4, update, train__use_peft=True)
probe("train.lora_alpha", 64, update, train__use_peft=True)
probe("train.lora_dropout", 0.5, update, train__use_peft=True)
probe("train.lora_target_modules", ["q_proj"], update, train__use_peft=True)
probe("seed", 3, loop)
probe("stream_key", "another", loop)
# the baselines
probe("curriculum.kind", "fixed", curriculum)
probe("curriculum.pool", lambda w: write_pool(w), curriculum, curriculum__kind="fixed")
probe("curriculum.rlve_envs", ["Division", "Multiplication"], curriculum,
      curriculum__kind="rlve")
probe("curriculum.rlve_threshold", 0.5, curriculum, curriculum__kind="rlve",
      curriculum__rlve_envs=["Division"], curriculum__rlve_window_factor=1)
probe("curriculum.rlve_window_factor", 1, curriculum, curriculum__kind="rlve",
      curriculum__rlve_envs=["Division"])
probe("curriculum.rlve_levels", 1, curriculum, curriculum__kind="rlve",
      curriculum__rlve_envs=["Division"], curriculum__rlve_window_factor=1)
# the watch over pooled programs (tests/knob_watch.py; SlowEnv steps sleep 0.2 s)
probe("watch.spot_checks", 0, watch)
probe("watch.step_time_limit_s", 0.02, watch, watch__slow_step_factor=1e6)
probe("watch.slow_step_factor", 1e6, watch, watch__step_time_limit_s=30.0)
probe("watch.slow_step_min_s", 10.0, watch, watch__step_time_limit_s=30.0)
probe("watch.turn_time_limit_s", 0.02, watch, watch__step_time_limit_s=30.0,
      watch__slow_step_factor=1e6)
probe("watch.action_margin", 0.8, watch)  # SlowEnv's garbage earns 0.25: 1.0 - 0.25 < 0.8
# the validator's settings (the loop's own call: config.validation.settings(turn_cap))
probe("validation.require_solution", False, validation)
probe("validation.solution_drawn_seeds", 0, validation)
probe("validation.action_margin", 0.005, validation, validation__random_margin=0.005)
# the knapsack's random packs earn partial credit, so a margin of 1 refuses it (4 turns)
probe("validation.random_margin", 1.0, validation, rollout__max_turns=12, env_max_turns=12)
probe("validation.lockstep_instances", 60, validation)
probe("validation.blind_episodes", 0, validation)  # the knapsack prints its actions
probe("validation.turn_budget_s", 1e-6, validation)
# what only the loop itself reads
probe("model", "smollm2-135m", policy_name)
probe("rounds", 2, loop)
probe("hint_generations", 1, loop)
probe("bootstrap", "library", loop)
probe("bootstrap_per_round", 1, loop, bootstrap="library")
probe("train_designer", False, loop, rounds=3)
probe("designer.model", "tiny", loop, rounds=3)  # a frozen designer: its samples are dropped
probe("checkpoint_every", 2, loop)
probe("checkpoint.keep_last", 1, loop, rounds=3)  # 2 folders -> 1
probe("checkpoint.keep_every", 2, loop, rounds=3, checkpoint__keep_last=1)  # round 2's stays
probe("generation_model", "tiny", loop)
probe("rollout.max_staleness", 1, loop, generation_model="tiny")  # the last batch in flight
probe("logging.backends", ["wandb"], tracking)  # W&B offline (conftest), or its missing package
probe("logging.project", "other", tracking, logging__backends=["wandb"])
probe("logging.name", "other", tracking, logging__backends=["wandb"])

DOCUMENTED: dict[str, str] = {
    "schedule": "structural: the per-round changes themselves (test_schedulable_keys)",
    "tensorboard": "only with the tensorboard package installed (absent here): the round's "
                   "metrics are also written to run_dir/tensorboard",
    "rollout.load_workers": "performance: threads that start episodes; no effect on results",
    "train.temperature": "the loop trains with rollout.temperature; another value is refused "
                         "(test_knobs_the_loop_sets_are_refused_when_they_differ)",
    "train.seed": "the loop trains with the top-level seed; another value is refused "
                  "(test_knobs_the_loop_sets_are_refused_when_they_differ)",
    "train.per_device_train_batch_size": "performance: micro-batching leaves the update equal "
                                         "(tests/train/test_trainer.py)",
    "train.max_tokens_per_microbatch": "performance: micro-batching leaves the update equal "
                                       "(tests/train/test_trainer.py)",
    "train.logprob_chunk_size": "performance: chunked log-softmax, the same numbers",
    "train.gradient_checkpointing": "memory only: the same gradients",
    "train.distributed_strategy": "several processes (tests/train/test_distributed.py)",
    "train.split_batches": "several processes (tests/train/test_distributed.py)",
    "train.ddp_backend": "several processes (tests/train/test_distributed.py)",
    "train.ddp_timeout": "several processes (tests/train/test_distributed.py)",
    "train.ddp_find_unused_parameters": "several processes (tests/train/test_distributed.py)",
    "train.ddp_bucket_cap_mb": "several processes: communication only",
    "train.fsdp_reshard_after_forward": "several processes: memory only",
    "distributed.env_backend": "Ray sandbox workers (tests/rollout/test_ray_envs.py)",
    "distributed.ray_address": "Ray sandbox workers (tests/rollout/test_ray_envs.py)",
    "distributed.env_workers": "Ray sandbox workers (tests/rollout/test_ray_envs.py)",
    "eval.suites": "in-loop evaluation (spadekit.eval.inloop; tests/eval/test_eval_runner.py)",
    "eval.every": "in-loop evaluation (spadekit.eval.inloop; tests/eval/test_eval_runner.py)",
    "eval.limit": "in-loop evaluation (spadekit.eval.inloop)",
    "eval.k": "in-loop evaluation (spadekit.eval.inloop)",
    "eval.max_new_tokens": "in-loop evaluation (spadekit.eval.inloop)",
    "eval.max_turns": "in-loop evaluation (spadekit.eval.inloop)",
    "eval.temperature": "in-loop evaluation (spadekit.eval.inloop)",
    "eval.seed": "in-loop evaluation (spadekit.eval.inloop)",
    **{f"warmstart.{name}": "the warm start before the run (a cached SFT; each field is in "
       "its cache key and changes the build: tests/selfplay/test_warm_cache.py)"
       for name in ("pool", "model", "programs", "combos", "per_combo", "epochs", "learning_rate",
                    "lora_r", "lora_layers",
                    "agent_seeds", "held_out_share", "seed", "seed_memory", "base")},
    **{f"sandbox.{name}": "isolation and limits of the sandbox (tests/test_sandbox_*.py)"
       for name in ("start_timeout", "load_timeout", "create_timeout", "reset_timeout",
                    "step_timeout", "call_timeout", "memory_mb", "cpu_seconds",
                    "max_open_files", "max_file_size_mb", "max_processes", "scratch_mb",
                    "cpu_quota", "idle_stop_ms", "max_program_chars", "max_reply_bytes",
                    "max_observation_chars", "stderr_tail_bytes", "tier", "allow_unsafe",
                    "use_cgroups", "uid_base", "python", "preload", "hash_seed", "compat",
                    "packages")},
}


# -- the tests ---------------------------------------------------------------------------------


def test_every_field_is_probed_or_documented():
    fields = set(leaves())
    probed, documented = set(PROBES), set(DOCUMENTED)
    assert not probed & documented, sorted(probed & documented)
    missing = sorted(fields - probed - documented)
    assert not missing, f"config fields with no probe and no documented reason: {missing}"
    stale = sorted((probed | documented) - fields)
    assert not stale, f"probes or reasons for fields that no longer exist: {stale}"


def _reads(exclude: set[Path]) -> list[tuple[set[str], set[str]]]:
    """Per module: the names it mentions (attributes, variables, strings) and the dotted pairs
    it reads (``x.section.field``, ``"section.field"``)."""
    out = []
    for file in SRC.rglob("*.py"):
        if file in exclude:
            continue
        names: set[str] = set()
        pairs: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
                inner = node.value
                owner = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", "")
                pairs.add(f"{owner}.{node.attr}")
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # getattr(config, "name")
                pairs.add(node.value)  # dotted --set keys
        out.append((names, pairs))
    return out


def is_read(path: str, modules: list[tuple[set[str], set[str]]]) -> bool:
    """``section.field`` is read as that dotted pair, or as ``field`` in a module that takes
    the section (names ``section`` or its class); a top-level field as ``field``."""
    if "." not in path:
        return any(path in names for names, _ in modules)
    section, name = path.split(".")
    holder = typing.get_type_hints(SelfPlayConfig)[section].__name__
    return any(path in pairs or (name in names and (section in names or holder in names))
               for names, pairs in modules)


def test_documented_fields_are_read_somewhere():
    """A documented field still has to be read, by its dotted path, by a module other than the
    config files."""
    configs = {SRC / "selfplay" / "config.py", SRC / "train" / "config.py",
               SRC / "sandbox" / "config.py"}
    missing = sorted(str(p) for p in configs if not p.is_file())
    assert not missing, f"the config files to exclude moved: {missing}"
    modules = _reads(configs)
    unread = sorted(p for p in DOCUMENTED if not is_read(p, modules))
    assert not unread, f"documented fields nobody reads: {unread}"


def test_the_read_check_matches_dotted_paths():
    """A field name read under another section does not count: ``eval.seed`` is not read by a
    module that reads only ``train.seed``."""
    assert is_read("eval.seed", [(set(), {"eval.seed"})])
    assert is_read("eval.seed", [({"seed", "EvalLoopConfig"}, set())])
    assert not is_read("eval.seed", [({"seed", "train"}, {"train.seed"})])


_CACHE: dict[tuple[str, str], Any] = {}


def _observe(fn: Callable, cfg: SelfPlayConfig, w: World) -> Any:
    key = (fn.__name__, repr(cfg))
    if key not in _CACHE:
        _CACHE[key] = fn(cfg, w)
    return _CACHE[key]


def _base_of(p: Probe) -> SelfPlayConfig:
    return with_(base_config(), p.also) if p.also else base_config()


_REPEAT: dict[tuple[str, str], Any] = {}


@pytest.mark.parametrize("path", sorted(PROBES))
def test_each_observer_repeats_itself(path, world):
    """The observer of every probe, run twice on the probe's base config, returns equal results
    (no timestamps, ids, temp paths or wall clocks in what it returns), so that
    ``test_changing_a_knob_changes_behaviour`` can fail. The second run is made once per
    observer and base config and shared by the probes that have both in common."""
    p = PROBES[path]
    base = _base_of(p)
    first = _observe(p.observe, base, world)
    key = (p.observe.__name__, repr(base))
    if key not in _REPEAT:
        _REPEAT[key] = p.observe(base, world)
    assert _REPEAT[key] == first, \
        f"{p.observe.__name__} returned different results for the same config ({path})"


@pytest.mark.parametrize("path", sorted(PROBES))
def test_changing_a_knob_changes_behaviour(path, world):
    p = PROBES[path]
    base = with_(base_config(), p.also) if p.also else base_config()
    value = p.value(world) if callable(p.value) else p.value
    current: Any = base
    for part in path.split("."):
        current = getattr(current, part)
    assert current != value, f"{path}: the probe value equals the base value {value!r}"
    changed = with_(base, {path: value, **p.joint})
    assert _observe(p.observe, base, world) != _observe(p.observe, changed, world), \
        f"{path}={value!r} changed nothing that {p.observe.__name__} sees"


def schedulable_keys() -> list[str]:
    return [*SCHEDULABLE, *(f"{SCHEDULABLE_PREFIXES[0]}{f.name}"
                            for f in dataclasses.fields(RewardConfig))]


@pytest.mark.parametrize("key", schedulable_keys())
def test_schedulable_keys_move_from_their_round(key, world):
    """Every key a schedule may set is a probed field, and an entry from round 3 on changes
    what its consumer does in round 3 but not in round 2."""
    assert key in PROBES, f"schedulable {key!r} has no probe"
    p = PROBES[key]
    value = p.value(world) if callable(p.value) else p.value
    base = with_(base_config(), p.also) if p.also else base_config()
    entry = {key: value, **p.joint}
    cfg = dataclasses.replace(base, schedule=[ScheduleEntry(from_round=3, set=entry)])
    before, after = scheduled_config(cfg, 2), scheduled_config(cfg, 3)
    before = dataclasses.replace(before, schedule=[])
    after = dataclasses.replace(after, schedule=[])
    assert _observe(p.observe, before, world) == _observe(p.observe, base, world)
    assert _observe(p.observe, after, world) != _observe(p.observe, before, world)


def test_knobs_the_loop_sets_are_refused_when_they_differ(tmp_path):
    """``train.temperature`` and ``train.seed`` are given to the trainer by the loop (from
    ``rollout.temperature`` and ``seed``): a different value used to be replaced without a
    word, so it is a ConfigError that names the knob to set; equal values, the defaults and a
    saved run's config (what resume reads) still load."""
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.config import load_config, save_config

    with pytest.raises(ConfigError, match=r"train\.temperature=0\.7 .*set rollout\.temperature"):
        load_config("cpu-tiny", overrides=["train.temperature=0.7"])
    with pytest.raises(ConfigError, match=r"train\.seed=3 .*set seed instead"):
        load_config("cpu-tiny", overrides=["train.seed=3"])
    same = load_config("cpu-tiny", overrides=["train.temperature=0.6", "seed=3", "train.seed=3"])
    assert (same.train.temperature, same.train.seed) == (0.6, 3)
    save_config(same, tmp_path / "config.yaml")
    again = load_config(None, path=tmp_path / "config.yaml")
    assert (again.rollout.temperature, again.seed) == (0.6, 3)


@pytest.mark.parametrize("temperature", ["0", "1e-06", "0.005", "nan", "inf"])
def test_a_rollout_temperature_the_trainer_cannot_use_is_refused_when_the_config_loads(
        temperature, tmp_path):
    """Below 0.01 generation is greedy (``policy.base.MIN_TEMPERATURE``) and the trainer cannot
    divide by it: refused at load, naming ``rollout.temperature``, before any run directory
    exists (it used to fail in the trainer's build, after the run was created)."""
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.config import load_config

    must = "a finite number" if temperature in ("nan", "inf") else ">= 0\\.01"
    with pytest.raises(ConfigError, match=rf"^rollout\.temperature:? must be {must}"):
        load_config("cpu-tiny", overrides=[f"rollout.temperature={temperature}",
                                           f"designer.temperature={temperature}"])
    assert load_config("cpu-tiny", overrides=["rollout.temperature=0.01",
                                              "designer.temperature=0.01"]).train is not None
