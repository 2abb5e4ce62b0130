"""The paper's ablations as presets, and the per-round config schedule.

Each ablation preset extends ``cpu-tiny`` and changes only the keys its name says; the switches
really act in a run (tiny model, scripted designer as in tests/selfplay/test_selfplay.py); a schedule
changes reward parameters from a given round, also after a resume; bad schedules are refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spadekit.selfplay import config as config_module
from spadekit.selfplay.config import PRESET_DIR, load_config, scheduled_config, to_dict
from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

from test_selfplay import WORDS, config, designer_responder

ABLATIONS = {
    "ablate-no-grounding": {"grounding": False},
    "ablate-no-memory": {"use_memory": False},
    "ablate-frozen-designer": {"train_designer": False},
    "ablate-two-skills": {"skills_per_epoch": 2},
    "ablate-solve-rate": {"reward.signal": "solve_rate"},
    "ablate-learning-potential": {"reward.signal": "learning_potential"},
}

PLATEAU_SCHEDULE = ("schedule=[{from_round: 1, set: {reward.plateau_low: 0.2, "
                    "reward.plateau_high: 0.4}}]")


def _flat(data, prefix=""):
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _diff(a, b):
    fa, fb = _flat(to_dict(a)), _flat(to_dict(b))
    assert fa.keys() == fb.keys()
    return {k: fb[k] for k in fa if fa[k] != fb[k]}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_each_ablation_preset_changes_only_what_its_name_says(name):
    assert _diff(load_config("cpu-tiny"), load_config(name)) == ABLATIONS[name]


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_an_ablation_file_layers_on_any_base(name):
    # --preset games-4b --config presets/ablate-*.yaml: the file's ``extends`` is ignored
    base = load_config("games-4b")
    layered = load_config("games-4b", PRESET_DIR / f"{name}.yaml")
    assert _diff(base, layered) == ABLATIONS[name]


def test_extends_cycles_and_unknown_parents_are_config_errors(tmp_path, monkeypatch):
    (tmp_path / "a.yaml").write_text("extends: b\nrounds: 3\n")
    (tmp_path / "b.yaml").write_text("extends: a\n")
    (tmp_path / "c.yaml").write_text("extends: nowhere\n")
    (tmp_path / "d.yaml").write_text("extends: e\nrounds: 5\n")
    (tmp_path / "e.yaml").write_text("rounds: 4\nseed: 7\n")
    monkeypatch.setattr(config_module, "PRESET_DIR", tmp_path)
    with pytest.raises(ConfigError, match="cycle"):
        load_config("a")
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("c")
    cfg = load_config("d")
    assert cfg.rounds == 5 and cfg.seed == 7


def test_schedule_gives_each_round_its_config():
    cfg = load_config("cpu-tiny", overrides=[
        "schedule=[{from_round: 200, set: {reward.plateau_low: 0.2, reward.plateau_high: 0.4}},"
        " {from_round: 300, set: {reward.signal: regret, num_generations: 8}}]"])
    r0, r199, r200, r300 = (scheduled_config(cfg, n) for n in (0, 199, 200, 300))
    assert (r0.reward.plateau_low, r0.reward.plateau_high) == (0.4, 0.6)
    assert r199.reward == r0.reward
    assert (r200.reward.plateau_low, r200.reward.plateau_high) == (0.2, 0.4)
    assert r200.reward.signal == "blend" and r200.num_generations == cfg.num_generations
    assert r300.reward.signal == "regret" and r300.num_generations == 8
    assert r300.reward.plateau_low == 0.2 and r300.schedule == cfg.schedule
    assert _diff(cfg, r200) == {"reward.plateau_low": 0.2, "reward.plateau_high": 0.4}


@pytest.mark.parametrize("entry", [
    "{from_round: 1, set: {reward.nope: 1}}",                 # no such field
    "{from_round: 1, set: {model: tiny}}",                    # structural
    "{from_round: 1, set: {regen_interval: 2}}",              # structural
    "{from_round: 1, set: {train.learning_rate: 0.1}}",       # baked into the trainer
    "{from_round: 1, set: {reward: {plateau_low: 0.2}}}",     # not a dotted key
    "{from_round: 1, set: {reward.plateau_low: high}}",       # wrong type
    "{from_round: 1, set: {num_generations: 0}}",             # fails the config's own checks
    "{from_round: -1, set: {reward.plateau_low: 0.2}}",
    "{from_round: 1, set: {}}",
    "{from_round: 1, sett: {reward.plateau_low: 0.2}}",
    "{from_round: one, set: {reward.plateau_low: 0.2}}",
])
def test_bad_schedules_are_config_errors(entry):
    with pytest.raises(ConfigError):
        load_config("cpu-tiny", overrides=[f"schedule=[{entry}]"])


# -- runs with the tiny model ------------------------------------------------------------------


def _recording(programs, prompts):
    respond = designer_responder(programs)

    def recorder(ids, text):
        if "You write privileged hints" not in text:
            prompts.append(text)
        return respond(ids, text)

    return recorder


def test_frozen_designer_trains_no_designer_samples_but_logs_them(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    batches = []
    with SelfPlay(config(tmp_path, train_designer="false"), tmp_path / "run", policy=policy,
                  designer_policy=designer) as sp:
        train_step = sp.trainer.train_step
        sp.trainer.train_step = lambda samples: (batches.append([s.role for s in samples]),
                                                 train_step(samples))[1]
        m0, m1 = sp.run()
        logged = dict(sp.store.query("SELECT name, value FROM metrics WHERE step = 1"))
    assert m1["designer_samples"] == 2 and m1["designer_samples_dropped"] == 2
    assert "designer_reward" in m1
    assert len(batches) == 2 and all(roles and set(roles) == {"agent"} for roles in batches)
    assert logged["designer_samples"] == 2 and logged["designer_samples_dropped"] == 2


def test_no_memory_and_no_grounding_leave_the_designer_prompt_bare(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    prompts: list[str] = []
    designer = ScriptedPolicy(policy.tokenizer, _recording(WORDS, prompts))
    cfg = config(tmp_path, rounds=1, use_memory="false", grounding="false",
                 memory_seed_library="true")
    with SelfPlay(cfg, tmp_path / "run", policy=policy, designer_policy=designer) as sp:
        sp.run()
        assert sp.corpus is None
        # the memory holds seeds the designer would have been shown
        assert len(sp.memory) > 0
        skill = sp.memory.records()[0].skill
        assert sp.memory.positive_seeds(skill, 2)
    assert len(prompts) == 2
    for text in prompts:
        assert "Reference environments for this skill" not in text
        assert "Avoid:" not in text
        assert "<document>" not in text and "No grounding document" in text


def test_schedule_changes_the_plateau_band_from_its_round_also_after_resume(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    run = tmp_path / "run"
    bands = []
    with SelfPlay(config(tmp_path, rounds=2, schedule=PLATEAU_SCHEDULE[len("schedule="):]),
                  run, policy=policy, designer_policy=designer) as sp:
        m0 = sp.run(1)[0]
        bands.append((sp.config.reward.plateau_low, sp.config.reward.plateau_high))
        m1 = sp.run(1)[0]
        bands.append((sp.config.reward.plateau_low, sp.config.reward.plateau_high))
    assert bands == [(0.4, 0.6), (0.2, 0.4)]
    assert m0["schedule/reward.plateau_low"] == 0.4 and m0["schedule/changed"] == 1
    assert m1["schedule/reward.plateau_low"] == 0.2 and m1["schedule/reward.plateau_high"] == 0.4
    # the stored config keeps the schedule; a resumed run derives round 2's config again
    assert "plateau_low: 0.2" in (run / "config.yaml").read_text()
    with SelfPlay(config(tmp_path, rounds=1), run, policy=load_policy("tiny"),
                  designer_policy=designer, resume=True) as sp:
        assert sp.config.reward.plateau_low == 0.4  # the base, until a round starts
        m2 = sp.run()[0]
        assert (sp.config.reward.plateau_low, sp.config.reward.plateau_high) == (0.2, 0.4)
    assert m2["step"] == 2 and m2["schedule/reward.plateau_low"] == 0.2


# -- the reward constants reach the designer's reward through the config (issue 12, defect 1) --


def _designer_reward_at(cfg, step: int, tmp_path) -> float:
    """The designer reward ``round_samples.designer_samples`` gives, at ``step``, an
    environment of mean no-hint return 0.225 (the plateau's win rate, SPEC point 5) and
    regret 0.075 (real store and memory)."""
    from spadekit.envs import library
    from spadekit.selfplay.memory import EnvironmentMemory
    from spadekit.selfplay.samples import designer_samples
    from spadekit.runs.store import RunStore

    created = step - cfg.regen_interval
    program = library.program(library.list_library()[0])
    with RunStore(tmp_path / f"store-{step}", create=True) as store:
        store.add_environment(program, step=created)
        memory = EnvironmentMemory(store)
        memory.add(program, step=created)
        for i in range(10):   # 3 wins of 0.75 in 10 no-hint plays (all at generation): 0.225
            store.record_play(program.sha256, created, with_hint=False,
                              episode_return=0.75 if i < 3 else 0.0)
        for _ in range(4):    # hinted mean 0.3 vs no-hint 0.225: regret 0.075
            store.record_play(program.sha256, created, with_hint=True, episode_return=0.3)
        store.push_delayed({"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
                            "logprobs": [0.0, -0.5, -0.5], "generated_step": created,
                            "due_step": step, "skill": program.skill,
                            "env_sha": program.sha256})
        metrics: dict = {}
        samples = designer_samples(store, memory, {}, scheduled_config(cfg, step), step, 40,
                                   metrics)
    assert len(samples) == 1
    return metrics["designer_reward"]


def test_a_scheduled_plateau_band_changes_the_designer_reward(tmp_path):
    entry = "[{from_round: 200, set: {reward.plateau_low: 0.2, reward.plateau_high: 0.4}}]"
    cfg = load_config("cpu-tiny", overrides=[f"schedule={entry}", "regen_interval=4"])
    # round 4, band [0.4, 0.6]: 0.4 * clip(0.075 / 0.15) + 0.6 * (1 - 0.175 / 0.25) = 0.38
    assert _designer_reward_at(cfg, 4, tmp_path) == pytest.approx(0.38)
    # round 204, band [0.2, 0.4]: 0.4 * 0.5 + 0.6 * 1 = 0.8
    assert _designer_reward_at(cfg, 204, tmp_path) == pytest.approx(0.8)
    # every other reward constant reaches it too (here without a schedule)
    changed = load_config("cpu-tiny", overrides=["regen_interval=4", "reward.regret_scale=0.3",
                                                 "reward.regret_weight=0.5",
                                                 "reward.plateau_weight=0.5",
                                                 "reward.plateau_ramp=0.5"])
    # 0.5 * clip(0.075 / 0.3) + 0.5 * (1 - 0.175 / 0.5) = 0.125 + 0.325
    assert _designer_reward_at(changed, 8, tmp_path) == pytest.approx(0.45)


# -- the paper's budgets and --dry-run (issue 12, defect 3) ----------------------------------


@pytest.mark.parametrize(("preset", "weight"), [
    ("games-4b", 32.0), ("games-30b", 32.0), ("games-8b-thinking", 32.0),
    ("tooluse-4b", 50.0),   # regeneration every 8: min(192 / 24 * 8, 50) hits the cap
])
def test_presets_reproduce_the_paper_budgets(preset, weight, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from spadekit.cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["selfplay", "--preset", preset, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["agent_samples_per_round"], out["plays_per_env"], out["hint_plays"],
            out["designer_weight"]) == (192, 8, 16, weight)
    assert out["env_max_turns"] == out["config"]["env_max_turns"] == 12
    assert out["config"]["agent_samples_per_round"] == 192
    assert not any(tmp_path.iterdir())   # no run directory, nothing written
    text = CliRunner().invoke(app, ["selfplay", "--preset", preset, "--dry-run"])
    assert text.exit_code == 0 and "plays_per_env" in text.output


def test_thinking_presets_fit_their_hints():
    cfg = load_config("games-30b")
    assert cfg.model == "hf:Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert all(cfg.chat_template.for_role(r) == {"enable_thinking": False}
               for r in ("agent", "designer", "hint"))
    thinking = load_config("games-8b-thinking")
    assert thinking.chat_template.for_role("hint") == {"enable_thinking": True}
    assert thinking.designer.hint_max_new_tokens == 4096


def test_plays_per_env_from_the_agent_budget():
    cfg = load_config("games-4b")
    # ceil(192 / pooled): 24 -> 8, 20 valid -> 10, 7 -> 28
    assert [cfg.plays_per_env(n) for n in (24, 20, 7)] == [8, 10, 28]
    assert load_config("cpu-tiny").plays_per_env(24) == 4   # a fixed num_generations
    with pytest.raises(ConfigError, match="exactly one"):
        load_config("games-4b", overrides=["num_generations=16"])
