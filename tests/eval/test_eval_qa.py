"""QASuite: JSONL loading and validation, gold/garbage scoring, limits, escape repair, AnswerEnv."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from spadekit.eval.base import EvalError, EvalItem
from spadekit.eval.qa import MAX_ANSWER_CHARS, QASuite, repair_escapes

DATA = Path(__file__).parents[1] / "data"
MATH = DATA / "qa_math.jsonl"
CHOICE = DATA / "qa_choice.jsonl"


def items_by_id(path: Path) -> dict[str, EvalItem]:
    return {item.id: item for item in QASuite(path).load_items()}


def write(tmp_path: Path, *lines: str, name: str = "set.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- loading ------------------------------------------------------------------------------------

def test_suite_identity_and_defaults():
    suite = QASuite(MATH)
    assert suite.name == f"qa:{MATH}"
    assert (suite.defaults.k, suite.defaults.temperature, suite.defaults.top_p) == (32, 0.6, 0.95)
    assert suite.defaults.max_new_tokens == 8192 and suite.defaults.max_turns == 1
    assert "<answer>" in suite.defaults.system_prompt


def test_math_items_in_file_order_with_ids_datasets_and_alias():
    items = QASuite(MATH).load_items()
    assert [i.id for i in items] == ["divisors", "marbles", "height", "angle", "dice", "roots",
                                     "linear"]
    first = items[0]
    assert first.prompt == "Find the number of positive divisors of $360$."  # 'problem' alias
    assert first.answer == "24" and first.dataset == first.group == "qa_math"
    assert first.data == {"kind": "math", "line": 1}
    assert items[2].data["line"] == 4  # the blank line 3 is skipped but still counted
    assert {i.dataset for i in items[-2:]} == {"algebra"}
    assert QASuite(MATH).groups() == {"qa_math": "qa_math", "algebra": "algebra"}
    json.dumps([i.to_dict() for i in items])  # JSON-safe


def test_choice_items_prompt_and_answer_forms():
    items = QASuite(CHOICE).load_items()
    assert [i.answer for i in items] == ["C", "A", "B", "D"]  # letter, index 0, text, letter
    assert items[3].id == "qa_choice/4" and items[3].dataset == "geometry"
    prompt = items[0].prompt
    assert prompt.startswith("Which of these numbers is prime?\n")
    assert "A) 21\nB) 27\nC) 29\nD) 33" in prompt and "letter" in prompt
    assert items[0].data["kind"] == "choice"
    assert items[0].data["choices"] == ["21", "27", "29", "33"]


def test_limit_is_per_dataset(tmp_path):
    assert [i.id for i in QASuite(MATH).load_items(limit=1)] == ["divisors", "roots"]
    assert [i.id for i in QASuite(MATH).load_items(limit=2)] == ["divisors", "marbles", "roots",
                                                                  "linear"]
    assert QASuite(MATH).load_items(limit=0) == []
    assert len(QASuite(MATH).load_items(limit=100)) == 7
    with pytest.raises(EvalError):
        QASuite(MATH).load_items(limit=-1)


def test_form_feed_and_backspace_repair(tmp_path):
    assert repair_escapes("\x0crac{1}{2} + \x08inom{4}{2}") == "\\frac{1}{2} + \\binom{4}{2}"
    dice = items_by_id(MATH)["dice"]  # the fixture line writes \frac unescaped in JSON
    assert dice.answer == "\\frac{1}{6}" and "\\frac{a}{b}" in dice.prompt
    assert "\x0c" not in dice.prompt
    path = write(tmp_path, r'{"question": "Compute \binom{4}{2}.", "answer": "6"}',
                 r'{"question": "Pick \frac{1}{2}", "choices": ["\frac{1}{2}", "1"], '
                 r'"answer": "\frac{1}{2}"}')
    binom, half = QASuite(path).load_items()
    assert binom.prompt == "Compute \\binom{4}{2}." and half.data["choices"][0] == "\\frac{1}{2}"
    assert half.answer == "A"


BAD_LINES = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"answer": "3"}', "question"),
    ('{"question": "  ", "answer": "3"}', "question"),
    ('{"question": "q"}', "answer"),
    ('{"question": "q", "answer": null}', "answer"),
    ('{"question": "q", "answer": ""}', "empty"),
    ('{"question": "q", "answer": true}', "string or a number"),
    ('{"question": "q", "answer": "}"}', "cannot parse"),
    ('{"question": "q", "choices": [], "answer": "A"}', "non-empty list"),
    ('{"question": "q", "choices": "AB", "answer": "A"}', "non-empty list"),
    ('{"question": "q", "choices": ["x", "y"], "answer": "C"}', "out of range"),
    ('{"question": "q", "choices": ["x", "y"], "answer": 2}', "out of range"),
    ('{"question": "q", "choices": ["x", "y"], "answer": "w"}', "out of range"),
    ('{"question": "q", "choices": ["x", "y"], "answer": "neither"}', "not a letter"),
    ('{"question": "q", "choices": ["x", "X "], "answer": "A"}', "distinct"),
    ('{"question": "q", "choices": ["x", ["y"]], "answer": "A"}', "string or a number"),
    ('{"question": "q", "answer": "3", "id": ""}', "'id'"),
    ('{"question": "q", "answer": "3", "dataset": 7}', "'dataset'"),
]


@pytest.mark.parametrize("line,fragment", BAD_LINES)
def test_malformed_line_names_file_and_line(tmp_path, line, fragment):
    path = write(tmp_path, '{"question": "ok", "answer": 1}', "", line)
    with pytest.raises(EvalError) as info:
        QASuite(path).load_items()
    message = str(info.value)
    assert "line 3" in message and str(path) in message and fragment in message
    assert info.value.details["line"] == 3


def test_bad_line_past_the_limit_still_fails(tmp_path):
    path = write(tmp_path, '{"question": "a", "answer": 1}', '{"question": "b"}')
    with pytest.raises(EvalError, match="line 2"):
        QASuite(path).load_items(limit=1)


def test_duplicate_ids(tmp_path):
    path = write(tmp_path, '{"id": "x", "question": "a", "answer": 1}',
                 '{"id": "x", "question": "b", "answer": 2}')
    with pytest.raises(EvalError, match=r"line 2: duplicate id 'x' \(first on line 1\)"):
        QASuite(path).load_items()


def test_missing_empty_and_undecodable_files(tmp_path):
    with pytest.raises(EvalError, match="cannot read"):
        QASuite(tmp_path / "nope.jsonl").load_items()
    with pytest.raises(EvalError, match="no items"):
        QASuite(write(tmp_path, "", "  ")).load_items()
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(EvalError, match="cannot read"):
        QASuite(binary).load_items()


# -- scoring ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [MATH, CHOICE])
def test_gold_completion_scores_one_everywhere(path):
    suite = QASuite(path)
    for item in suite.load_items():
        assert suite.score(item, suite.gold_completion(item)) == 1.0, item.id


@pytest.mark.parametrize("item_id,reply", [
    ("marbles", "so it is \\boxed{0.75}"),
    ("marbles", "<answer>3/4</answer>"),
    ("marbles", "<answer>$\\dfrac{3}{4}$</answer>"),
    ("angle", "<answer>70.0</answer>"),
    ("angle", "<answer>70^\\circ</answer>"),
    ("angle", "<answer>\\boxed{70}</answer>"),
    ("height", "<answer>\\sqrt{12}</answer>"),
    ("linear", "<answer>x = -0.5</answer>"),
    ("divisors", "<answer>20</answer> no wait, <ANSWER>24</ANSWER>"),
    ("divisors", "<answer>24</answer>" + "x" * 50_000),
])
def test_equivalent_math_forms_score_one(item_id, reply):
    suite = QASuite(MATH)
    assert suite.score(items_by_id(MATH)[item_id], reply) == 1.0


GARBAGE = [None, "", "   ", {"answer": "70"}, ["<answer>70</answer>"], 70, b"<answer>70</answer>",
           "x" * 100_000, "<answer>" * 12_500, "\\boxed{" * 14_000,
           "<answer>" + "7" * (MAX_ANSWER_CHARS + 1) + "</answer>"]


@pytest.mark.parametrize("reply", GARBAGE + [
    "<answer>71</answer>",
    "The third angle is 70.",                      # right number, but untagged
    "<answer>70 or 71</answer>",                  # hedged
    "<answer></answer>",
    "<answer>70</answer> actually <answer>71</answer>",
    "\\boxed{70",                                  # unclosed box
    "<answer>The answer is 70</answer>",
])
def test_math_garbage_scores_zero(reply):
    suite = QASuite(MATH)
    assert suite.score(items_by_id(MATH)["angle"], reply) == 0.0


@pytest.mark.parametrize("reply", [
    "<answer>C</answer>", "\\boxed{C}", "<answer>(C)</answer>", "<answer>C)</answer>",
    "<answer>C.</answer>", "<answer>C) 29</answer>", "<answer>(C) 29.</answer>",
    "<answer>29</answer>", "\\boxed{\\text{C}}", "<answer>**C**</answer>",
    "I considered A) and B). <answer>C</answer>",
])
def test_choice_accepted_forms(reply):
    suite = QASuite(CHOICE)
    assert suite.score(items_by_id(CHOICE)["prime"], reply) == 1.0


@pytest.mark.parametrize("reply", GARBAGE + [
    "<answer>B</answer>", "<answer>c</answer>", "<answer>C, D</answer>", "<answer>C or D</answer>",
    "<answer>CD</answer>", "<answer>C) 27</answer>", "<answer>E</answer>", "<answer>27</answer>",
    "The answer is (C).", "C", "<answer>The answer is C</answer>", "<answer>C) and D)</answer>",
])
def test_choice_garbage_scores_zero(reply):
    suite = QASuite(CHOICE)
    assert suite.score(items_by_id(CHOICE)["prime"], reply) == 0.0


def test_unknown_kind_and_scoring_speed():
    suite = QASuite(MATH)
    assert suite.score(EvalItem("z", "d", "d", "q", answer="1", data={}), "<answer>1</answer>") == 0
    item = items_by_id(MATH)["angle"]
    start = time.monotonic()
    for reply in GARBAGE:
        suite.score(item, reply)
    assert time.monotonic() - start < 5.0


def test_scoring_works_outside_the_main_thread():
    """math-verify's signal-based timeout cannot run in a worker thread; scoring must not fail."""
    suite = QASuite(MATH)
    item = items_by_id(MATH)["height"]
    results = []
    worker = threading.Thread(target=lambda: results.extend(
        [suite.score(item, "<answer>2\\sqrt{3}</answer>"),
         suite.score(item, "<answer>\\sqrt{13}</answer>")]))
    worker.start()
    worker.join(30)
    assert results == [1.0, 0.0]


def test_answer_env_rewards_gold():
    suite = QASuite(CHOICE)
    item = suite.load_items()[2]
    env = suite.make_env(item)
    obs, info = env.reset(seed=0)
    assert obs == item.prompt and info["max_turns"] == 1
    _, reward, terminated, truncated, info = env.step(suite.gold_completion(item))
    assert (reward, terminated, truncated) == (1.0, True, False)
    env = QASuite(MATH).make_env(items_by_id(MATH)["angle"], max_turns=2)
    env.reset()
    obs, reward, terminated, _, _ = env.step("<answer>71</answer>")
    assert reward == 0.0 and not terminated and "not correct" in obs
    _, reward, terminated, _, _ = env.step("<answer>70</answer>")
    assert reward == 1.0 and terminated
