"""The evaluation runner, result files, comparison and the ``spadekit eval`` command.

Scores are checked against hand counts with a scripted policy (known replies); the real tiny
model then runs real Reasoning Gym and BFCL items end to end through the same path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spadekit.eval import EvalError, make_suite
from spadekit.eval.base import AnswerEnv, EvalItem, Suite, SuiteDefaults, final_answer, safe_score
from spadekit.eval.compare import compare, head_to_head, read_results, results_file
from spadekit.eval.runner import EvalSettings, aggregate, run_suite, sample_seed
from spadekit.policy.registry import load_policy
from spadekit.policy.scripted import ScriptedPolicy

DATA = Path(__file__).resolve().parents[1] / "data"


class SumSuite(Suite):
    """Six sums in two groups; the answer is the number inside <answer> tags."""

    name = "sums"
    defaults = SuiteDefaults(k=1, temperature=1.0, max_new_tokens=32, max_turns=1,
                             system_prompt="Add.")

    def __init__(self, broken: set[str] = frozenset()):
        self.broken = broken

    def load_items(self, limit=None):
        items = []
        for i in range(6):
            group = "small" if i < 3 else "large"
            a, b = (i, i + 1) if i < 3 else (100 * i, 7)
            items.append(EvalItem(id=f"s{i}", dataset=f"d{i % 2}", group=group,
                                  prompt=f"What is {a}+{b}?", answer=a + b))
        return items[:limit] if limit else items

    def score(self, item, completion):
        return safe_score(lambda: float(final_answer(completion) == str(item.answer)))

    def make_env(self, item, max_turns=None):
        if item.id in self.broken:
            raise RuntimeError("this environment cannot be built")
        return super().make_env(item, max_turns)


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny", seed=0)


def adder(tokenizer, wrong_first: bool = False, wrong_for: set[int] = frozenset()):
    """Replies with the right sum, except for first attempts (``wrong_first``) and sums whose
    first operand is in ``wrong_for``."""
    def respond(_ids, text):
        a, b = map(int, re.findall(r"What is (\d+)\+(\d+)\?", text)[-1])
        if a in wrong_for or (wrong_first and "not correct" not in text):
            return "<answer>-1</answer>"
        return f"Sum: <answer>{a + b}</answer>"
    return ScriptedPolicy(tokenizer, respond)


def test_scores_and_summary_match_a_hand_count(tiny):
    policy = adder(tiny.tokenizer, wrong_for={0, 300})  # s0 and s3 wrong
    result = run_suite(policy, SumSuite(), EvalSettings(k=3))
    rows = {r["id"]: r for r in result["items"]}
    assert rows["s0"]["scores"] == [0.0, 0.0, 0.0] and rows["s1"]["scores"] == [1.0] * 3
    overall = result["summary"]["overall"]
    assert overall["items"] == 6 and overall["samples"] == 18
    assert overall["win_rate"] == pytest.approx(4 / 6)
    assert overall["pass_rate"] == pytest.approx(4 / 6)
    assert result["summary"]["groups"]["small"]["win_rate"] == pytest.approx(2 / 3)
    assert result["summary"]["datasets"]["d1"]["win_rate"] == pytest.approx(2 / 3)  # s1 s3 s5
    assert result["settings"]["k"] == 3 and result["settings"]["temperature"] == 1.0
    assert rows["s1"]["samples"][0]["reply"].endswith("<answer>3</answer>")
    json.dumps(result)  # JSON-safe


def test_second_turn_after_feedback_counts_only_when_allowed(tiny):
    policy = adder(tiny.tokenizer, wrong_first=True)
    one = run_suite(policy, SumSuite(), EvalSettings(limit=2))
    two = run_suite(policy, SumSuite(), EvalSettings(limit=2, max_turns=2))
    assert one["summary"]["overall"]["win_rate"] == 0.0
    assert two["summary"]["overall"]["win_rate"] == 1.0
    assert {s["turns"] for r in two["items"] for s in r["samples"]} == {2}


def test_a_broken_item_is_a_failure_not_an_exception(tiny):
    result = run_suite(adder(tiny.tokenizer), SumSuite(broken={"s2"}), EvalSettings())
    rows = {r["id"]: r for r in result["items"]}
    assert rows["s2"]["scores"] == [0.0] and rows["s2"]["failures"] == 1
    assert rows["s2"]["samples"][0]["failure"] == "env_raised"
    assert result["summary"]["overall"]["failures"] == 1
    assert result["summary"]["overall"]["win_rate"] == pytest.approx(5 / 6)


def test_answer_env_contract():
    env = AnswerEnv("q?", lambda text: 1.0 if "yes" in text else 0.25, max_turns=2)
    assert env.reset(seed=3) == ("q?", {"max_turns": 2})
    obs, reward, term, trunc, info = env.step("no")
    assert (reward, term, trunc) == (0.25, False, False) and "not correct" in obs
    assert env.step("no")[1:4] == (0.25, True, False)
    env.reset()
    assert env.step("yes")[1:3] == (1.0, True)
    raising = AnswerEnv("q", lambda text: 1 / 0)
    assert raising.reset()[0] == "q" and raising.step("x")[1:3] == (0.0, True)
    assert safe_score(lambda: float("nan")) == 0.0 and safe_score(lambda: 7) == 1.0


def test_seeds_are_stable_and_distinct():
    assert sample_seed(0, "a", 0) == sample_seed(0, "a", 0)
    assert len({sample_seed(0, "a", j) for j in range(50)}) == 50
    assert sample_seed(1, "a", 0) != sample_seed(0, "a", 0)


def _result(scores: dict[str, list[float]], suite="sums") -> dict:
    items = [{"id": i, "dataset": "d", "group": "g" if i < "c" else "h", "scores": s,
              "mean_score": sum(s) / len(s), "win_rate": sum(x >= 1 for x in s) / len(s),
              "failures": 0} for i, s in scores.items()]
    return {"format": "spadekit-eval/1", "suite": suite, "items": items}


def test_compare_and_head_to_head_by_hand():
    a = results_file("A", [_result({"a": [1, 0], "b": [0, 0], "c": [1, 1], "d": [0.5, 0.5]})])
    b = results_file("B", [_result({"a": [1, 1], "b": [0, 0], "c": [0, 1], "e": [1, 1]})])
    h = head_to_head(a["suites"]["sums"]["items"], b["suites"]["sums"]["items"])
    # common a, b, c: B better on a, tie on b, A better on c
    assert h == {"items": 3, "a_better": 1, "b_better": 1, "ties": 1, "b_win_rate": 0.5}
    rows = compare(a, b)
    overall = rows[0]
    assert overall["name"] == "overall" and overall["a_items"] == 4 and overall["b_items"] == 4
    assert overall["a_win_rate"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert overall["b_win_rate"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert overall["delta_win_rate"] == pytest.approx(overall["b_win_rate"]
                                                      - overall["a_win_rate"])
    assert [r["name"] for r in rows] == ["overall", "g", "h"]
    assert aggregate([])["items"] == 0


def test_result_files_are_checked(tmp_path):
    with pytest.raises(EvalError, match="no such"):
        read_results(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EvalError, match="not a readable"):
        read_results(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(EvalError, match="not a spadekit eval"):
        read_results(bad)


def test_suite_registry_errors():
    with pytest.raises(EvalError, match="unknown suite"):
        make_suite("nope")
    with pytest.raises(EvalError, match="needs an argument"):
        make_suite("qa")
    with pytest.raises(EvalError):
        make_suite("")
    picked = make_suite("rg-easy:basic_arithmetic,gcd")
    assert {i.dataset for i in picked.load_items(1)} == {"basic_arithmetic", "gcd"}
    with pytest.raises(EvalError, match="not in the Reasoning Gym config"):
        make_suite("rg-hard:no_such_dataset")
    with pytest.raises(EvalError, match="k, max_turns"):
        EvalSettings(k=0).resolve(SumSuite())


def test_tiny_model_runs_reasoning_gym_items_end_to_end(tiny):
    from spadekit.eval.rg import ReasoningGymSuite

    suite = ReasoningGymSuite(level="hard", datasets=["basic_arithmetic", "knights_knaves",
                                                      "game_of_life_halting"])
    result = run_suite(tiny, suite, EvalSettings(limit=2, k=2, max_new_tokens=8, max_turns=2))
    assert result["summary"]["overall"]["items"] == 6
    assert result["summary"]["overall"]["samples"] == 12
    for row in result["items"]:
        assert all(0.0 <= s <= 1.0 for s in row["scores"])
        assert all(s["failure"] is None for s in row["samples"])
        assert all(1 <= s["turns"] <= 2 for s in row["samples"])
    assert set(result["summary"]["groups"]) >= {"RG-Math", "RG-Logic"}


def test_tiny_model_plays_bfcl_items_end_to_end(tiny):
    suite = make_suite("bfcl-mt:base")
    # the byte-level tiny model spends one token per character of the tool schemas
    result = run_suite(tiny, suite, EvalSettings(limit=1, max_new_tokens=12, max_turns=8,
                                                 max_context_tokens=40000))
    assert result["summary"]["overall"]["items"] == 1
    sample = result["items"][0]["samples"][0]
    assert sample["failure"] is None and sample["stop_reason"] == "terminated"
    assert sample["turns"] >= 4  # every user request was shown (replies had no tool calls)
    assert result["items"][0]["scores"] == [0.0]  # random bytes never satisfy the checker


def test_cli_eval_writes_results_and_compares(tmp_path):
    from spadekit.cli.app import app

    runner = CliRunner()
    out = tmp_path / "a.json"
    args = ["eval", "--model", "tiny", "--suite", f"qa:{DATA / 'qa_math.jsonl'}", "--limit", "1",
            "-k", "2", "--max-new-tokens", "6", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = read_results(out)
    assert not list(tmp_path.glob("*.partial.jsonl"))  # journals go once the file is written
    (result,) = data["suites"].values()
    assert result["settings"]["k"] == 2 and all(len(r["scores"]) == 2 for r in result["items"])
    res = runner.invoke(app, ["eval", "compare", str(out), str(out), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert rows[0]["delta_win_rate"] == 0 and rows[0]["head_to_head"]["ties"] == \
        rows[0]["a_items"]
    assert runner.invoke(app, ["eval", "compare", str(out), str(tmp_path / "x.json")]
                         ).exit_code == 2
    assert runner.invoke(app, ["eval", "--model", "tiny"]).exit_code == 2
    assert runner.invoke(app, ["eval", "--model", "tiny", "--suite", "nope"]).exit_code == 2
    assert runner.invoke(app, ["eval", "suites"]).exit_code == 0


def test_envs_suite_plays_programs_in_the_sandbox(tiny, pool, tmp_path):
    from spadekit.envs.program import EnvProgram
    from spadekit.eval.envs import EnvPoolSuite
    from test_selfplay import CONSTANT, WORDS

    folder = tmp_path / "pool"
    folder.mkdir()
    with open(folder / "pool.jsonl", "w") as fh:
        for i, code in enumerate([CONSTANT, *WORDS[1:3]]):
            program = EnvProgram(code=code, skill=f"skill{i % 2}", domain="games")
            fh.write(json.dumps(program.to_dict()) + "\n")
    suite = make_suite(f"envs:{folder}")
    assert isinstance(suite, EnvPoolSuite) and suite.screen(pool, 25) == []  # all three valid
    assert len(suite.load_items()) == 3
    assert len(suite.load_items(limit=1)) == 2  # one per skill
    def gold(_ids, text):
        return "\\boxed{solve}"

    result = run_suite(ScriptedPolicy(tiny.tokenizer, gold), suite, EvalSettings(k=2),
                       pool=pool)
    rows = {r["group"]: r for r in result["items"]}
    solved = [r for r in result["items"] if r["scores"] == [1.0, 1.0]]
    assert len(solved) == 1  # only the program whose word is always "solve"
    others = [r for r in result["items"] if r not in solved]
    assert all(0.0 < s < 1.0 for r in others for s in r["scores"])  # letters score partially
    assert result["summary"]["overall"]["any_credit_rate"] == 1.0
    assert set(rows) == {"skill0", "skill1"}
    garbage = run_suite(ScriptedPolicy(tiny.tokenizer, lambda *_: "}}{{"), suite,
                        EvalSettings(k=1), pool=pool)
    assert garbage["summary"]["overall"]["win_rate"] == 0.0
    assert suite.score(suite.load_items()[0], None) == 0.0
    assert suite.score(suite.load_items()[0], float("nan")) == 0.0
    with pytest.raises(ValueError, match="SandboxPool"):
        run_suite(tiny, suite, EvalSettings(k=1), pool=None)


def test_an_interrupted_evaluation_resumes_from_its_journal(tiny, tmp_path):
    journal = tmp_path / "out.json.0.partial.jsonl"
    calls = {"n": 0}
    base = adder(tiny.tokenizer, wrong_for={1})

    def dying(ids, text):
        calls["n"] += 1
        if calls["n"] > 4:
            raise KeyboardInterrupt  # the process is stopped in the middle of batch 3
        return base.respond(ids, text)

    settings = EvalSettings(k=2, batch_size=4)
    with pytest.raises(KeyboardInterrupt):
        run_suite(ScriptedPolicy(tiny.tokenizer, dying), SumSuite(), settings, journal=journal,
                  model_label="m")
    assert len(journal.read_text().splitlines()) == 1 + 4  # header + the finished batch
    with open(journal, "a") as fh:
        fh.write('{"item": "s5", "sam')  # a torn last line
    fresh = adder(tiny.tokenizer, wrong_for={1})
    result = run_suite(fresh, SumSuite(), settings, journal=journal, model_label="m")
    assert result["resumed_samples"] == 4 and fresh.calls == 12 - 4
    # the torn line went to .partial before anything was appended: every line parses and a
    # third run finds all 12 samples (a record glued to the torn line would be lost)
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 12 and all(json.loads(line) for line in lines)
    assert (tmp_path / (journal.name + ".partial")).read_text() == '{"item": "s5", "sam\n'
    again = adder(tiny.tokenizer, wrong_for={1})
    assert run_suite(again, SumSuite(), settings, journal=journal,
                     model_label="m")["resumed_samples"] == 12 and again.calls == 0
    straight = run_suite(adder(tiny.tokenizer, wrong_for={1}), SumSuite(), settings,
                         model_label="m")
    assert [r["scores"] for r in result["items"]] == [r["scores"] for r in straight["items"]]
    other = run_suite(adder(tiny.tokenizer), SumSuite(), EvalSettings(k=1), journal=journal,
                      model_label="m")
    assert other["resumed_samples"] == 0  # different settings: the old journal moved aside
    assert (tmp_path / "out.json.0.partial.jsonl.stale").exists()
