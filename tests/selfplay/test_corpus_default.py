"""The default corpus is a file spadekit ships (``spadekit/selfplay/data/default_corpus.jsonl.gz``):
the same documents whatever else is installed or imported, checked against its digest when read
(a damaged file is a CorpusError naming it), rebuilt byte for byte by
``scripts/build_default_corpus.py``, and ``spadekit eval compare`` says when two runs were
grounded on different default corpora.

The default corpus used to be built at run time from the docstrings of the standard library and
of whatever numpy/scipy/networkx/sympy were installed, so the designer's prompts changed with
unrelated packages. Here two fresh interpreters, one that imported those packages (and patched
the standard library, as Ray and transformers do) and one that cannot import them, read the
same digest.
"""

from __future__ import annotations

import gzip
import json
import platform
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spadekit.selfplay.corpus import (DEFAULT_CORPUS_FILE, Corpus, CorpusError, Document,
                                      corpus_digest, default_corpus, read_corpus_file,
                                      write_corpus_file)

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "scripts" / "build_default_corpus.py"
SCIENTIFIC = ("numpy", "scipy", "networkx", "sympy")


def header() -> dict:
    with gzip.open(DEFAULT_CORPUS_FILE, "rb") as fh:
        return json.loads(fh.readline())


def test_the_shipped_corpus_loads_and_matches_its_header():
    corpus = default_corpus()
    head = header()
    assert len(corpus) == head["documents"] == len(corpus.documents) > 300
    assert corpus_digest(corpus.documents) == head["digest"] == corpus.info["digest"]
    assert corpus.info["python"] == head["info"]["python"]
    assert corpus.info["spadekit"] == head["info"]["spadekit"]
    assert "Python Software Foundation" in head["notice"] and "PSF License" in head["notice"]
    assert 20_000 < DEFAULT_CORPUS_FILE.stat().st_size < 1_500_000
    assert (DEFAULT_CORPUS_FILE.parent / "README.md").is_file()


_PROBE = """
import importlib, json, sys
mode = sys.argv[1]
roots = {roots!r}
if mode == "blocked":
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in roots:
                raise ImportError(f"{{name}} is blocked")
            return None
    sys.meta_path.insert(0, Refuse())
imported = []
for name in roots:
    try:
        importlib.import_module(name)
        imported.append(name)
    except ImportError:
        pass
if mode == "imported":  # what imported packages do to the standard library
    import inspect, logging
    inspect.isgenerator = lambda obj: False
    def shout(self, *args):
        pass
    shout.__doc__ = "Log a warning loudly. " + "It comes from another package. " * 20
    logging.Logger.shout = shout
from spadekit.selfplay.corpus import corpus_digest, default_corpus
corpus = default_corpus()
print(json.dumps({{"imported": imported, "digest": corpus_digest(corpus.documents),
                  "documents": len(corpus), "scientific": sorted(
                      m for m in sys.modules if m.split(".")[0] in roots)}}))
"""


def test_the_same_documents_whatever_is_installed_or_imported():
    code = _PROBE.format(roots=SCIENTIFIC)
    out = {}
    for mode in ("imported", "blocked"):
        done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                              text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["blocked"]["imported"] == [] and out["blocked"]["scientific"] == []
    assert out["imported"]["imported"] == [m for m in SCIENTIFIC if _installed(m)]
    assert out["imported"]["digest"] == out["blocked"]["digest"] == header()["digest"]
    assert out["imported"]["documents"] == out["blocked"]["documents"] == header()["documents"]


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:]


def _edit_documents(text: bytes) -> bytes:
    head, docs = text.split(b"\n", 1)
    assert b"heap" in docs
    return head + b"\n" + docs.replace(b"heap", b"heaq", 1)


@pytest.mark.parametrize("damage, message", [
    (lambda b: flip(b, len(b) // 2), "does not read"),
    (lambda b: flip(flip(b, len(b) // 3), 2 * len(b) // 3), "does not read"),
    (lambda b: b[: len(b) - 100], "does not read"),
    (lambda b: b"not gzip at all", "does not read"),
    (lambda b: gzip.compress(_edit_documents(gzip.decompress(b)), mtime=0), "is damaged"),
    (lambda b: gzip.compress(gzip.decompress(b).split(b"\n", 1)[1], mtime=0),
     "not a spadekit corpus file"),
], ids=["flipped_byte", "two_flipped_bytes", "truncated", "not_gzip", "edited_text",
        "no_header"])
def test_a_damaged_default_corpus_file_is_a_corpus_error_naming_it(tmp_path, damage, message):
    bad = tmp_path / "default_corpus.jsonl.gz"
    bad.write_bytes(damage(DEFAULT_CORPUS_FILE.read_bytes()))
    with pytest.raises(CorpusError, match=message) as err:
        default_corpus(path=bad)
    assert str(bad) in str(err.value) and "default corpus file" in str(err.value)
    assert len(default_corpus()) == header()["documents"]  # the shipped one is untouched


def test_the_builder_reproduces_the_shipped_file_byte_for_byte(tmp_path):
    info = header()["info"]
    here = platform.python_version()
    if (here, sys.platform) != (info["python"], info["platform"]):
        pytest.skip(f"the shipped default corpus was built by Python {info['python']} on "
                    f"{info['platform']}; this is Python {here} on {sys.platform}, whose "
                    "standard-library docstrings may differ")
    out = tmp_path / "built.jsonl.gz"
    done = subprocess.run([sys.executable, str(BUILDER), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["digest"] == header()["digest"]
    rebuild = "rebuild it: python scripts/build_default_corpus.py (see its data/README.md)"
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(
        DEFAULT_CORPUS_FILE.read_bytes()), rebuild
    if zlib.ZLIB_RUNTIME_VERSION == info["zlib"]:  # another zlib may compress otherwise
        assert out.read_bytes() == DEFAULT_CORPUS_FILE.read_bytes(), rebuild
    again = tmp_path / "again.jsonl.gz"
    subprocess.run([sys.executable, str(BUILDER), "--out", str(again)], check=True,
                   capture_output=True, timeout=300)
    assert again.read_bytes() == out.read_bytes()


# -- the corpus file format, property-based -------------------------------------------------

_text = st.text(st.characters(codec="utf-8") | st.sampled_from("\n\r\u2028\x85\x00\"\\"),
                max_size=60)
_documents = st.lists(st.builds(Document, _text, _text, _text), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents=_documents, info=st.dictionaries(st.text(max_size=8), _text, max_size=3))
def test_a_corpus_file_reads_back_what_was_written(tmp_path, documents, info):
    path = tmp_path / "c.jsonl.gz"
    digest = write_corpus_file(path, documents, name="n", description="d", info=info)
    docs, head = read_corpus_file(path)
    assert docs == documents and head["digest"] == digest == corpus_digest(documents)
    assert head["info"] == info and head["documents"] == len(documents)
    first = path.read_bytes()
    write_corpus_file(path, documents, name="n", description="d", info=info)
    assert path.read_bytes() == first  # deterministic: no time, no file name in the gzip


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents=_documents, data=st.data())
def test_a_changed_corpus_file_reads_the_same_or_is_a_corpus_error(tmp_path, documents, data):
    """Any edit of the file's bytes (or of its text, recompressed) gives back the documents
    written or a CorpusError naming the file: never another exception, never other documents."""
    path = tmp_path / "c.jsonl.gz"
    write_corpus_file(path, documents, name="n")
    raw = path.read_bytes()
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(raw) - 1))
        changed = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1:]
    else:
        text = gzip.decompress(raw)
        at = data.draw(st.integers(0, len(text) - 1))
        changed = gzip.compress(text[:at] + data.draw(st.binary(max_size=3))
                                + text[at + 1:])
    path.write_bytes(changed)
    try:
        docs, _head = read_corpus_file(path)
    except CorpusError as exc:
        assert str(path) in str(exc)
    else:
        assert docs == documents


# -- eval compare across default corpora ----------------------------------------------------


def _result() -> dict:
    items = [{"id": i, "dataset": "d", "group": "g", "scores": [s], "mean_score": s,
              "win_rate": float(s >= 1), "failures": 0} for i, s in (("a", 1.0), ("b", 0.0))]
    return {"format": "spadekit-eval/1", "suite": "sums", "items": items}


def test_eval_compare_says_when_runs_were_grounded_on_different_default_corpora(tmp_path):
    from spadekit.cli.app import app
    from spadekit.eval.compare import (PINNED_CORPUS, corpus_note, results_file,
                                       run_corpus_record)
    from spadekit.selfplay.corpus_pin import PIN_NAME, pin

    assert PINNED_CORPUS == PIN_NAME
    shipped = default_corpus()
    other = Corpus([Document("x:1", "an older release's default")], name="default")
    runs = {}
    for name, corpus in (("a", shipped), ("b", shipped), ("c", other)):
        runs[name] = tmp_path / name
        (runs[name] / "checkpoints" / "step-2").mkdir(parents=True)
        pin(corpus, runs[name], tmp_path / "cache")
    # a run directory and a checkpoint inside one record the run's corpus; a model spec not
    assert run_corpus_record(runs["a"]) == {"name": "default", "digest": shipped.info["digest"],
                                            "documents": len(shipped)}
    assert run_corpus_record(runs["c"] / "checkpoints" / "step-2")["digest"] == \
        corpus_digest(other.documents)
    assert run_corpus_record("tiny") is None and run_corpus_record(tmp_path) is None
    files = {}
    for name, source in (("a", runs["a"]), ("b", runs["b"] / "checkpoints" / "step-2"),
                         ("c", runs["c"]), ("m", "tiny")):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(results_file(name, [_result()], source=source)))
    loaded = {k: json.loads(v.read_text()) for k, v in files.items()}
    assert "corpus" not in loaded["m"]
    assert corpus_note(loaded["a"], loaded["b"]) is None
    assert corpus_note(loaded["a"], loaded["m"]) is None  # unknown is not different
    note = corpus_note(loaded["a"], loaded["c"])
    assert note == (f"note: the two runs were grounded on different default corpora (digest "
                    f"{shipped.info['digest'][:12]}... vs "
                    f"{corpus_digest(other.documents)[:12]}...)")

    runner = CliRunner()
    same = runner.invoke(app, ["eval", "compare", str(files["a"]), str(files["b"])])
    assert same.exit_code == 0, same.output
    assert "different default corpora" not in same.output
    for extra in ([], ["--json"]):
        res = runner.invoke(app, ["eval", "compare", str(files["a"]), str(files["c"]), *extra])
        assert res.exit_code == 0, res.output
        assert "grounded on different default corpora" in " ".join(res.output.split())
