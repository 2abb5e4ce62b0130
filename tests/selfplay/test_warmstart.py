"""The warm start from a pool (issue 23): `spadekit procedural` writes a validated pool with its
held-out split, `spadekit warmstart` builds designer and agent examples from it (the loop's own
prompt and extractor format; solutions played through the real sandbox by the rollout engine),
trains the tiny model and exports a model that `--model hf:OUT/model` loads."""

from __future__ import annotations

import json
import random

from typer.testing import CliRunner

from spadekit.cli.app import app
from spadekit.envs.extract import extract_program
from spadekit.envs.procedural import Combo, compose, surface_words
from spadekit.policy.registry import load_policy
from spadekit.selfplay.config import load_config
from spadekit.selfplay.warmstart import agent_examples, designer_completion, designer_examples


def _program(seed=0):
    words = surface_words("copper wires carry current through the old station", random.Random(1))
    return compose(Combo("number", "reveal", "exact", "gated"), words, seed)


def test_the_designer_completion_is_what_the_loop_extracts():
    program = _program()
    got = extract_program(designer_completion(program))
    assert got.code.strip() == program.code.strip()
    assert got.hint == program.hint


def test_examples_use_the_loops_prompt_and_the_sandboxed_solution(tmp_path):
    from spadekit.sandbox import SandboxPool

    cfg = load_config("cpu-warm", None, ["model=tiny"])
    policy = load_policy("tiny")
    tok = policy.tokenizer
    program = _program()
    docs = {"d": "some grounding text"}
    [(_i, designer)] = designer_examples(policy, cfg, [program], docs, random.Random(0))
    start = designer.loss_mask.index(1)
    prompt = tok.decode(designer.token_ids[:start])
    assert "You are the Environment Designer" in prompt and "Mathematical_Reasoning" in prompt
    assert "Theme words from a document: grounding, text." in prompt  # compact: no stop words
    assert tok.decode(designer.token_ids[start:]).startswith("```python\n# Design: hidden ")
    # the paper's prompt and hint call: the document itself, and the hint as its own example
    full = load_config("cpu-warm", None, ["model=tiny", "designer.prompt_style=full",
                                          "designer.hint_mode=second_call"])
    [(_a, paper), (_b, hint)] = designer_examples(policy, full, [program], docs,
                                                  random.Random(0))
    assert "some grounding text" in tok.decode(paper.token_ids)
    assert "Program contract" in tok.decode(paper.token_ids)
    assert hint.kind == "hint" and tok.decode(
        [t for t, m in zip(hint.token_ids, hint.loss_mask) if m]).startswith("HINT: ")
    with SandboxPool(cfg.sandbox, warm=0) as pool:
        pairs = agent_examples(policy, cfg, pool, [program], 2, random.Random(0))
    assert [i for i, _e in pairs] == [0, 0]
    ns: dict = {}
    exec(compile(program.code, "<procedural>", "exec"), ns)
    env = ns[program.class_name]()
    env.reset(seed=0)
    look, answer = (a[len("\\boxed{"):] for a in env.solution())
    for _i, ex in pairs:
        replies = tok.decode([t for t, m in zip(ex.token_ids, ex.loss_mask) if m])
        # the response prefix "\boxed{" is a prompt token: the replies are the rest
        assert replies.startswith(look) and answer.split()[0] in replies
        assert "\\boxed{" + look in tok.decode(ex.token_ids)


def test_procedural_then_warmstart_on_the_command_line(tmp_path):
    pool, out = tmp_path / "pool", tmp_path / "warm"
    res = CliRunner().invoke(app, ["procedural", "--out", str(pool), "--limit", "4",
                                   "--seed", "3"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["kept"] + summary["invalid"] + summary["near_duplicates"] == 4
    assert summary["written"] == summary["kept"] >= 3
    split = json.loads((pool / "split.json").read_text())
    assert split["train"] and not any(k.endswith("+gated") for k in split["train"])
    assert sum(k.endswith("+gated") for k in split["held_out"]) == 60  # 5 x 3 x 4
    assert not set(split["train"]) & set(split["held_out"])
    res = CliRunner().invoke(app, ["warmstart", "--pool", str(pool), "--out", str(out),
                                   "--model", "tiny", "--epochs", "1", "--lora-r", "4",
                                   "--max-tokens", "16384", "--seeds-per-program", "1",
                                   "--held-out-share", "0.25"])
    assert res.exit_code == 0, res.output
    assert "spadekit selfplay --model hf:" in res.output
    record = json.loads((out / "warmstart.json").read_text())
    counts = record["counts"]
    assert counts["programs"] == summary["kept"] and counts["held_out_programs"] == 1
    assert counts["agent_examples"] == counts["programs"]  # every solution won
    assert record["history"][0]["held_out_loss"] is not None
    loaded = load_policy(f"hf:{out / 'model'}")
    assert loaded.tokenizer is not None
