"""The paper's baselines as settings of one trainer: the fixed pool and RLVE curricula inside
``SelfPlay`` (real tiny model, real sandbox, real rlve-gym problems), their resume, the in-loop
evaluation, and evaluating a run's checkpoint."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from spadekit.selfplay.config import load_config
from spadekit.curriculum.fixed import FixedPoolCurriculum
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError
from spadekit.policy.registry import load_policy

from test_selfplay import WORDS

DATA = Path(__file__).resolve().parents[1] / "data"


def write_pool(folder: Path, codes: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "pool.jsonl", "w") as fh:
        for i, code in enumerate(codes):
            program = EnvProgram(code=code, skill=f"skill{i % 2}", domain="games",
                                 source=f"test:{i}")
            fh.write(json.dumps(program.to_dict()) + "\n")
    return folder


def config(tmp: Path, kind: str, rounds: int = 2, **extra):
    sets = ["model=tiny", f"rounds={rounds}", "envs_per_round=2", "num_generations=2",
            f"curriculum.kind={kind}", "rollout.max_turns=2", "rollout.max_new_tokens=8",
            "rollout.temperature=1.0", "designer.temperature=1.0", "train.learning_rate=0.01",
            "sandbox.step_timeout=3.0", "tensorboard=false",
            "stream_key=tests"]  # fixed: a straight run and a resumed one are compared
    sets += [f"{k}={v}" for k, v in extra.items()]
    return load_config(preset=None, overrides=sets)


def played(store) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for step, sha in store.query("SELECT step, env_sha FROM plays ORDER BY id"):
        out.setdefault(step, [])
        if sha not in out[step]:
            out[step].append(sha)
    return out


def test_fixed_curriculum_walks_the_pool_in_epochs():
    programs = [EnvProgram(code=c) for c in WORDS[:5]]
    cur = FixedPoolCurriculum(programs)
    rng = random.Random(0)
    seen = []
    for step in range(5):
        specs = cur.episodes(step, rng, envs=2, num_generations=3)
        assert len(specs) == 6
        groups = [s.tag["env"] for s in specs]
        assert groups[:3] == [groups[0]] * 3 and groups[3] != groups[0]
        seen += list(dict.fromkeys(groups))
    assert set(seen[:5]) == {p.sha256 for p in programs}  # every program once per epoch
    clone = FixedPoolCurriculum(programs)
    clone.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    r1, r2 = random.Random(7), random.Random(7)
    assert [s.tag["env"] for s in cur.episodes(9, r1, 2, 1)] == \
        [s.tag["env"] for s in clone.episodes(9, r2, 2, 1)]
    with pytest.raises(ConfigError):
        FixedPoolCurriculum([])
    with pytest.raises(ConfigError, match="changed"):
        FixedPoolCurriculum(programs[:2]).load_state_dict(cur.state_dict())


def test_train_fixed_trains_the_agent_only_and_resumes_the_same_walk(tmp_path):
    from spadekit.selfplay.loop import SelfPlay

    pool = write_pool(tmp_path / "pool", WORDS[:5])
    extra = {"curriculum.pool": str(pool), "num_generations": 4, "rollout.seed": 3}
    cfg = config(tmp_path, "fixed", rounds=3, **extra)
    policy = load_policy("tiny")
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with SelfPlay(cfg, tmp_path / "straight", policy=policy) as sp:
        metrics = sp.run()
        straight = played(sp.store)
        assert all(m["pool_baseline"] == 2 and m["agent_episodes"] == 8 for m in metrics)
        assert all("designer_samples" not in m and "designed" not in m for m in metrics)
        assert sum(m["train/optimizer_steps"] for m in metrics) >= 1  # a GRPO update ran
        rows = sp.store.environments()
        assert {r["status"] for r in rows} == {"retired"}
        assert {r["lineage"]["baseline"] for r in rows} == {"fixed"}
    assert any(not before[k].equal(v) for k, v in policy.model.state_dict().items())
    assert [len(v) for v in straight.values()] == [2, 2, 2]

    with SelfPlay(config(tmp_path, "fixed", rounds=2, **extra),
                  tmp_path / "resumed", policy=load_policy("tiny")) as sp:
        sp.run()
    with SelfPlay(config(tmp_path, "fixed", rounds=1, **extra),
                  tmp_path / "resumed", policy=load_policy("tiny"), resume=True) as sp:
        assert sp.next_step == 2
        sp.run()
        assert played(sp.store) == straight  # same environments, round for round


def test_rlve_curriculum_in_selfplay_records_plays_and_resumes_its_ladders(tmp_path):
    pytest.importorskip("Gym")
    from spadekit.selfplay.loop import SelfPlay

    envs = '["Multiplication", "Sorting", "TwoSAT"]'
    cfg = config(tmp_path, "rlve", rounds=2, **{"curriculum.rlve_envs": envs,
                                                "curriculum.rlve_window_factor": 1})
    with SelfPlay(cfg, tmp_path / "run", policy=load_policy("tiny")) as sp:
        m0, m1 = sp.run()
        state = sp.curriculum.state_dict()
        assert m0["agent_episodes"] == 4 and m0["pool_baseline"] == 2
        assert m1["rlve/plays"] == 4 and "rlve/mean_upper_bound" in m1
        rows = sp.store.environments()
        assert len(rows) == 4 and all(r["source"].startswith("rlve:") for r in rows)
        episode = sp.store.get_episode(sp.store.episode_ids()[0])
        assert episode["messages"][1]["content"]  # the problem the agent saw
    cfg1 = config(tmp_path, "rlve", rounds=1, **{"curriculum.rlve_envs": envs,
                                                 "curriculum.rlve_window_factor": 1})
    with SelfPlay(cfg1, tmp_path / "run", policy=load_policy("tiny"), resume=True) as sp:
        assert sp.curriculum.state_dict() == state
        sp.run()
    with pytest.raises(ConfigError, match="games"):
        SelfPlay(config(tmp_path, "rlve", setting="tooluse"), tmp_path / "bad",
                 policy=load_policy("tiny"))


def test_in_loop_evaluation_is_logged_and_the_checkpoint_evaluates(tmp_path):
    from spadekit.eval.compare import read_results
    from spadekit.eval.models import load_eval_policy
    from spadekit.selfplay.loop import SelfPlay

    cfg = config(tmp_path, "fixed", rounds=2, **{
        "curriculum.pool": "library:games", "eval.every": 2,
        "eval.suites": f'["qa:{DATA / "qa_math.jsonl"}"]', "eval.limit": 1,
        "eval.max_new_tokens": 4})
    policy = load_policy("tiny")
    with SelfPlay(cfg, tmp_path / "run", policy=policy) as sp:
        m0, m1 = sp.run()
        assert not any(k.startswith("eval/") for k in m0)
        assert 0.0 <= m1["eval/qa:qa_math/win_rate"] <= 1.0
        assert "eval/qa:qa_math/algebra/win_rate" in m1
        logged = dict(sp.store.query("SELECT name, value FROM metrics WHERE step = 1"))
        assert "eval/qa:qa_math/win_rate" in logged
    data = read_results(tmp_path / "run" / "evals" / "step-1.json")
    assert list(data["suites"]) == [f"qa:{DATA / 'qa_math.jsonl'}"]

    loaded, label = load_eval_policy(str(tmp_path / "run"))
    assert label == "run@step-1"
    trained = policy.model.state_dict()
    for key, value in loaded.model.state_dict().items():
        assert value.equal(trained[key]), key


def test_train_fixed_command(tmp_path):
    from typer.testing import CliRunner

    from spadekit.cli.app import app

    runner = CliRunner()
    small = ["--set", "envs_per_round=1", "--set", "num_generations=2", "--set",
             "rollout.max_turns=1", "--set", "rollout.max_new_tokens=4", "--set",
             "tensorboard=false"]
    bad = runner.invoke(app, ["train-fixed", "--pool", str(tmp_path / "nowhere"), "--model",
                              "tiny", "--run-dir", str(tmp_path / "bad")] + small)
    assert bad.exit_code == 2 and "not an environment source" in bad.output
    assert not (tmp_path / "bad").exists()  # nothing left behind
    run = tmp_path / "run"
    ok = runner.invoke(app, ["train-fixed", "--pool", "library:games", "--model", "tiny",
                             "--rounds", "1", "--run-dir", str(run)] + small)
    assert ok.exit_code == 0, ok.output
    assert "fixed curriculum" in ok.output and "(baseline)" in ok.output
    assert "kind: fixed" in (run / "config.yaml").read_text()
    unknown = runner.invoke(app, ["selfplay", "--curriculum", "nope", "--model", "tiny",
                                  "--run-dir", str(tmp_path / "x")])
    assert unknown.exit_code == 2
