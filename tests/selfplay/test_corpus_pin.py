"""A run keeps its default corpus (spadekit.selfplay.corpus_pin): a resumed run grounds on the
documents it began with, whatever spadekit is installed by then, says so when the default it
would get now is another, and a damaged copy is a CorpusError.

The default corpus is the file a spadekit release ships; another release may ship other
documents, and a resumed run that read them would draw other documents for the same stream
positions. The end-to-end test resumes a real run (tiny model, scripted designer, real sandbox)
after the default corpus changed.
"""

from __future__ import annotations

import gzip
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from spadekit.selfplay import corpus as corpus_module
from spadekit.selfplay.corpus import Corpus, CorpusError, Document, corpus_digest, default_corpus
from spadekit.selfplay.corpus_pin import PIN_NAME, pin, read_pinned, run_corpus


def docs(prefix: str, n: int) -> list[Document]:
    return [Document(f"{prefix}:{i}", f"Document {i} of {prefix}: é ✓ {'word ' * i}",
                     f"src-{prefix}") for i in range(n)]


def test_a_pinned_corpus_reads_back_the_same_documents_and_stream(tmp_path):
    original = Corpus(docs("a", 40), name="default", description="test", seed=5,
                      info={"spadekit": "9.9"})
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    run.mkdir()
    path = pin(original, run, cache)
    assert path == run / PIN_NAME
    again = read_pinned(path, seed=5)
    assert again.documents == original.documents
    assert [again.index_at(k) for k in range(50)] == [original.index_at(k) for k in range(50)]
    assert again.info["spadekit"] == "9.9" and again.name == "default"
    assert again.info["digest"] == corpus_digest(original.documents)
    # a second run links the same cached copy instead of writing another
    other = tmp_path / "run2"
    other.mkdir()
    pin(original, other, cache)
    assert (other / PIN_NAME).stat().st_ino == path.stat().st_ino
    assert len(list(cache.iterdir())) == 1


def test_a_resume_reads_the_pinned_corpus_even_when_the_default_changed(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus_module, "default_corpus",
                        lambda *a, **k: Corpus(docs("before", 30), name="default"))
    first = run_corpus("default", run, seed=1, resume=False)
    assert (run / PIN_NAME).exists()
    monkeypatch.setattr(corpus_module, "default_corpus",
                        lambda *a, **k: Corpus(docs("after", 7), name="default"))
    resumed = run_corpus("default", run, seed=1, resume=True)
    assert resumed.documents == first.documents and len(resumed) == 30
    # a path corpus is the user's own file: read as given, never copied
    user = tmp_path / "mine.jsonl"
    user.write_text(json.dumps({"text": "one document"}) + "\n")
    fresh = tmp_path / "run3"
    fresh.mkdir()
    assert len(run_corpus(str(user), fresh, seed=0, resume=False)) == 1
    assert not (fresh / PIN_NAME).exists()


def test_a_resume_says_when_its_pinned_corpus_is_not_the_current_default(tmp_path, caplog,
                                                                         monkeypatch):
    """The real shipped default: a new run pins it, and a resume of that run reports nothing;
    a run that pinned another default (as an older release shipped) resumes on its own copy,
    with a warning and ``info["corpus_changed"]`` naming both digests, for the run's events."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPADEKIT_CACHE", str(cache))
    shipped = default_corpus()
    current = run_corpus("default", _run(tmp_path, "new"), seed=3, resume=False)
    assert corpus_digest(current.documents) == shipped.info["digest"]
    assert (tmp_path / "new" / PIN_NAME).is_file()
    with caplog.at_level(logging.WARNING, logger="spadekit.selfplay.corpus_pin"):
        same = run_corpus("default", tmp_path / "new", seed=3, resume=True)
    assert same.documents == shipped.documents and "corpus_changed" not in same.info
    assert not caplog.records

    older = Corpus(docs("older-release", 12), name="default", description="an older default",
                   info={"spadekit": "0.0.9"})
    run = _run(tmp_path, "old")
    pin(older, run)
    with caplog.at_level(logging.WARNING, logger="spadekit.selfplay.corpus_pin"):
        resumed = run_corpus("default", run, seed=3, resume=True)
    assert resumed.documents == older.documents  # still grounded on what it began with
    assert resumed.info["corpus_changed"] == {
        "pinned_digest": corpus_digest(older.documents),
        "default_digest": shipped.info["digest"],
        "pinned_spadekit": "0.0.9", "default_spadekit": shipped.info["spadekit"]}
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and str(run / PIN_NAME) in record.getMessage()
    assert corpus_digest(older.documents)[:12] in record.getMessage()
    json.dumps(resumed.info["corpus_changed"])  # fit for an event as it is


def _run(tmp_path: Path, name: str) -> Path:
    run = tmp_path / name
    run.mkdir()
    return run


def rewrite(path: Path, edit) -> None:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    path.unlink()  # a link to the cache: replace it, leave the cached copy alone
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(edit(lines)) + "\n")


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "does not read"),
    (lambda p: p.write_bytes(b"plain text, not gzip"), "does not read"),
    (lambda p: rewrite(p, lambda ls: ls[:1] + [ls[1].replace("Document", "Forged")] + ls[2:]),
     "damaged"),
    (lambda p: rewrite(p, lambda ls: ls[:-1]), "damaged"),
    (lambda p: rewrite(p, lambda ls: ls[1:]), "not a spadekit corpus file"),
    (lambda p: rewrite(p, lambda ls: ls[:1] + ['{"id": 3}'] + ls[2:]), "not a document"),
], ids=["truncated", "not_gzip", "edited_text", "dropped_document", "no_header", "bad_record"])
def test_a_damaged_pinned_corpus_is_a_corpus_error(tmp_path, damage, message):
    run = tmp_path / "run"
    run.mkdir()
    path = pin(Corpus(docs("a", 5), name="default"), run, tmp_path / "cache")
    if path.stat().st_nlink > 1:  # damage the run's copy only
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
    damage(path)
    with pytest.raises(CorpusError, match=message) as err:
        read_pinned(path)
    assert str(path) in str(err.value) and "the run's pinned corpus" in str(err.value)
    assert read_pinned(next((tmp_path / "cache").iterdir())).documents == docs("a", 5)


def test_a_real_run_resumes_on_its_own_corpus_after_the_default_changed(tmp_path, monkeypatch):
    """Round 0 grounds on the real default corpus; then the default changes (as upgrading to
    a release that ships another one changes it) and the run resumes: round 1's environments
    name documents of the corpus the run began with. Without the pin this resume stopped with
    a CorpusError (another document count)."""
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay
    from test_selfplay import WORDS, config, designer_responder

    monkeypatch.setenv("SPADEKIT_CACHE", str(tmp_path / "cache"))
    policy = load_policy("tiny")
    designer = ScriptedPolicy(policy.tokenizer, designer_responder(WORDS))
    with SelfPlay(config(tmp_path, rounds=1), tmp_path / "run", policy=policy,
                  designer_policy=designer) as sp:
        sp.run()
        began = {d.id for d in sp.corpus.documents}
    monkeypatch.setattr(corpus_module, "default_corpus",
                        lambda *a, **k: Corpus(docs("changed", 3), name="default"))
    with SelfPlay(config(tmp_path, rounds=2), tmp_path / "run", policy=load_policy("tiny"),
                  designer_policy=designer, resume=True) as sp:
        sp.run()
    con = sqlite3.connect(tmp_path / "run" / "run.sqlite")
    rows = con.execute("SELECT created_step, lineage FROM environments").fetchall()
    con.close()
    ids = {r: set() for r in (0, 1)}
    for rnd, lineage in rows:
        ids.setdefault(rnd, set()).add(json.loads(lineage or "{}").get("doc_id"))
    assert ids[1] and ids[1] <= began, ids


def test_a_resume_whose_pinned_copy_is_missing_says_so_and_pins_again(tmp_path, caplog):
    from spadekit.selfplay.corpus_pin import PIN_NAME, run_corpus

    run = tmp_path / "run"
    run.mkdir()
    first = run_corpus(None, run, seed=0, resume=False)
    assert (run / PIN_NAME).exists() and "corpus_changed" not in first.info
    (run / PIN_NAME).unlink()
    with caplog.at_level("WARNING"):
        again = run_corpus(None, run, seed=0, resume=True)
    changed = again.info["corpus_changed"]
    assert changed["pinned_digest"] is None and changed["reason"] == f"{PIN_NAME} is missing"
    assert changed["default_digest"] == first.info["digest"]
    assert "is missing" in caplog.text and (run / PIN_NAME).exists()
    assert "corpus_changed" not in run_corpus(None, run, seed=0, resume=True).info
