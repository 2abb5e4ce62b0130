"""A run keeps its default corpus (spadekit.selfplay.corpus_pin): a resumed run grounds on the
documents it began with, whatever is installed by then, and a damaged copy is a CorpusError.

The default corpus holds installed packages' docstrings, so installing another numpy changed it
under a run: the resume stopped with a CorpusError (count differs) or, with the same count,
would have drawn other documents. The end-to-end test resumes a real run (tiny model, scripted
designer, real sandbox) after the default corpus changed.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from spadekit.selfplay import corpus as corpus_module
from spadekit.selfplay.corpus import Corpus, CorpusError, Document
from spadekit.selfplay.corpus_pin import PIN_NAME, pin, read_pinned, run_corpus


def docs(prefix: str, n: int) -> list[Document]:
    return [Document(f"{prefix}:{i}", f"Document {i} of {prefix}: é ✓ {'word ' * i}",
                     f"src-{prefix}") for i in range(n)]


def test_a_pinned_corpus_reads_back_the_same_documents_and_stream(tmp_path):
    original = Corpus(docs("a", 40), name="default", description="test", seed=5,
                      info={"package_versions": {"numpy": "9.9"}})
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    run.mkdir()
    path = pin(original, run, cache)
    assert path == run / PIN_NAME
    again = read_pinned(path, seed=5)
    assert again.documents == original.documents
    assert [again.index_at(k) for k in range(50)] == [original.index_at(k) for k in range(50)]
    assert again.info["package_versions"] == {"numpy": "9.9"} and again.name == "default"
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
    (lambda p: rewrite(p, lambda ls: ls[1:]), "not a pinned corpus"),
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
    with pytest.raises(CorpusError, match=message):
        read_pinned(path)
    assert read_pinned(next((tmp_path / "cache").iterdir())).documents == docs("a", 5)


def test_a_real_run_resumes_on_its_own_corpus_after_the_default_changed(tmp_path, monkeypatch):
    """Round 0 grounds on the real default corpus; then the default changes (as installing
    another numpy changes it) and the run resumes: round 1's environments name documents of
    the corpus the run began with. Before pinning this resume stopped with a CorpusError."""
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
