"""Tests for spadekit.envs.extract: finding a program and its hint in model answers."""

from __future__ import annotations

import pickle
import time

import pytest

from spadekit.envs.extract import REASONS, Extraction, ExtractionError, extract_program
from spadekit.envs.program import EnvProgram

ENV = '''\
import random


class GuessEnv:
    """Guess the secret number; feedback says higher or lower."""

    max_turns = 8

    def reset(self, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.rng.randint(1, 100)
        return "Guess a number between 1 and 100.", {}

    def step(self, action: str):
        try:
            guess = int(action.strip())
        except ValueError:
            return "Answer with an integer.", -0.1, False, False, {}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        direction = "higher" if guess < self.secret else "lower"
        return f"Wrong, go {direction}.", 0.0, False, False, {}

    def solution(self):
        return [str(self.secret)]
'''

TOOL_ENV = '''\
from spadekit.envs.tooluse import ToolEnv


class LedgerEnv(ToolEnv):
    max_turns = 12

    def tools(self):
        return {"add": "add(a, b) -> a + b"}

    def reset(self, seed=None, options=None):
        return "Sum the ledger.", {}

    def step(self, action):
        return "ok", 0.0, False, False, {}
'''


def fenced(code: str, tag: str = "python", fence: str = "```") -> str:
    return f"{fence}{tag}\n{code}{fence}\n"


def assert_env(result: Extraction, code: str = ENV, class_name: str = "GuessEnv") -> None:
    assert result.code == code
    assert result.class_name == class_name


# ---------------------------------------------------------------------------------------------
# fences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tag, method",
    [
        ("python", "fenced:python"),
        ("py", "fenced:python"),
        ("Python3", "fenced:python"),
        ("python3", "fenced:python"),
        ("", "fenced:untagged"),
        ("python title=guess_env.py", "fenced:python"),
        ("{.python}", "fenced:python"),
    ],
)
def test_fence_tags(tag, method):
    text = "Here is the environment you asked for:\n\n" + fenced(ENV, tag) + "\nEnjoy!\n"
    result = extract_program(text)
    assert_env(result)
    assert result.method == method
    assert result.hint is None
    assert result.notes == ()


def test_tilde_fence_and_long_backtick_fence():
    result = extract_program("Environment:\n~~~python\n" + ENV + "~~~\n")
    assert_env(result)
    assert result.method == "fenced:python"
    # a four-backtick fence may contain a three-backtick line (e.g. in a docstring)
    code = 'class DocEnv:\n    """Show:\n```\nexample\n```\n"""\n    def reset(self, seed=None, options=None):\n        return "", {}\n'
    result = extract_program("````python\n" + code + "````\n")
    assert result.code == code and result.class_name == "DocEnv"


def test_fences_with_trailing_spaces():
    text = "Sure.\n```python   \n" + ENV + "```   \n\nDone.\n"
    assert_env(extract_program(text))


def test_crlf_and_bom():
    text = "\ufeffHere you go:\r\n\r\n```python\r\n" + ENV.replace("\n", "\r\n") + "```\r\n\r\nHINT: Binary search.\r\n"
    result = extract_program(text)
    assert_env(result)
    assert "\r" not in result.code and "\ufeff" not in result.code
    assert result.hint == "Binary search."
    # old-Mac CR line endings too
    result = extract_program("```python\r" + ENV.replace("\n", "\r") + "```\r")
    assert_env(result)


def test_fence_indented_inside_list_item():
    indented = "".join(("   " + line if line else line) + "\n" for line in ENV.splitlines())
    text = (
        "Plan:\n\n"
        "1. Write the environment:\n\n"
        "   ```python\n" + indented + "   ```\n\n"
        "2. Provide a hint.\n\n"
        "   Hint: the feedback tells you which half the number is in.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.hint == "the feedback tells you which half the number is in."


def test_tab_indented_fence_keeps_code_indentation():
    text = "Steps:\n\t```python\n\t" + ENV.replace("\n", "\n\t").rstrip("\t") + "\t```\n"
    assert_env(extract_program(text))


def test_block_content_indented_more_than_fence_is_dedented():
    indented = "".join(("    " + line if line else line) + "\n" for line in ENV.splitlines())
    result = extract_program("```python\n" + indented + "```\n")
    assert_env(result)
    assert result.has_note("dedented")


def test_unterminated_final_fence():
    truncated = ENV.rsplit("    def solution", 1)[0]
    text = "I'll write the environment now.\n\n```python\n" + truncated
    result = extract_program(text)
    assert result.code == truncated.rstrip("\n") + "\n"
    assert result.class_name == "GuessEnv"
    assert result.has_note("unterminated_fence")
    assert not result.has_note("syntax_error")


def test_unterminated_fence_cut_mid_statement_still_returned():
    text = "```python\n" + ENV[: ENV.index("direction =") + len("direction = \"hig")]
    result = extract_program(text)
    assert result.class_name == "GuessEnv"
    assert result.has_note("unterminated_fence")
    assert result.has_note("syntax_error")


def test_unterminated_fence_followed_by_prose_hint():
    text = "```python\n" + ENV + "\nHINT: Halve the interval after every guess.\n"
    result = extract_program(text)
    assert_env(result)
    assert result.hint == "Halve the interval after every guess."
    assert result.has_note("trailing_text_trimmed")


# ---------------------------------------------------------------------------------------------
# several blocks
# ---------------------------------------------------------------------------------------------


def test_helper_block_env_block_usage_block():
    helper = "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"
    usage = "env = GuessEnv()\nobs, info = env.reset(seed=0)\nprint(obs)\nprint(env.step('50'))\n"
    tests = "def test_reset():\n    env = GuessEnv()\n    assert env.reset(seed=1)[0]\n"
    text = (
        "First a helper:\n\n" + fenced(helper) +
        "\nNow the environment:\n\n" + fenced(ENV) +
        "\nExample usage:\n\n" + fenced(usage) +
        "\nAnd a quick test:\n\n" + fenced(tests, "") +
        "\n**Hint:** Binary search finds the number in at most 7 guesses.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.method == "fenced:python"
    assert result.hint == "Binary search finds the number in at most 7 guesses."
    assert result.has_note("ignored_blocks")
    assert not result.has_note("multiple_env_blocks")


def test_two_env_defining_blocks_prefers_parsing_and_longest():
    draft = "class GuessEnv:\n    def reset(self, seed=None, options=None):\n        return '', {}\n"
    text = (
        "A first sketch:\n\n" + fenced(draft) +
        "\nAnd the full version:\n\n" + fenced(ENV) + "\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.has_note("multiple_env_blocks")
    # the longest wins even when it comes first
    text = "Full version:\n\n" + fenced(ENV) + "\nMinimal variant:\n\n" + fenced(draft)
    assert_env(extract_program(text))


def test_two_env_blocks_parsing_one_beats_longer_broken_one():
    broken = ENV.replace("def step(self, action: str):", "def step(self, action: str)") + "# padding\n" * 20
    text = fenced(broken) + "\nOops, fixed:\n\n" + fenced(ENV)
    result = extract_program(text)
    assert_env(result)
    assert result.has_note("multiple_env_blocks")
    assert not result.has_note("syntax_error")


def test_block_with_single_env_preferred_over_block_with_two():
    two = ENV + "\n\nclass HardGuessEnv(GuessEnv):\n    max_turns = 5\n"
    text = fenced(two) + "\nActually, just one class:\n\n" + fenced(ENV)
    assert_env(extract_program(text))


def test_two_env_classes_in_the_chosen_block_is_an_error():
    two = ENV + "\n\nclass HardGuessEnv(GuessEnv):\n    max_turns = 5\n"
    with pytest.raises(ExtractionError) as info:
        extract_program("Two variants:\n\n" + fenced(two))
    assert info.value.reason == "multiple_env_classes"
    assert "GuessEnv" in str(info.value) and "HardGuessEnv" in str(info.value)


def test_imported_env_class_does_not_count():
    result = extract_program("Tool-use environment:\n\n" + fenced(TOOL_ENV))
    assert_env(result, TOOL_ENV, "LedgerEnv")
    # a block that only imports an Env class and uses it is not a program
    usage = "from spadekit.envs.tooluse import ToolEnv\nenv = ToolEnv()\n"
    with pytest.raises(ExtractionError) as info:
        extract_program(fenced(usage))
    assert info.value.reason == "no_env_class"


# ---------------------------------------------------------------------------------------------
# unfenced code
# ---------------------------------------------------------------------------------------------


def test_whole_text_is_code():
    result = extract_program(ENV)
    assert_env(result)
    assert result.method == "whole_text"
    assert result.notes == ()


def test_unfenced_code_after_prose():
    text = "Here is my environment.\nIt is a guessing game.\n\n" + ENV
    result = extract_program(text)
    assert_env(result)
    assert result.method == "unfenced"
    assert result.has_note("leading_text_skipped")


def test_unfenced_code_with_prose_and_hint_after():
    text = (
        "Here is my environment.\n\n" + ENV +
        "\nThis environment rewards finding the number quickly.\n\n"
        "Hint: Start at 50 and halve the range.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.method == "unfenced"
    assert result.has_note("trailing_text_trimmed")
    assert result.hint == "Start at 50 and halve the range."


def test_unfenced_code_with_decorator_first():
    code = "@dataclass_like\nclass DecoEnv:\n    def reset(self, seed=None, options=None):\n        return '', {}\n"
    result = extract_program("My env:\n\n" + code)
    assert result.code == code and result.class_name == "DecoEnv"


def test_prose_mentioning_import_is_not_code():
    text = "You should import the module and create a class that wraps it.\nThat's all."
    with pytest.raises(ExtractionError) as info:
        extract_program(text)
    assert info.value.reason == "no_code"


# ---------------------------------------------------------------------------------------------
# think sections
# ---------------------------------------------------------------------------------------------


def test_think_draft_is_ignored_when_answer_has_code():
    draft = "class GuessEnv:\n    def reset(self, seed=None, options=None):\n        return 'draft', {}\n" + "    # long draft\n" * 40
    text = (
        "<think>\nLet me draft it first.\n\n" + fenced(draft) +
        "\nHint: draft hint.\nOK, now the final answer.\n</think>\n\n"
        "Final environment:\n\n" + fenced(ENV) + "\nHint: Use binary search.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.hint == "Use binary search."
    assert result.has_note("think_removed")
    assert not result.has_note("from_think")


def test_code_only_inside_think_is_used_and_noted():
    text = (
        "<think>\nI will write it like this:\n\n" + fenced(ENV) + "\nHint: inner hint.\n</think>\n"
        "I wrote a number guessing environment.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.has_note("from_think")
    assert result.hint == "inner hint."


def test_final_answer_hint_beats_think_hint_when_code_from_think():
    text = (
        "<think>\n" + fenced(ENV) + "\nHint: draft hint.\n</think>\n\n"
        "HINT: The final hint.\n"
    )
    result = extract_program(text)
    assert_env(result)
    assert result.hint == "The final hint."


def test_think_opening_tag_in_prompt_only_closing_tag_in_output():
    text = "okay so the env should be a guessing game\n" + fenced("class DraftEnv:\n    pass\n") + "</think>\n\n" + fenced(ENV)
    result = extract_program(text)
    assert_env(result)
    assert result.has_note("think_removed")


def test_unclosed_think_runs_to_end():
    text = "<think>\nHmm, maybe:\n" + fenced(ENV) + "and then I need to"
    result = extract_program(text)
    assert_env(result)
    assert result.has_note("from_think")


def test_think_tag_inside_code_string_is_not_a_think_section():
    code = (
        "class ReasonEnv:\n"
        "    def reset(self, seed=None, options=None):\n"
        "        return 'Think inside <think></think> tags, then answer.', {}\n"
        "    def step(self, action):\n"
        "        return '', 0.0, True, False, {}\n"
    )
    result = extract_program(fenced(code))
    assert result.code == code
    assert not result.has_note("think_removed")


def test_think_only_without_code():
    with pytest.raises(ExtractionError) as info:
        extract_program("<think>\nI am not sure what to write.\n</think>\nSorry, I can't.")
    assert info.value.reason == "no_code"


# ---------------------------------------------------------------------------------------------
# hints
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hint_text",
    [
        "HINT: Use binary search on the range.",
        "Hint: Use binary search on the range.",
        "hint: Use binary search on the range.",
        "**Hint:** Use binary search on the range.",
        "**Hint**: Use binary search on the range.",
        "**HINT:** **Use binary search** on the range.",
        "- Hint: Use *binary search* on the range.",
        "> **Hint:** Use binary search on the range.",
        "<hint>Use binary search on the range.</hint>",
        "<hint>\nUse binary search\non the range.\n</hint>",
        "## Hint\n\nUse binary search on the range.",
        "### Hint:\nUse `binary search` on the range.",
        "## Hint (privileged)\n\nUse binary search on the range.",
        "# Hint: Use binary search on the range.",
        "**Hint**\n\nUse binary search\non the range.",
        "Privileged hint: Use binary search on the range.",
        "HINT: \"Use binary search on the range.\"",
        "Hint: Use [binary search](https://en.wikipedia.org/wiki/Binary_search) on the range.",
    ],
)
def test_trailing_hint_styles(hint_text):
    text = "Here is the environment.\n\n" + fenced(ENV) + "\n" + hint_text + "\n\nGood luck!\n"
    result = extract_program(text)
    assert_env(result)
    assert result.hint == "Use binary search on the range."


def test_hint_before_code():
    text = "HINT: Ask for the midpoint each turn.\n\n" + fenced(ENV)
    assert extract_program(text).hint == "Ask for the midpoint each turn."


def test_multi_sentence_hint_paragraph_then_more_prose():
    text = (
        fenced(ENV) +
        "\nHint: The secret is uniform in [1, 100]. Guess the midpoint.\nThen halve the interval.\n\n"
        "Let me know if you want changes.\n"
    )
    result = extract_program(text)
    assert result.hint == "The secret is uniform in [1, 100]. Guess the midpoint. Then halve the interval."


def test_hint_tag_preferred_over_line_marker():
    text = fenced(ENV) + "\nHint: weaker.\n\n<hint>Use the feedback direction.</hint>\n"
    assert extract_program(text).hint == "Use the feedback direction."


def test_hint_after_code_preferred_over_hint_before_and_noted():
    text = "Hint: before.\n\n" + fenced(ENV) + "\nHint: after.\n"
    result = extract_program(text)
    assert result.hint == "after."
    assert result.has_note("multiple_hints")


def test_hint_inside_code_constant():
    code = 'HINT = (\n    "Binary search: start at 50, "\n    "then halve."\n)\n\n' + ENV
    result = extract_program("```python\n" + code + "```\n")
    assert result.code == code
    assert result.hint == "Binary search: start at 50, then halve."
    assert result.has_note("hint_from_code")


def test_external_hint_beats_code_constant():
    code = 'HINT: str = "from code"\n' + ENV
    result = extract_program(fenced(code) + "\nHint: from prose.\n")
    assert result.hint == "from prose."


def test_non_literal_hint_constant_is_ignored():
    code = 'BASE = "x"\nHINT = BASE + "y"\n' + ENV
    result = extract_program(fenced(code))
    assert result.hint is None


def test_hint_comment_in_code_or_usage_block_is_not_a_hint():
    code = "# Hint: this comment is inside the code\n" + ENV
    usage = "# Hint: call reset first\nenv = GuessEnv()\nenv.reset()\n"
    result = extract_program(fenced(code) + "\n" + fenced(usage, ""))
    assert result.hint is None


@pytest.mark.parametrize(
    "hint_block",
    [
        "```text\nHINT: Halve the range each turn.\n```\n",
        "```\nHINT: Halve the range each turn.\n```\n",
        "## Hint\n\n```text\nHalve the range each turn.\n```\n",
        "**Hint:**\n```markdown\nHalve the *range* each turn.\n```\n",
    ],
)
def test_hint_in_text_block(hint_block):
    result = extract_program(fenced(ENV) + "\n" + hint_block + "\nHave fun!\n")
    assert_env(result)
    assert result.hint == "Halve the range each turn."


def test_hint_heading_does_not_grab_text_past_a_code_block():
    usage = "env = GuessEnv()\nprint(env.reset(seed=0))\n"
    text = fenced(ENV) + "\n## Hint\n\n" + fenced(usage) + "\nThat's the whole thing.\n"
    assert extract_program(text).hint is None


def test_no_hint_returns_none():
    text = "This is a game where you guess. The hints in the observations help.\n\n" + fenced(ENV)
    assert extract_program(text).hint is None


# ---------------------------------------------------------------------------------------------
# failures and robustness
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t\n", "\ufeff", "<think>\n</think>\n"])
def test_empty_input(text):
    with pytest.raises(ExtractionError) as info:
        extract_program(text)
    assert info.value.reason == "empty"
    assert isinstance(info.value, ValueError)


def test_no_code():
    text = "I'm sorry, but I can't design an environment for that request. Could you clarify?"
    with pytest.raises(ExtractionError) as info:
        extract_program(text)
    assert info.value.reason == "no_code"
    assert str(info.value)


def test_code_without_env_class():
    code = "import random\n\n\nclass Game:\n    def play(self):\n        return random.random()\n"
    for text in (fenced(code), "Here:\n\n" + code, code):
        with pytest.raises(ExtractionError) as info:
            extract_program(text)
        assert info.value.reason == "no_env_class"
    # "Environment" is not "...Env"
    with pytest.raises(ExtractionError) as info:
        extract_program(fenced("class GuessEnvironment:\n    pass\n"))
    assert info.value.reason == "no_env_class"


def test_block_that_does_not_parse_but_has_env_class_is_returned():
    broken = ENV.replace("def step(self, action: str):", "def step(self, action: str)")
    result = extract_program("Here it is:\n\n" + fenced(broken) + "\nHint: Use binary search.\n")
    assert result.code == broken
    assert result.class_name == "GuessEnv"
    assert result.has_note("syntax_error")
    assert result.hint == "Use binary search."


def test_unfenced_broken_code_with_trailing_hint():
    broken = ENV.replace("def reset(self, seed=None, options=None):", "def reset(self, seed=None options=None):")
    result = extract_program(broken + "\nHINT: Guess 50 first.\n")
    assert result.code == broken
    assert result.class_name == "GuessEnv"
    assert result.has_note("syntax_error")
    assert result.hint == "Guess 50 first."


def test_reasons_and_error_type():
    assert {"empty", "no_code", "no_env_class", "multiple_env_classes"} <= set(REASONS)
    err = ExtractionError("no_code", "nothing here")
    assert err.reason == "no_code" and str(err) == "nothing here"
    assert isinstance(err, ValueError)
    clone = pickle.loads(pickle.dumps(err))
    assert clone.reason == "no_code" and str(clone) == "nothing here"
    with pytest.raises(TypeError):
        extract_program(None)  # type: ignore[arg-type]


def test_code_is_never_executed(tmp_path):
    marker = tmp_path / "executed"
    code = (
        f"open({str(marker)!r}, 'w').write('x')\n"
        "class BoomEnv:\n"
        f"    open({str(marker)!r}, 'w').write('x')\n"
        "    def reset(self, seed=None, options=None):\n        return '', {}\n"
    )
    result = extract_program(fenced(code))
    assert result.class_name == "BoomEnv"
    assert not marker.exists()


def _timed(text):
    start = time.perf_counter()
    try:
        result = extract_program(text)
    except ExtractionError as exc:
        result = exc
    return result, time.perf_counter() - start


def test_huge_input_is_fast():
    rambling = "The agent must reason about the environment carefully before acting. " * 12 + "\n\n"
    filler = rambling * (1_000_000 // len(rambling))
    half = len(filler) // 2
    text = (
        "<think>\n" + filler[:half] + "</think>\n" + filler[half:]
        + fenced(ENV) + "\nHint: Binary search.\n"
    )
    assert len(text) > 1_000_000
    result, elapsed = _timed(text)
    assert_env(result)
    assert result.hint == "Binary search."
    assert elapsed < 1.0, elapsed

    error, elapsed = _timed(filler)
    assert isinstance(error, ExtractionError) and error.reason == "no_code"
    assert elapsed < 1.0, elapsed

    # prose, then unfenced code, then a long tail of prose
    result, elapsed = _timed(filler[:half] + ENV + "\n" + filler[half:])
    assert result.class_name == "GuessEnv"
    assert elapsed < 1.0, elapsed


def test_huge_code_block_is_not_parsed_but_returned():
    big = ENV + "TABLE = [\n" + "    (1, 'one', 1.0),\n" * 50_000 + "]\n"
    assert len(big) > 1_000_000
    result, elapsed = _timed("Here is the environment with its data table:\n\n" + fenced(big))
    assert_env(result, big)
    assert result.has_note("unchecked_syntax")
    assert elapsed < 1.0, elapsed


DEGENERATE = {  # a few hundred KB each: enough to make any quadratic step take minutes
    "many small blocks": lambda: fenced("print('step')\n") * 10_000 + fenced(ENV),
    "many env blocks": lambda: fenced("class AEnv:\n    pass\n") * 10_000,
    "long line of spaces": lambda: fenced(ENV) + "Hint" + " " * 500_000 + "x\n",
    "many blank lines": lambda: "\n" * 300_000 + ENV,
    "many hint lines": lambda: fenced(ENV) + "Hint: x\n" * 40_000,
    "prose after unfenced code": lambda: "Intro\n\n" + ENV + "\nThis is prose.\n\n" * 20_000,
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_degenerate_huge_inputs_stay_linear(name):
    # Repetition loops of a sampling model: bounded work, no quadratic blow-up.
    result, elapsed = _timed(DEGENERATE[name]())
    assert isinstance(result, (Extraction, ExtractionError))
    assert elapsed < 2.0, (name, elapsed)


def test_to_program():
    result = extract_program(fenced(TOOL_ENV) + "\nHint: Add the rows one by one.\n")
    program = result.to_program(domain="tooluse", source="designer:run1/3", skill="arithmetic")
    assert isinstance(program, EnvProgram)
    assert program.code == TOOL_ENV
    assert program.hint == "Add the rows one by one."
    assert program.class_name == "LedgerEnv"
    assert program.domain == "tooluse"


def test_extraction_is_frozen():
    result = extract_program(fenced(ENV))
    with pytest.raises(AttributeError):
        result.code = "x"  # type: ignore[misc]
    assert isinstance(result.notes, tuple)
