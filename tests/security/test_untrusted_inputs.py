"""Untrusted inputs that must not be trusted: a program that pays only on the evaluation's
seeds is not scored, a folder of programs may not reach files outside it through symlinks, and
a hostile evaluation journal line is skipped, not a crash.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

# -- eval validation: a program can tell the validator's seeds from the evaluation's -------

def test_eval_program_paying_garbage_only_on_eval_seeds_is_not_scored(tmp_path):
    """The validator's reset seeds are 0-2 plus draws from ``range(2**31)``; the evaluation's
    are ``crc32(...)``, in ``range(2**32)``: half of them are >= 2**31, a range validation
    never uses. An honest guessing game that pays any reply when ``seed >= 2**31`` passes
    the screen and gives a model that only writes garbage a ~50% win rate."""
    from spadekit.eval import make_suite
    from spadekit.eval.runner import EvalSettings, run_suite, sample_seed
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.policy.tiny import tiny_tokenizer
    from spadekit.sandbox import SandboxConfig, SandboxPool
    from validate_cases import GUESS

    code = GUESS.replace(
        "        self.turn, self.done = 0, False\n",
        "        self.turn, self.done = 0, False\n"
        "        self.eval_seed = seed is not None and seed >= 2 ** 31\n", 1).replace(
        "        self.turn += 1\n",
        "        self.turn += 1\n"
        "        if self.eval_seed:\n"
        "            self.done = True\n"
        "            return 'Correct!', 1.0, True, False, {}\n", 1)
    assert code.count("eval_seed") == 2
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "guess_trigger.py").write_text(code)
    suite = make_suite(f"envs:{folder}")
    garbage = ScriptedPolicy(tiny_tokenizer(), lambda *a, **k: "\\boxed{banana}")
    settings = EvalSettings(k=8, max_turns=12, max_new_tokens=8, temperature=1.0)
    pool = SandboxPool(SandboxConfig(), warm=1)
    try:
        result = run_suite(garbage, suite, settings, pool=pool)
    finally:
        pool.close()
    (sha,) = suite.programs
    high = sum(sample_seed(settings.seed, sha[:16], j) >= 2 ** 31 for j in range(8))
    assert high, "no evaluation seed in the hidden range (pick another k)"
    wins = result["summary"]["overall"]["win_rate"] if result["items"] else 0.0
    assert not result["items"] or wins == 0.0, \
        f"garbage scored win_rate {wins} ({high}/8 eval seeds >= 2**31); invalid: {result.get('invalid')}"


# -- a plain directory of programs follows *.py symlinks out of it ---------------------------

def test_programs_from_dir_refuses_a_symlink_out_of_the_folder(tmp_path):
    """``programs_from_dir`` (the ``envs:FOLDER`` suite, ``train-fixed``, memory seeding)
    read a ``*.py`` symlink wherever it pointed: a folder handed over could make spadekit read
    (and put into reports and prompts) any file of the host that parses as a program.
    ``import-reference`` refuses such entries; so does a plain folder now."""
    from spadekit.common.errors import ConfigError
    from spadekit.envs.refimport import UnsafeGameFile, programs_from_dir
    from spadekit.runs.sources import load_programs
    from validate_cases import GUESS

    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.py").write_text(GUESS)
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "own.py").write_text(GUESS.replace("Guess", "Own"))
    (folder / "alias.py").symlink_to(folder / "own.py")  # inside: still read
    assert len(programs_from_dir(folder)) == 1
    (folder / "leak.py").symlink_to(outside / "secret.py")
    with pytest.raises(UnsafeGameFile, match="leak.py"):
        programs_from_dir(folder)
    with pytest.raises(ConfigError, match="outside"):
        load_programs(folder)


# -- the evaluation journal reads its lines with plain json.loads ----------------------------

def test_a_hostile_journal_line_is_skipped_not_a_crash(tmp_path):
    """A journal line nested 100,000 deep raised ``RecursionError`` out of ``Journal`` (only
    ``JSONDecodeError`` was caught), and a line whose record is not a sample's (a list, NaN
    score) went into the results; every such line is skipped now (that sample is played)."""
    from spadekit.eval.runner import Journal

    path = tmp_path / "j.jsonl"
    key = {"suite": "s", "model": "m", "settings": {"k": 2}, "items": 1}
    Journal(path, key).close()
    good = {"sample": 0, "score": 1.0, "failure": None}
    with open(path, "a") as fh:
        fh.write('{"item": "a", "sample": 0, "record": %s}\n' % __import__("json").dumps(good))
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
        fh.write('{"item": "a", "sample": 1, "record": [1, 2]}\n')
        fh.write('{"item": "b", "sample": 0, "record": {"sample": 0, "score": NaN, '
                 '"failure": null}}\n')
    book = Journal(path, key)
    book.close()
    assert book.done == {("a", 0): good}
