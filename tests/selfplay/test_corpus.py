"""Corpus sources, truncation, seeded sampling with resumable state, and the default corpus
(what it holds; that it is the same whatever is installed: test_corpus_default.py)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random

import pytest

from spadekit.selfplay.corpus import (Corpus, CorpusError, Document, count_words, default_corpus,
                                      load_corpus, truncate_words)


def test_truncate_words_keeps_formatting():
    text = "def f(x):\n    return x  +  1\n\nprint(f(2))\n"
    assert truncate_words(text, 3) == "def f(x):\n    return"
    assert truncate_words(text, 100) == text
    assert truncate_words(text, 0) == ""
    assert count_words(text) == 7
    with pytest.raises(ValueError):
        truncate_words(text, -1)


def _write_jsonl(path, records, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in records)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(data)
    else:
        path.write_text(data + "\n")


def test_jsonl_text_and_orig_doc(tmp_path):
    path = tmp_path / "docs.jsonl"
    _write_jsonl(path, [{"text": "alpha beta gamma delta", "id": "x1"},
                        {"orig_doc": "one two three"}, {"text": ""}, {"text": None},
                        {"text": "last words here"}])
    corpus = load_corpus(str(path), max_words=2)
    assert len(corpus) == 3
    assert [d.id for d in corpus.documents] == ["docs.jsonl#x1", "docs.jsonl:2", "docs.jsonl:5"]
    assert corpus[0].text == "alpha beta" and corpus.documents[0].text.endswith("delta")
    assert corpus.describe()["documents"] == 3 and corpus.describe()["truncate_to"] == 2
    gz = tmp_path / "docs.jsonl.gz"
    _write_jsonl(gz, [{"text": "zipped text"}], gz=True)
    assert [d.text for d in load_corpus(gz)] == ["zipped text"]


def test_jsonl_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{oops\n')
    with pytest.raises(CorpusError, match="bad.jsonl:2"):
        len(load_corpus(bad))
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"body": "x"}\n')
    with pytest.raises(CorpusError, match="nofield.jsonl:1.*'text'"):
        len(load_corpus(nofield))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CorpusError, match="no documents"):
        len(load_corpus(empty))
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(CorpusError, match="unknown corpus format"):
        load_corpus(tmp_path / "x.csv")


def test_folder_of_text_files(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\nSome markdown words.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("plain text file")
    (tmp_path / "sub" / "more.jsonl").write_text('{"text": "from jsonl"}\n')
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / ".hidden.txt").write_text("secret")
    (tmp_path / "skip.py").write_text("print(1)")
    corpus = load_corpus(tmp_path)
    assert [d.id for d in corpus.documents] == ["b.md", "sub/a.txt", "sub/more.jsonl:1"]
    assert corpus[1].text == "plain text file"
    single = load_corpus(tmp_path / "b.md")
    assert len(single) == 1 and single[0].id == "b.md"


def test_parquet(tmp_path):
    path = tmp_path / "docs.parquet"
    if importlib.util.find_spec("pyarrow") is None:
        path.write_bytes(b"PAR1")
        with pytest.raises(CorpusError, match="pyarrow"):
            len(load_corpus(path))
        pytest.skip("pyarrow is not installed")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"orig_doc": ["first doc here", "second doc", None]}), path)
    corpus = load_corpus(path)
    assert [d.text for d in corpus] == ["first doc here", "second doc"]
    assert corpus.documents[0].id == "docs.parquet:0"


def test_hf_dataset_directory(tmp_path):
    path = tmp_path / "ds"
    if importlib.util.find_spec("datasets") is None:
        path.mkdir()
        (path / "dataset_info.json").write_text("{}")
        with pytest.raises(CorpusError, match="datasets"):
            len(load_corpus(path))
        pytest.skip("datasets is not installed")
    import datasets

    datasets.Dataset.from_dict({"text": ["hello world", "another one"]}).save_to_disk(str(path))
    corpus = load_corpus(path)
    assert [d.text for d in corpus] == ["hello world", "another one"]


def _corpus(n=50):
    return Corpus([Document(f"d{i}", f"document number {i}") for i in range(n)], name="t")


def test_sampling_is_reproducible_and_resumable():
    a, b = _corpus(), _corpus()
    first = [a.sample().id for _ in range(20)]
    assert first == [b.sample().id for _ in range(20)]
    assert len(set(first)) > 8 and a.position == 20
    state = json.loads(json.dumps(a.state()))
    later = [a.sample().id for _ in range(10)]
    c = _corpus()
    c.set_state(state)
    assert [c.sample().id for _ in range(10)] == later
    with pytest.raises(CorpusError, match="not the same corpus"):
        _corpus(7).set_state(state)
    # an explicit generator drives the draw and leaves the stream alone
    d = _corpus()
    assert d.sample(random.Random(3)).id == d.sample(random.Random(3)).id and d.position == 0


def test_sampling_is_uniform():
    corpus = _corpus(5)
    counts = {}
    for _ in range(5000):
        doc = corpus.sample()
        counts[doc.id] = counts.get(doc.id, 0) + 1
    assert len(counts) == 5 and min(counts.values()) > 850 and max(counts.values()) < 1150


def test_lazy_loading():
    calls = []

    def loader():
        calls.append(1)
        return [Document("a", "text")]

    corpus = Corpus(loader, name="lazy")
    assert calls == [] and "unloaded" in repr(corpus)
    assert len(corpus) == 1 and len(corpus) == 1 and calls == [1]


def test_default_corpus():
    corpus = load_corpus(None, max_words=6000)
    assert load_corpus("default").documents == corpus.documents
    info = corpus.describe()
    assert info["name"] == "default" and info["documents"] == len(corpus) > 300
    assert info["words"] > 40_000 and info["python"] and info["spadekit"]
    ids = [d.id for d in corpus.documents]
    assert len(ids) == len(set(ids)) and "stdlib:heapq" in ids
    assert all(i.startswith("stdlib:") for i in ids)  # the standard library's, nothing else
    modules = set(info["stdlib_modules"])
    assert {d.source.split(":", 1)[1] for d in corpus.documents} <= modules
    for doc in corpus.documents:  # "<qualname><signature>\n\n<docstring>"
        head, body = doc.text.split("\n\n", 1)
        assert doc.id.split(":", 1)[1] in head
        prose = sum(w[:1].isalpha() for w in body.split())
        assert prose >= info["min_prose_words"] // 2, doc.id
    small = default_corpus(max_words=50)
    assert all(count_words(d.text) <= 50 for d in small)
    again = default_corpus(max_words=50)
    assert [small.sample().id for _ in range(5)] == [again.sample().id for _ in range(5)]
