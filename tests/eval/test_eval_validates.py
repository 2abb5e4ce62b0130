"""An ``envs:`` evaluation plays only programs that pass self-play's validator (issue 25, item 6).

A hostile folder (a program with ``max_turns = -1`` that pays any reply, one whose ``reset``
raises, one whose ``solution()`` loses, and one honest game) goes through the real
``spadekit eval`` command with the tiny model: only the honest program is scored, the others are
listed apart as invalid with the validator's reasons, in the JSON and on the terminal.
``--trusted`` plays everything; the in-loop evaluation of a self-play run screens the same way.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from spadekit.envs.refimport import programs_from_dir
from spadekit.eval import EvalError, make_suite
from spadekit.eval.compare import read_results
from validate_cases import GUESS, GUESS_WRONG_SOLUTION

PAYS_GARBAGE = r'''
class PayEnv:
    """Whatever the reply, it wins; and it claims no turn cap."""

    max_turns = -1

    def __init__(self, max_turns=-1):
        self.max_turns = -1

    def reset(self, seed=None, options=None):
        return "Reply with anything inside \\boxed{}.", {}

    def step(self, action):
        return "Well done.", 1.0, True, False, {}

    def solution(self):
        return ["\\boxed{anything}"]
'''

RESET_RAISES = r'''
class BrokenEnv:
    """It cannot even start an episode."""

    def __init__(self, max_turns=12):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        raise RuntimeError("reset is broken")

    def step(self, action):
        return "never", 0.0, True, False, {}

    def solution(self):
        return ["\\boxed{1}"]
'''

FILES = {"pays_garbage.py": PAYS_GARBAGE, "reset_raises.py": RESET_RAISES,
         "solution_fails.py": GUESS_WRONG_SOLUTION, "honest.py": GUESS}
ARGS = ["-k", "1", "--max-new-tokens", "4", "--max-turns", "12", "--temperature", "1.0"]


def hostile_folder(root: Path, names=tuple(FILES)) -> tuple[Path, dict[str, str]]:
    """The folder and the item id (sha256[:16]) of each file's program."""
    folder = root / "hostile"
    folder.mkdir()
    for name in names:
        (folder / name).write_text(FILES[name])
    ids = {Path(p.meta["lineage"]["file"]).name: p.sha256[:16] for p in programs_from_dir(folder)}
    assert set(ids) == set(names)
    return folder, ids


def run_cli(*args: str):
    from spadekit.cli.app import app

    return CliRunner().invoke(app, ["eval", "--model", "tiny", *args],
                              env={"COLUMNS": "300"})  # whole table cells in the output


def test_cli_scores_only_the_validated_program_and_lists_the_others(tmp_path):
    folder, ids = hostile_folder(tmp_path)
    out = tmp_path / "result.json"
    res = run_cli("--suite", f"envs:{folder}", *ARGS, "--out", str(out))
    assert res.exit_code == 0, res.output
    (result,) = read_results(out)["suites"].values()
    assert [r["id"] for r in result["items"]] == [ids["honest.py"]]  # the only score
    assert result["summary"]["overall"]["items"] == 1
    invalid = {Path(r["program"]).name: r for r in result["invalid"]}
    assert set(invalid) == {"pays_garbage.py", "reset_raises.py", "solution_fails.py"}
    assert {r["id"] for r in result["invalid"]}.isdisjoint(r["id"] for r in result["items"])
    assert invalid["pays_garbage.py"]["reason"] == "action_independent"
    assert invalid["solution_fails.py"]["reason"] == "solution_fails"
    assert invalid["reset_raises.py"]["stage"] == "interface"
    assert "reset is broken" in invalid["reset_raises.py"]["message"]
    assert all(r["message"] and r["stage"] and r["reason"] for r in invalid.values())
    assert result["validation"] == {"trusted": False, "validated": True, "programs": 4,
                                    "valid": 1, "invalid": 3, "unchecked": 0}
    assert "invalid programs (not scored)" in res.output
    assert "3 program(s) failed validation" in res.output
    for name, row in invalid.items():  # every refused program on the terminal, with its reason
        line = next(t for t in res.output.splitlines() if name in t)
        assert row["reason"] in line and row["stage"] in line


def test_trusted_plays_every_program_unvalidated(tmp_path):
    folder, ids = hostile_folder(tmp_path, ("pays_garbage.py", "honest.py"))
    out = tmp_path / "trusted.json"
    res = run_cli("--suite", f"envs:{folder}", *ARGS, "--trusted", "--out", str(out))
    assert res.exit_code == 0, res.output
    (result,) = read_results(out)["suites"].values()
    scores = {r["id"]: r["scores"] for r in result["items"]}
    assert set(scores) == set(ids.values())
    assert scores[ids["pays_garbage.py"]] == [1.0]  # what an unvalidated folder reports
    assert result["invalid"] == [] and result["validation"]["trusted"] is True
    assert "--trusted" in run_cli("--help").output


def test_an_unscreened_suite_plays_nothing(tmp_path):
    from spadekit.eval.runner import EvalSettings, run_suite

    folder, _ids = hostile_folder(tmp_path, ("pays_garbage.py",))
    suite = make_suite(f"envs:{folder}")
    with pytest.raises(EvalError, match="not validated"):
        suite.load_items()
    with pytest.raises(EvalError, match="SandboxPool"):
        run_suite(object(), suite, EvalSettings(k=1))


def test_a_limit_validates_only_what_it_needs(tmp_path):
    from spadekit.sandbox import SandboxConfig, SandboxPool

    folder = tmp_path / "ordered"
    folder.mkdir()
    for name, code in (("a_pays.py", PAYS_GARBAGE), ("b_honest.py", GUESS),
                       ("c_broken.py", RESET_RAISES)):
        (folder / name).write_text(code)
    suite = make_suite(f"envs:{folder}")
    pool = SandboxPool(SandboxConfig(), warm=1)
    try:  # one item per skill wanted: the pair validated first holds it; c is never run
        invalid = suite.screen(pool, 12, limit=1)
    finally:
        pool.close()
    assert [Path(r["program"]).name for r in invalid] == ["a_pays.py"]
    assert [Path(i.prompt).name for i in suite.load_items(limit=1)] == ["b_honest.py"]
    assert suite.validation() == {"trusted": False, "validated": True, "programs": 3,
                                  "valid": 1, "invalid": 1, "unchecked": 1}


def test_in_loop_evaluation_plays_only_validated_programs(tmp_path):
    from spadekit.eval.inloop import evaluate_in_loop
    from spadekit.policy.registry import load_policy
    from spadekit.sandbox import SandboxConfig, SandboxPool
    from spadekit.selfplay.config import ValidationConfig

    folder, ids = hostile_folder(tmp_path)
    spec = f"envs:{folder}"
    (tmp_path / "run").mkdir()
    config = SimpleNamespace(
        eval=SimpleNamespace(k=1, temperature=1.0, max_new_tokens=4, max_turns=12, limit=None,
                             seed=0, suites=[spec]),
        rollout=SimpleNamespace(max_context_tokens=4096), validation=ValidationConfig())
    pool = SandboxPool(SandboxConfig(), warm=1)
    try:
        cache: dict = {}
        flat = evaluate_in_loop(load_policy("tiny", seed=0), pool, config, tmp_path / "run", 1,
                                cache)
    finally:
        pool.close()
    name = next(k for k in flat if k.endswith("/invalid")).rsplit("/", 1)[0]
    assert flat[f"{name}/invalid"] == 3
    (result,) = read_results(tmp_path / "run" / "evals" / "step-1.json")["suites"].values()
    assert [r["id"] for r in result["items"]] == [ids["honest.py"]]
    assert len(result["invalid"]) == 3


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.text(max_size=80))
def test_validation_seeds_are_stable_63_bit(seed, sha):
    from spadekit.eval.envs import validation_seed

    first = validation_seed(seed, sha)
    assert first == validation_seed(seed, sha) and 0 <= first < 2 ** 63


def test_progress_moves_as_each_episode_ends(tmp_path):
    """One batch holds every episode; the progress callback still hears of each as it ends
    (the one-turn wins first, then the guessing games), not once when the batch is done."""
    from spadekit.eval.runner import EvalSettings, run_suite
    from spadekit.policy import load_policy
    from spadekit.sandbox import SandboxConfig, SandboxPool

    folder, _ids = hostile_folder(tmp_path, ("pays_garbage.py", "honest.py"))
    suite = make_suite(f"envs:{folder}")
    suite.trusted = True  # as --trusted: both are played
    calls = []
    pool = SandboxPool(SandboxConfig(), warm=1)
    try:
        result = run_suite(load_policy("tiny"), suite, EvalSettings(
            k=3, max_new_tokens=4, max_turns=6, temperature=1.0, batch_size=64), pool=pool,
            on_progress=lambda done, total: calls.append((done, total)))
    finally:
        pool.close()
    assert calls == [(i, 6) for i in range(1, 7)]
    assert len(result["items"]) == 2
