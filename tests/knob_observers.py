"""The observers of ``tests/selfplay/test_config_knobs.py``: cheap runs of the real parts that consume
the self-play config, each returning a comparable summary of what that part did.

- ``design``: one design phase (scripted designer on a hybrid-thinking template, real
  validation in the sandbox, real store and memory): prompts, sampling, verdicts, hints;
- ``episode``: one agent episode on a trusted in-process environment;
- ``designer`` / ``agent``: the per-round sample functions on a real run database;
- ``update``: two updates of the tiny model; ``loop``: one or more real rounds;
  ``tracking``: one real round with experiment trackers;
- ``budget``, ``curriculum``, ``policy_name``: the functions the loop calls for those fields.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any, Callable

from spadekit.common.streams import RoundStreams
from spadekit.selfplay.config import SelfPlayConfig, load_config
from spadekit.policy.scripted import ScriptedPolicy
from spadekit.policy.tiny import tiny_tokenizer

from test_selfplay import LETTERS
from test_thinking import HYBRID_TEMPLATE

# the hybrid-thinking template, which also renders native tool schemas
KNOB_TEMPLATE = ("{%- if tools %}{{ '<|im_start|>system\\nTools:\\n' }}"
                 "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}"
                 "{{ '<|im_end|>\\n' }}{%- endif %}" + HYBRID_TEMPLATE)


BASE = ["model=tiny", "rounds=1", "envs_per_round=3", "num_generations=2",
        "hint_generations=2", "regen_interval=2", "bootstrap=null", "skills_per_epoch=3",
        "rollout.max_turns=3", "rollout.max_new_tokens=64", "rollout.max_context_tokens=4096",
        "designer.max_new_tokens=4096", "tensorboard=false", "train.use_peft=false",
        "train.learning_rate=1e-2", "train.num_iterations=2",
        "stream_key=knobs"]  # fixed, so that an observer repeats itself


def base_config(**extra: Any) -> SelfPlayConfig:
    return load_config("cpu-tiny", overrides=BASE + [f"{k}={v}" for k, v in extra.items()])


class World:
    """What the observers share: a sandbox pool, a temp directory, the tiny model."""

    def __init__(self, tmp: Path, pool: Any) -> None:
        self.tmp, self.pool, self._n = tmp, pool, 0

    def fresh(self) -> Path:
        self._n += 1
        path = self.tmp / f"d{self._n}"
        path.mkdir()
        return path


# -- observer: one design phase (scripted designer, real validation) --------------------------

NEAR_TWIN = LETTERS.replace("0.9 * letters", "0.8 * letters")  # a near duplicate of LETTERS
BROKEN = "class BrokenEnv:\n    def reset(self, seed=None, options=None)\n        pass\n"


class RecordingPolicy(ScriptedPolicy):
    """A scripted designer that also records each request's rendered prompt and sampling,
    the grammar it was asked to follow included (its digest; the script answers the same
    either way: the knob test observes the request the loop sends)."""

    def __init__(self, tokenizer: Any, respond: Callable, log: list) -> None:
        super().__init__(tokenizer, respond)
        self.log = log

    def generate(self, requests):
        import dataclasses
        import hashlib

        free = [dataclasses.replace(r, params=dataclasses.replace(r.params, grammar=None))
                for r in requests]
        gens = super().generate(free)
        for req, gen in zip(requests, gens):
            p = req.params
            grammar = p.grammar and hashlib.sha256(p.grammar.encode()).hexdigest()[:16]
            self.log.append((self.tokenizer.decode(gen.prompt_ids), p.temperature, p.top_p,
                             p.max_new_tokens, p.seed, grammar, gen.text[:40]))
        return gens


def designer_script() -> Callable:
    designs = [LETTERS, BROKEN, NEAR_TWIN]
    count = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: the reward counts letters; one word wins."
        if "<verdict>" in text or "verdict" in text.lower() and "judge" in text.lower():
            return "<verdict>accept</verdict>"
        code = designs[count["n"] % len(designs)]
        count["n"] += 1
        return f"```python\n{code}\n```\nHINT: use letters."

    return respond


def hybrid():
    tok = tiny_tokenizer()
    tok.chat_template = KNOB_TEMPLATE
    return tok


def design(cfg: SelfPlayConfig, w: World) -> Any:
    from spadekit.selfplay.corpus import load_corpus
    from spadekit.selfplay.design import DesignPhase
    from spadekit.selfplay.memory import EnvironmentMemory, SeedlessMemory
    from spadekit.runs.store import RunStore
    from spadekit.sandbox.validate import Validator, ValidatorSettings

    log: list = []
    with RunStore(w.fresh(), create=True) as store:
        memory = EnvironmentMemory(store, cap=cfg.memory_size,
                                   duplicate_threshold=cfg.dedup_threshold)
        if cfg.memory_seed_library:
            memory.seed_from_library()
        if cfg.memory_seed:
            memory.seed_from_source(cfg.memory_seed, cfg.setting)
        corpus = load_corpus(cfg.corpus, seed=0) if cfg.grounding else None
        phase = DesignPhase(cfg, RecordingPolicy(hybrid(), designer_script(), log), w.pool,
                            Validator(w.pool, ValidatorSettings(max_turns=cfg.turn_cap),
                                      seed=0),
                            store, memory if cfg.use_memory else SeedlessMemory(memory), corpus)
        out = phase.run(0, RoundStreams(0, 0))
        # the hint rows without their wall-clock created_at (equal configs, equal results)
        hints = [{k: v for k, v in (store.get_hint(sha) or {}).items() if k != "created_at"}
                 for sha in out.pooled]
    return (tuple(log), out.valid, tuple(sorted(out.reasons.items())), out.repair_calls,
            tuple(sorted(out.judge.items())), json.dumps(hints, sort_keys=True, default=str))


# -- observer: one agent episode on an in-process environment ----------------------------------


class Counter:
    """Trusted in-process environment: never ends by itself, echoes the action."""

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return "count with me", {}

    def step(self, action):
        self.t += 1
        return f"turn {self.t}: {action}", 0.5, False, False, {}

    def tools(self):
        return [{"type": "function", "function": {"name": "tick", "description": "count",
                                                  "parameters": {"type": "object",
                                                                 "properties": {}}}}]


class GameCounter(Counter):
    """The same environment as a game (no tools)."""

    tools = None


def episode(cfg: SelfPlayConfig, w: World, env: type = Counter) -> Any:
    from spadekit.rollout.engine import EpisodeSpec, RolloutEngine

    log: list = []
    policy = RecordingPolicy(hybrid(), lambda _i, _t: "<think>hm</think>\\boxed{up} STOP " +
                             "x" * 30, log)
    engine = RolloutEngine(policy, None, cfg.rollout,
                           chat_template_kwargs=cfg.chat_template.for_role("agent"))
    [tr] = engine.run([EpisodeSpec(None, seed=0, env_factory=env)])
    return (tr.stop_reason, len(tr.turns), tuple(t.action for t in tr.turns),
            tuple((e[1], e[2], e[3], e[4], e[5]) for e in log), hybrid().decode(tr.token_ids))


def game_episode(cfg: SelfPlayConfig, w: World) -> Any:
    """:func:`episode` on the environment as a game."""
    return episode(cfg, w, GameCounter)


# -- observers: the per-round sample functions on a real run database --------------------------


WINS = ((1, 2, 3, 1), (3, 3, 4, 2))
"""Per-round no-hint wins (of 4 plays, returns 0.5 or 0) of the two environments: lifetime
win rates over 2 rounds 0.375 (below the band) and 0.75 (above it), so both edges, both
weights and the ramp show; the per-round rates move, so the EMAs do too."""


def _store_with_env(cfg: SelfPlayConfig, w: World):
    """Two environments made at step 0 (validation measured a chance return of 0.2) and
    played each round until their designer samples are due (``WINS``), with hinted plays of
    mean 0.3 at step 0, plus an invalid program's sample."""
    from spadekit.envs import library
    from spadekit.selfplay.memory import EnvironmentMemory
    from spadekit.selfplay.samples import update_ema
    from spadekit.runs.store import RunStore

    store = RunStore(w.fresh(), create=True)
    memory = EnvironmentMemory(store)
    ema: dict = {}
    entries = [e for e in library.list_library() if e.setting == "games"][:2]
    for entry, wins in zip(entries, WINS):
        program = library.program(entry)
        store.add_environment(program, step=0,
                              validation={"ok": True, "details": {"chance_return": 0.2}})
        memory.add(program, step=0)
        for step in range(cfg.regen_interval):
            for i in range(4):
                store.record_play(program.sha256, step, with_hint=False,
                                  episode_return=0.5 if i < wins[step % 4] else 0.0)
            if step == 0:
                for _ in range(4):
                    store.record_play(program.sha256, 0, with_hint=True, episode_return=0.3)
            update_ema(store, ema, cfg, program.sha256, step)
        store.push_delayed({"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
                            "logprobs": [0.0, -0.5, -0.5], "generated_step": 0,
                            "due_step": cfg.regen_interval, "skill": program.skill,
                            "env_sha": program.sha256})
    # a second designer sample of the same skill with a fixed reward (an invalid program)
    store.push_delayed({"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -0.5],
                        "generated_step": 0, "due_step": cfg.regen_interval,
                        "skill": program.skill, "meta": {"fixed_reward": 0.0}})
    return store, memory, ema


def designer(cfg: SelfPlayConfig, w: World) -> Any:
    from spadekit.selfplay.samples import designer_samples

    store, memory, ema = _store_with_env(cfg, w)
    with store:
        metrics: dict = {}
        samples = designer_samples(store, memory, ema, cfg, cfg.regen_interval, 24, metrics)
    return (round(metrics["designer_reward"], 9), tuple(round(s.advantage, 9) for s in samples),
            tuple(s.weight for s in samples))


def agent(cfg: SelfPlayConfig, w: World) -> Any:
    """The agent samples of two played episodes (one crashed) of one environment."""
    from spadekit.selfplay.samples import agent_samples
    from spadekit.rollout.engine import EpisodeSpec, RolloutEngine

    policy = ScriptedPolicy(tiny_tokenizer(), lambda _i, _t: "\\boxed{up}")
    engine = RolloutEngine(policy, None, dataclasses.replace(cfg.rollout, max_turns=2))
    trajs = engine.run([EpisodeSpec(None, seed=s, env_factory=Counter,
                                    tag={"env": "e", "with_hint": False}) for s in (0, 1)])
    trajs[1].failure = {"type": "EnvError", "reason": "crash"}
    metrics: dict = {}
    samples = agent_samples(trajs, cfg, metrics)
    return tuple((round(s.advantage, 9), len(s.token_ids)) for s in samples)


# -- observer: one update of the tiny model ----------------------------------------------------


def update(cfg: SelfPlayConfig, w: World) -> Any:
    """Two ``train_step``s on fixed agent and designer samples (behaviour logprobs off the
    current policy, so ratios leave the clip range); the weights' change and the statistics."""
    import torch

    from spadekit.selfplay.advantages import Sample
    from spadekit.policy.registry import load_policy
    from spadekit.train.trainer import PolicyTrainer

    policy = load_policy("tiny", seed=0)
    train = dataclasses.replace(cfg.train, temperature=cfg.rollout.temperature, seed=cfg.seed)
    trainer = PolicyTrainer(policy, train)
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    mask = [0, 0, 1, 1, 1, 1, 1, 1]
    lp = [0.0, 0.0] + [-9.0] * 6  # far below the model's: ratio >> 1
    samples = [Sample(role="agent", group_id="g", token_ids=ids, loss_mask=mask,
                      behaviour_logprobs=lp, advantage=1.0, weight=1.0),
               Sample(role="agent", group_id="g", token_ids=ids[::-1][:6], loss_mask=mask[:6],
                      behaviour_logprobs=lp[:6], advantage=-1.0, weight=1.0, truncated=True),
               Sample(role="designer", group_id="s", token_ids=ids[1:], loss_mask=mask[1:],
                      behaviour_logprobs=lp[1:], advantage=0.5, weight=3.0,
                      generated_at_step=0)]
    stats = [trainer.train_step(samples) for _ in range(2)]
    with torch.no_grad():  # the trained model's output on a fixed input (adapters included)
        logits = policy.model(torch.tensor([ids])).logits
    delta = float(logits.double().abs().sum())
    keys = ("loss", "num_samples_trained", "num_importance_weighted", "tis_mean",
            "dropped_truncated", "num_tokens")
    n_params = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    return (round(delta, 6), n_params,
            tuple(tuple(round(float(s.get(k, 0) or 0), 6) for k in keys) for s in stats))


# -- observer: one round of the loop (what only the loop reads) --------------------------------


def loop(cfg: SelfPlayConfig, w: World) -> Any:
    from spadekit.policy.registry import load_policy
    from spadekit.selfplay.loop import SelfPlay

    run = w.fresh() / "run"
    log: list = []
    with SelfPlay(cfg, run, policy=load_policy("tiny", seed=0),
                  designer_policy=RecordingPolicy(hybrid(), designer_script(), log)) as sp:
        results = sp.run()
        plays = sp.store.query("SELECT with_hint, COUNT(*) FROM plays GROUP BY with_hint")
        gen = sp.gen_policy is not None
        # the token ledger: rollout.max_staleness leaves the last round's samples in flight
        ledger = tuple((row["step"], row["version"], row["in_flight"] > 0, row["trained"] > 0)
                       for row in sp.store.ledger())
    keep = ("agent_episodes", "pool_bootstrap", "designer_samples_dropped", "valid")
    return (len(results), tuple(sorted(tuple(r) for r in plays)),
            tuple(tuple(m.get(k) for k in keep) for m in results),
            tuple(e[4] for e in log), (run / "tensorboard").exists(),
            len(list((run / "checkpoints").glob("*"))) if (run / "checkpoints").exists() else 0,
            gen, ledger)


def tracking(cfg: SelfPlayConfig, w: World) -> Any:
    """One real round with ``cfg.logging``: what the run records about its trackers (which
    started or were disabled, under which project and run name; the same whether or not the
    package is installed) and the steps each logged (W&B offline, trackio local: conftest)."""
    from spadekit.policy.registry import load_policy
    from spadekit.selfplay.loop import SelfPlay

    run = w.fresh() / "run"
    with SelfPlay(cfg, run, policy=load_policy("tiny", seed=0),
                  designer_policy=RecordingPolicy(hybrid(), designer_script(), [])) as sp:
        sp.run()
        events = tuple((e["kind"], e["data"]["backend"], e["data"]["project"],
                        e["data"]["name"]) for e in sp.store.events()
                       if e["kind"].startswith("tracking_"))
        logged = (sp.store.get_state("tracking") or {}).get("logged")
    return events, logged


def budget(cfg: SelfPlayConfig, w: World) -> Any:
    """``plays_per_env``: what ``SelfPlay._play`` plays per pooled environment (pools of 3, 7)."""
    return cfg.plays_per_env(3), cfg.plays_per_env(7)


def curriculum(cfg: SelfPlayConfig, w: World) -> Any:
    from spadekit.curriculum import build_curriculum
    from spadekit.rollout.engine import Trajectory

    cur = build_curriculum(cfg)
    if cur is None:
        return None
    specs = cur.episodes(0, random.Random(0), cfg.envs_per_round, cfg.plays_per_env(3))
    for _round in range(3):  # the rlve ladder moves once enough plays are in
        trajs = [Trajectory(spec=s, episode_return=1.0, terminated=True, stop_reason="terminated")
                 for s in specs]
        cur.observe(_round, trajs)
        specs = cur.episodes(_round + 1, random.Random(_round), cfg.envs_per_round,
                             cfg.plays_per_env(3))
    return (type(cur).__name__, len(specs), json.dumps(cur.state_dict(), sort_keys=True,
                                                       default=str),
            tuple(sorted({str(s.tag.get("env")) for s in specs})))


def policy_name(cfg: SelfPlayConfig, w: World) -> Any:
    """What ``SelfPlay`` loads when it is given no policy."""
    from spadekit.policy.registry import load_policy

    policy = load_policy(cfg.model, seed=cfg.seed)
    return policy.name, len(policy.tokenizer)


def write_pool(w: World) -> str:
    from spadekit.envs.program import EnvProgram

    path = w.fresh() / "pool.jsonl"
    path.write_text(json.dumps(EnvProgram(code=LETTERS, skill="Logical_Deduction",
                                          domain="games").to_dict()) + "\n")
    return str(path)


def write_corpus(w: World) -> str:
    path = w.fresh() / "docs.jsonl"
    path.write_text(json.dumps({"text": "Zebra crossings and prime numbers " * 30}) + "\n")
    return str(path)
