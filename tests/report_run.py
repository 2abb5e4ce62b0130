"""A small real self-play run for the report/dashboard tests: ``build_run(tmp_dir) -> Path``.

Three rounds of the real tiny model (``regen_interval=1``, so every round designs, plays with and
without the hint, and has regret), with a scripted designer that returns real programs:

* round 0: :data:`HOSTILE` (valid; its code and hint carry :data:`HOSTILE_STRINGS` in comments,
  a docstring and a string) and ``WORDS[1]``;
* round 1: an output with no code (rejected ``no_env_class``) and ``WORDS[2]``;
* round 2: ``WORDS[1]`` again (rejected ``near_duplicate``) and ``WORDS[3]``.

Reusable by the HTML/browser tests: ``from report_run import build_run, HOSTILE_STRINGS``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_selfplay import LETTERS, WORDS, config  # noqa: E402

SCRIPT_TAG = "</script><script>alert(1)</script>"
IMG_TAG = "<img src=x onerror=alert(1)>"
HOSTILE_STRINGS = (SCRIPT_TAG, IMG_TAG)
HOSTILE_MARK = "HOSTILE-ENV-MARKER"

HOSTILE = (
    f"# {HOSTILE_MARK} {SCRIPT_TAG}\n"
    + LETTERS.replace('"solve"', '"pilot"')
    .replace('"""Unscramble the word; letters score, the exact word wins."""',
             f'"""Answer with letters. {IMG_TAG} & {SCRIPT_TAG}"""\n\n    BANNER = {IMG_TAG!r}')
)
HOSTILE_HINT = (f"Answer with one short lowercase word naming the flying job {SCRIPT_TAG} "
                f"{IMG_TAG} and nothing else")

PROGRAMS = [HOSTILE, WORDS[1], "no code at all, sorry", WORDS[2], WORDS[1], WORDS[3]]


def responder(programs=PROGRAMS):
    """Designer replies in order; hint requests get a plain hint, or the hostile one for the
    hostile program."""
    counter = {"n": 0}

    def respond(_ids, text):
        if "You write privileged hints" in text:
            if HOSTILE_MARK in text:
                return "HINT: " + HOSTILE_HINT
            return "HINT: Answer with one short lowercase word that names the goal."
        program = programs[counter["n"] % len(programs)]
        counter["n"] += 1
        if "```" not in program and "class " not in program:
            return program
        return f"Here is the environment.\n```python\n{program}\n```\nHINT: use letters."

    return respond


def build_run(tmp_dir: str | Path, rounds: int = 3, **extra) -> Path:
    """Make ``tmp_dir/run`` with ``rounds`` committed rounds (``extra``: more config
    overrides); returns the run directory."""
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay

    tmp_dir = Path(tmp_dir)
    run = tmp_dir / "run"
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, responder())
    with SelfPlay(config(tmp_dir, rounds=rounds, tensorboard="false", **extra), run, policy=policy,
                  designer_policy=designer) as sp:
        sp.run()
    return run


if __name__ == "__main__":  # python tests/report_run.py DIR
    print(build_run(sys.argv[1]))
