"""the TRL adapter's hint withholding (``_hint_pattern``).

- an echo that drops (or changes) the hint's trailing punctuation reaches the model whole;
- a hint without words (punctuation only) still builds a pattern, against its own docstring,
  and blanks that punctuation everywhere in every observation;
- matching runs in the trainer's process, outside the sandbox's time limits, in time
  O(observation x hint): a 4,000-character hint and a 64 KB observation cost ~1.2 s a turn.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

HINT = "Probe the middle first, then halve the range."

ECHO = '''
class EchoEnv:
    max_turns = 4

    def reset(self, seed=None, options=None):
        return "Remember: probe the middle first, then halve the range! Go.", {}

    def step(self, action):
        return "ok", 0.5, True, False, {}
'''


@pytest.fixture
def echo_pool(tmp_path) -> Path:
    from spadekit.envs.program import EnvProgram
    from spadekit.runs.pool import write_pool

    out = tmp_path / "pool"
    write_pool(out, [(EnvProgram(code=ECHO, hint=HINT, domain="games"), None)])
    return out


def test_an_echo_without_the_hints_final_full_stop_is_withheld(echo_pool):
    # the pattern requires "range." (the escaped last word with its period) followed by a
    # non-word char: "...halve the range!" is the hint, echoed, and it reaches the model whole
    from spadekit.integrations.trl import PoolEnvironments

    with PoolEnvironments(echo_pool, warm=0) as envs:
        first = envs.factory().reset(env_id=next(iter(envs.programs)), seed=0)
    assert "halve the range" not in first.lower(), first


def test_a_hint_without_words_builds_no_pattern_and_blanks_nothing():
    # docstring: "None for a hint without words"; "?" / "..." / "|" each give a pattern that
    # replaces that mark everywhere in every observation ("X | O | ?" -> "X [withheld] O ...")
    from spadekit.integrations.trl import _hint_pattern, _withheld

    board = "X | O | X\n--+---+--\n  | ? |  \nYour move? ..."
    for hint in ("?", "...", "|", "-", "--+"):
        assert _withheld(board, _hint_pattern(hint)) == board, hint


def test_withholding_a_long_hint_does_not_stall_the_trainer():
    # a hostile release's (or designer's) 4,000-character hint and a 64 KB observation (the
    # sandbox's max_observation_chars): ~1.2 s of regex per turn in the trainer's process
    from spadekit.integrations.trl import _hint_pattern, _withheld

    def cost(n: int) -> float:
        hint = " ".join(["a"] * (n // 16)) + " b"
        observation = "a " * n
        pattern = _hint_pattern(hint)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            assert _withheld(observation, pattern) == observation
            best = min(best, time.perf_counter() - start)
        return best

    # linear in both lengths: 8x the text costs about 8x (a quadratic matcher: about 64x)
    assert cost(64000) / cost(8000) < 24
