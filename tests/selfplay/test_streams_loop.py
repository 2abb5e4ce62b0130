"""The loop's named random streams end to end: a run whose corpus is bigger draws other
documents for its designer prompts, and the same play seeds and spot-check seeds as before.
Real loop, real sandbox, the real tiny model; the designer is scripted, so the programs are
the same whatever the prompts say."""

from __future__ import annotations

import json
from pathlib import Path

from spadekit.common.streams import RoundStreams
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

from test_selfplay import WORDS, config


def _corpus(path: Path, n: int) -> Path:
    docs = [{"id": f"d{i}", "text": f"Document {i} about topic {i}: " + "word " * 40}
            for i in range(n)]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def _run(tmp: Path, corpus: Path) -> dict:
    """Two rounds; what the designer was shown and every episode the engine ran."""
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny")
    prompts, n = [], {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            return "HINT: Answer with one short lowercase word that names the goal."
        prompts.append(text)
        n["n"] += 1
        return f"```python\n{WORDS[(n['n'] - 1) % len(WORDS)]}\n```\nHINT: use letters."

    designer = ScriptedPolicy(policy.tokenizer, respond)
    ran = []
    with SelfPlay(config(tmp, rounds=2, corpus=str(corpus), **{"watch.spot_checks": 1}),
                  tmp / "run", policy=policy, designer_policy=designer) as sp:
        real = sp.engine.run

        def recording(specs):
            ran.extend((s.tag.get("env"), s.tag.get("probe") or ("hint" if s.tag.get(
                "with_hint") else "play"), s.seed) for s in specs)
            return real(specs)

        sp.engine.run = recording
        metrics = sp.run()
    return {"prompts": prompts, "metrics": metrics,
            "plays": sorted(r for r in ran if r[1] in ("play", "hint")),
            "spot_checks": sorted(r for r in ran if r[1] not in ("play", "hint"))}


def test_a_bigger_corpus_moves_the_documents_and_no_play_or_spot_check_seed(tmp_path):
    small = _corpus(tmp_path / "small.jsonl", 3)
    a = _run(tmp_path / "a", small)
    b = _run(tmp_path / "b", small)
    # the same input twice: everything the comparison below looks at is equal
    assert a["prompts"] == b["prompts"] and a["plays"] == b["plays"]
    assert a["spot_checks"] == b["spot_checks"]
    assert a["metrics"][0]["pooled"] == 2 and len(a["plays"]) >= 8
    assert {kind for _env, kind, _seed in a["spot_checks"]} >= {"garbage", "solution", "foreign"}
    big = _run(tmp_path / "c", _corpus(tmp_path / "big.jsonl", 50))
    assert big["prompts"] != a["prompts"]  # other documents were drawn ...
    assert big["plays"] == a["plays"]  # ... and not one play seed moved
    assert big["spot_checks"] == a["spot_checks"]  # nor any spot check's seed


def test_an_unset_stream_key_is_drawn_per_run_recorded_and_kept_on_resume(tmp_path):
    """The secret a program would need to compute its seeds: drawn for each new run (32 hex
    digits), written to config.yaml, read back by a resume."""
    import yaml

    from spadekit.selfplay.config import load_config
    from spadekit.selfplay.loop import SelfPlay

    base = config(tmp_path)
    cfg = load_config(preset=None, overrides=[
        *[f"{k}={v}" for k, v in (("model", "tiny"), ("bootstrap", "null"))]])
    assert base.stream_key == "tests" and cfg.stream_key is None
    keys = []
    for name in ("a", "b"):
        with SelfPlay(cfg, tmp_path / name, policy=load_policy("tiny")) as sp:
            keys.append(sp.config.stream_key)
        stored = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert stored["stream_key"] == keys[-1]
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys) and keys[0] != keys[1]
    with SelfPlay(cfg, tmp_path / "a", policy=load_policy("tiny"), resume=True) as sp:
        assert sp.config.stream_key == keys[0]
        assert sp._streams(0).get("play", "x").random() == \
            RoundStreams(cfg.seed, 0, keys[0]).get("play", "x").random()
