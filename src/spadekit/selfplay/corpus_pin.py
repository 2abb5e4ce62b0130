"""A run's own copy of the default corpus, so that a resumed run grounds on the documents it
began with.

The default corpus is built from the docstrings of installed packages (numpy, scipy, ...), so
it changes when they do: beside another numpy a resumed run would draw other documents for the
same stream positions (``Corpus.set_state`` refused that with ``CorpusError`` when the count
differed, and could not notice when it did not). A new run grounded on the default therefore
keeps its documents in ``run_dir/corpus.jsonl.gz``, and a resumed run reads them from there,
whatever is installed by then.

The file is a hard link to one cached copy per distinct corpus (``<cache>/corpora/``, about
2.4 MB for the default), so a new run costs a link, not a 7.8 MB write; where a link cannot be
made (another file system) it is a copy. Line 1 is a header (format, name, description, info,
document count, digest); each further line is one document ``{"id", "text", "source"}``. A
file that does not read back to its digest is a ``CorpusError`` naming the file: the run stops
rather than ground on other documents. A run made before pinning has no file and rebuilds the
default as before. Corpora from a path are the user's own files and are not copied.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from spadekit.selfplay.corpus import Corpus, CorpusError, Document, load_corpus

PIN_NAME = "corpus.jsonl.gz"
FORMAT = 1


def is_default(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "default"))


def corpus_digest(documents: list[Document]) -> str:
    """SHA-256 over every document's id, text and source, in order."""
    h = hashlib.sha256()
    for doc in documents:
        for part in (doc.id, doc.text, doc.source):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        h.update(b"\n")
    return h.hexdigest()


def write_pinned(corpus: Corpus, path: Path, digest: str | None = None) -> str:
    """Write ``corpus`` to ``path`` (atomically: a unique temporary file, then a rename);
    returns the digest."""
    docs = corpus.documents
    digest = digest or corpus_digest(docs)
    header = {"spadekit_corpus": FORMAT, "name": corpus.name, "description": corpus.description,
              "info": corpus.info, "documents": len(docs), "digest": digest}
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as fh:
            fh.write(json.dumps(header) + "\n")
            for doc in docs:
                fh.write(json.dumps({"id": doc.id, "text": doc.text, "source": doc.source}) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def read_pinned(path: Path, *, seed: int = 0) -> Corpus:
    """The corpus kept at ``path``; ``CorpusError`` when it is damaged or not a pinned corpus."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        header = json.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("spadekit_corpus") != FORMAT:
            raise CorpusError(f"{path}: not a pinned corpus (format {FORMAT} header missing)")
        docs = []
        for lineno, line in enumerate(lines[1:], 2):
            record = json.loads(line)
            if not (isinstance(record, dict) and all(isinstance(record.get(k), str)
                                                     for k in ("id", "text", "source"))):
                raise CorpusError(f"{path}:{lineno}: not a document record")
            docs.append(Document(record["id"], record["text"], record["source"]))
    except CorpusError:
        raise
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
        raise CorpusError(f"{path}: the run's pinned corpus does not read "
                          f"({type(exc).__name__}: {exc})") from None
    if len(docs) != header.get("documents") or corpus_digest(docs) != header.get("digest"):
        raise CorpusError(f"{path}: the run's pinned corpus is damaged (its documents do not "
                          "match the digest written with them)")
    if not docs:
        raise CorpusError(f"{path}: the run's pinned corpus holds no documents")
    info = dict(header.get("info") or {})
    info["pinned"] = str(path)
    return Corpus(docs, name=str(header.get("name") or "default"),
                  description=str(header.get("description") or ""), seed=seed, info=info)


def pin(corpus: Corpus, run_dir: Path, cache: Path | None = None) -> Path:
    """Keep ``corpus`` in ``run_dir`` (a link to the cached copy of the same digest)."""
    if cache is None:
        from spadekit.policy.bundled import cache_dir

        cache = cache_dir() / "corpora"
    digest = corpus_digest(corpus.documents)
    target = Path(run_dir) / PIN_NAME
    try:
        cache.mkdir(parents=True, exist_ok=True)
        cached = cache / f"{corpus.name}-{digest[:24]}.jsonl.gz"
        if not cached.exists():
            write_pinned(corpus, cached, digest)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            os.link(cached, tmp)
        except OSError:  # another file system, or links not allowed: a copy
            shutil.copyfile(cached, tmp)
        os.replace(tmp, target)
    except OSError:  # no usable cache: write the run's copy directly
        write_pinned(corpus, target, digest)
    return target


def run_corpus(spec: Any, run_dir: Path, *, seed: int, resume: bool) -> Corpus:
    """The corpus a run grounds on: a resumed run's pinned copy when it has one; otherwise
    ``load_corpus(spec)``, pinned into a new run's directory when it is the default."""
    path = Path(run_dir) / PIN_NAME
    if is_default(spec) and path.exists():
        return read_pinned(path, seed=seed)
    corpus = load_corpus(spec, seed=seed)
    if is_default(spec) and not resume:
        pin(corpus, run_dir)
    return corpus
