"""JSON that spadekit did not write (a reference memory file, a pool directory from
elsewhere) never crashes a command with a traceback, and a reference record's ``game_file``
never reads a host file outside the games directory.

The commands run for real (``python -m spadekit ...`` in a subprocess); the decoder
(``spadekit.common.safe_json``) and the JSON-lines reader are checked against ``json.loads``
with hypothesis.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spadekit.common.jsonl import read_jsonl
from spadekit.common.safe_json import (MAX_DEPTH, MAX_DOCUMENT_BYTES, UntrustedJsonError,
                                       decode)
from spadekit.envs import library
from spadekit.runs.pool import PoolError, load_pool
from spadekit.runs.sources import load_programs

SRC = Path(__file__).resolve().parents[2] / "src"
REFSTYLE = Path(__file__).resolve().parents[1] / "data" / "refstyle"
OPTIMIZATION = (REFSTYLE / "game_00000_001_optimization.py").read_text()
MARKER = "HOST_SECRET_MARKER_7f3a"
DEEP = "[" * 100_000 + "]" * 100_000


def spadekit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "2000"}  # rich: no wrapping
    done = subprocess.run([sys.executable, "-m", "spadekit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    return done


def import_memory(tmp: Path, text: str | bytes, *extra: str) -> subprocess.CompletedProcess:
    memory = tmp / "env_memory.json"
    memory.write_bytes(text.encode() if isinstance(text, str) else text)
    return spadekit("import-reference", "--memory", str(memory), "--out", str(tmp / "pool"),
                    "--no-validate", "--json", *extra, cwd=tmp)


# the memory file -------------------------------------------------------------------------------

def test_nonfinite_numbers_in_a_memory_file_are_read_as_unknown(tmp_path):
    record = ('{"game_file": "gone.py", "skill": "Optimization", "code_snippet": %s, '
              '"actor_win_rate": NaN, "regret": Infinity, "rollout_id": 1, '
              '"metadata": {"a": -Infinity, "b": 1e999}}' % json.dumps(OPTIMIZATION))
    done = import_memory(tmp_path, f"[{record}]")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["written"], summary["nonfinite"]) == (1, 4)
    text = (tmp_path / "pool" / "pool.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    (program,) = load_pool(tmp_path / "pool")
    assert dict(program.meta["reference_stats"]) == {"win_rate": None, "regret": None}


@pytest.mark.parametrize("text, message", [
    (DEEP, "nested deeper than"),
    ('[{"metadata": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}]", "nested deeper than"),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper than"),
    ('[{"regret": 1' + "0" * 5000 + "}]", "not readable JSON"),
    ('[{"game_file": "\\ud800.py", "code_snippet": "x"}]', "lone UTF-16 surrogate"),
], ids=["deep-lists", "deep-objects", "just-too-deep", "huge-integer", "lone-surrogate"])
def test_a_memory_file_the_decoder_refuses_is_a_clear_error(tmp_path, text, message):
    done = import_memory(tmp_path, text)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and "env_memory.json" in done.stderr
    assert not (tmp_path / "pool" / "pool.jsonl").exists()


def test_a_huge_memory_file_is_refused_before_it_is_read(tmp_path):
    memory = tmp_path / "env_memory.json"
    with open(memory, "wb") as fh:  # sparse: costs no disk
        fh.truncate(MAX_DOCUMENT_BYTES + 1)
    done = spadekit("import-reference", "--memory", str(memory), "--out", str(tmp_path / "p"),
                    "--no-validate", cwd=tmp_path)
    assert done.returncode == 2 and "larger than" in done.stderr, done.stderr


# pool.jsonl ------------------------------------------------------------------------------------

def _lines(*names: str) -> list[bytes]:
    return [json.dumps(library.program(library.get(n)).to_dict()).encode() for n in names]


def _good_pair() -> list[bytes]:
    games = [e.name for e in library.list_library() if e.setting == "games"]
    return _lines(games[0], games[1])


BAD_LINES = {
    "deep": DEEP.encode(),
    "deep-in-meta": b'{"code": "class AEnv:\\n    pass\\n", "meta": {"x": ' + b"[" * 5000
                    + b"]" * 5000 + b"}}",
    "nan": b'{"code": "class AEnv:\\n    pass\\n", "meta": {"x": NaN}}',
    "infinity-literal": b'{"code": "class AEnv:\\n    pass\\n", "meta": {"x": 1e999}}',
    "lone-surrogate": b'{"code": "class AEnv:\\n    pass  # \\udc80\\n"}',
    "not-utf8": b'{"code": "class AEnv:\\n    pass  # \xff\xfe\\n"}',
    "huge-integer": b'{"code": "class AEnv:\\n    pass\\n", "meta": {"x": 1' + b"0" * 5000
                    + b"}}",
    "too-long": b'{"code": "class AEnv:\\n    pass  # ' + b"x" * (17 * 1024 * 1024) + b'\\n"}',
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_a_bad_pool_line_is_skipped_with_a_warning_and_the_rest_loads(tmp_path, caplog, kind):
    good = _good_pair()
    (tmp_path / "pool.jsonl").write_bytes(b"\n".join([good[0], BAD_LINES[kind], good[1]])
                                          + b"\n")
    with caplog.at_level(logging.WARNING, logger="spadekit.runs.pool"):
        programs = load_programs(tmp_path, "games")  # train-fixed, eval envs:, memory_seed
    assert [p.sha256 for p in programs] == [json.loads(g)["sha256"] for g in good]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "spadekit.runs.pool"]
    assert "1 line(s)" in warning and "line 2" in warning and "2 program(s) loaded" in warning
    with pytest.raises(PoolError, match="line 2"):
        load_pool(tmp_path, strict=True)


def test_eval_on_a_pool_of_bad_lines_is_a_clear_error(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "pool.jsonl").write_bytes(BAD_LINES["deep"] + b"\n" + BAD_LINES["not-utf8"] + b"\n")
    done = spadekit("eval", "--model", "tiny", "--suite", f"envs:{pool}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "2 line(s) of the pool could not be read" in done.stderr
    assert "holds no environment programs" in done.stderr


def test_train_fixed_on_a_pool_of_bad_lines_is_a_clear_error(tmp_path):
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "pool.jsonl").write_bytes(BAD_LINES["deep"] + b"\n")
    done = spadekit("train-fixed", "--pool", str(pool), "--run-dir", str(tmp_path / "run"),
                    cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "line 1: nested deeper than" in done.stderr


def test_import_reference_appends_to_a_pool_that_holds_a_bad_line(tmp_path):
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "pool.jsonl").write_bytes(DEEP.encode() + b"\n")
    record = {"game_file": "gone.py", "skill": "Optimization", "code_snippet": OPTIMIZATION}
    done = import_memory(tmp_path, json.dumps([record]))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == 1


# game_file -------------------------------------------------------------------------------------

def _secret(tmp: Path) -> Path:
    """A valid program outside the games directory, carrying a marker."""
    outside = tmp / "host" / "private"
    outside.mkdir(parents=True)
    secret = outside / "game_00000_001_optimization.py"
    secret.write_text(OPTIMIZATION + f"\n# {MARKER}\n")
    return secret


def _import(tmp: Path, game_file: str, games: Path | None) -> tuple[dict, str]:
    memory = tmp / "ref" / "env_memory.json"
    memory.parent.mkdir(exist_ok=True)
    memory.write_text(json.dumps([{"game_file": game_file, "skill": "Optimization"}]))
    args = ["import-reference", "--memory", str(memory), "--out", str(tmp / "pool"),
            "--no-validate", "--json"] + (["--games", str(games)] if games else [])
    done = spadekit(*args, cwd=tmp)
    assert done.returncode == 0, done.stderr
    written = "".join(p.read_text() for p in (tmp / "pool").rglob("*") if p.is_file())
    return json.loads(done.stdout), written


@pytest.mark.parametrize("how", ["relative-escape", "absolute", "symlink-out",
                                 "absolute-without-games"])
def test_game_file_never_reads_outside_the_games_directory(tmp_path, how):
    secret = _secret(tmp_path)
    games = tmp_path / "ref" / "games"
    games.mkdir(parents=True)
    if how == "relative-escape":
        name = os.path.relpath(secret, games)
    elif how == "symlink-out":
        (games / "game_00000_009_optimization.py").symlink_to(secret)
        name = "game_00000_009_optimization.py"
    else:
        name = str(secret)
    summary, written = _import(tmp_path, name, None if how.endswith("without-games") else games)
    assert MARKER not in written
    assert summary["written"] == 0
    if how in ("relative-escape", "symlink-out"):
        reasons = " ".join(s["why"] for s in summary["skipped"])
        assert "refused" in reasons and "outside the games directory" in reasons


def test_game_file_inside_the_games_directory_is_read(tmp_path):
    games = tmp_path / "ref" / "games"
    (games / "rollout_3").mkdir(parents=True)
    (games / "rollout_3" / "game_00003_001_optimization.py").write_text(OPTIMIZATION)
    summary, _written = _import(tmp_path, "rollout_3/game_00003_001_optimization.py", games)
    assert summary["written"] == 1
    (program,) = load_pool(tmp_path / "pool")
    assert program.meta["lineage"]["read_from"] == str(
        games / "rollout_3" / "game_00003_001_optimization.py")


# the other readers of files from elsewhere ----------------------------------------------------

NASTY = [DEEP, '{"question": "q", "answer": NaN}', '{"question": "q", "answer": 1e999}',
         '{"question": "q", "answer": 1' + "0" * 5000 + "}"]


@pytest.mark.parametrize("line", NASTY, ids=["deep", "nan", "infinity", "huge-integer"])
def test_a_qa_file_line_the_decoder_refuses_names_its_line(tmp_path, line):
    from spadekit.eval.base import EvalError
    from spadekit.eval.qa import QASuite

    path = tmp_path / "aime.jsonl"
    path.write_text('{"question": "1 + 1?", "answer": "2"}\n' + line + "\n")
    with pytest.raises(EvalError, match="line 2"):
        QASuite(path).load_items()


@pytest.mark.parametrize("line", [NASTY[0], NASTY[3]], ids=["deep", "huge-integer"])
def test_a_corpus_line_the_decoder_refuses_names_its_line(tmp_path, line):
    from spadekit.selfplay.corpus import CorpusError, load_corpus

    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a document about matrices and their traces"}\n' + line + "\n")
    with pytest.raises(CorpusError, match="docs.jsonl:2"):
        load_corpus(path).documents


@pytest.mark.parametrize("text", [DEEP, '{"format": NaN}', '{"a": 1' + "0" * 5000 + "}"],
                         ids=["deep", "nan", "huge-integer"])
def test_eval_compare_on_a_results_file_the_decoder_refuses_is_a_clear_error(tmp_path, text):
    (tmp_path / "a.json").write_text(text)
    done = spadekit("eval", "compare", "a.json", "a.json", cwd=tmp_path)
    assert done.returncode == 2 and "not a readable JSON results file" in done.stderr, \
        done.stderr


def test_a_config_file_nested_too_deep_is_a_config_error(tmp_path):
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.config import load_config

    (tmp_path / "deep.yaml").write_text("rounds: " + DEEP + "\n")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config("cpu-tiny", tmp_path / "deep.yaml")


# the decoder -----------------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=40)
TOKENS = st.sampled_from(['[', ']', '{', '}', '"k": ', ', ', 'NaN', '-Infinity', 'Infinity',
                          '1e999', '-1e400', '"\\ud800"', '"\\udc00\\ud800"', '0', '"x"', ' ',
                          '1' + '0' * 4400, 'null', '\\', '"', ':'])
SOUP = st.lists(TOKENS, max_size=60).map("".join) | st.integers(0, 3000).map(
    lambda n: "[" * n + "]" * n) | st.text(max_size=60) | st.binary(max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES, st.booleans())
def test_the_decoder_agrees_with_json_loads_on_finite_shallow_documents(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert decode(text).value == json.loads(text)
    assert decode(text.encode("utf-8")).value == json.loads(text)


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SOUP)
def test_the_decoder_raises_only_its_typed_error(text):
    try:
        value = decode(text, source="soup").value
    except UntrustedJsonError as exc:
        assert exc.message.startswith("soup") and exc.why
        return
    assert _depth(value) <= MAX_DEPTH
    json.dumps(value, allow_nan=False).encode("utf-8")  # finite and valid Unicode


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(VALUES.map(json.dumps) | SOUP.map(lambda s: s if isinstance(s, str) else
                                                   s.decode("latin-1")), max_size=8),
       st.integers(1, 80))
def test_read_jsonl_reads_each_line_as_the_decoder_does(tmp_path, lines, limit):
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    path = tmp_path / "x.jsonl"
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))
    expected = []
    for number, line in enumerate(lines, 1):
        raw = (line + "\n").encode("utf-8", "surrogatepass")
        if len(raw) - 1 > limit:
            expected.append((number, "too_large"))
        elif raw.strip():
            try:
                expected.append((number, decode(raw).value))
            except UntrustedJsonError as exc:
                expected.append((number, exc.why))
    got = [(x.number, x.error.why if x.error else x.value)
           for x in read_jsonl(path, max_line_bytes=limit)]
    assert got == expected
