"""Grounding corpora for the environment designer (SPEC point 10).

A :class:`Corpus` is an ordered list of :class:`Document` objects with uniform, seeded sampling.
:func:`load_corpus` reads ``None``/``"default"`` (the shipped standard-library docstrings,
``data/default_corpus.jsonl.gz``: the same on every machine, no download), ``.jsonl``/``.jsonl.gz``
lines or ``.parquet`` with a ``text`` (or ``orig_doc``) field, a Hugging Face dataset saved with
``save_to_disk``, or a directory of ``.txt``/``.md``/``.jsonl``/``.parquet`` files. The corpus
file format (:func:`write_corpus_file`, :func:`read_corpus_file`) is gzip JSON lines with a
header carrying :func:`corpus_digest`; a file that does not read back to it is a ``CorpusError``.
:meth:`Corpus.sample` draws ``k`` as ``Random(f"{seed}/{k}")``: the state is ``(seed, position)``,
so :meth:`Corpus.state`/:meth:`Corpus.set_state` resume a stream exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import json
import os
import random
import re
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from spadekit.common import safe_json

__all__ = [
    "DEFAULT_CORPUS_FILE",
    "Corpus",
    "CorpusError",
    "Document",
    "corpus_digest",
    "count_words",
    "default_corpus",
    "load_corpus",
    "read_corpus_file",
    "truncate_words",
    "write_corpus_file",
]

TEXT_FIELDS = ("text", "orig_doc")
_WORD = re.compile(r"\S+")

#: The default corpus spadekit ships (built by ``scripts/build_default_corpus.py``).
DEFAULT_CORPUS_FILE = Path(__file__).resolve().parent / "data" / "default_corpus.jsonl.gz"
#: The corpus file format's version, line 1's ``spadekit_corpus``.
FILE_FORMAT = 1


class CorpusError(ValueError):
    """A corpus could not be read: missing file, unknown format, bad record, missing package."""


@dataclasses.dataclass(frozen=True)
class Document:
    """One grounding document. ``id`` is stable across runs (path:line, record id, qualname)."""

    id: str
    text: str
    source: str = ""

    @property
    def words(self) -> int:
        return count_words(self.text)

    def truncated(self, max_words: int | None) -> "Document":
        """A copy cut to ``max_words`` words (unchanged when shorter or ``max_words`` is None)."""
        if max_words is None:
            return self
        text = truncate_words(self.text, max_words)
        return self if text == self.text else dataclasses.replace(self, text=text)


def count_words(text: str) -> int:
    """Whitespace-separated words in ``text``."""
    return sum(1 for _ in _WORD.finditer(text))


def truncate_words(text: str, max_words: int) -> str:
    """``text`` cut after its ``max_words``-th whitespace-separated word.

    The original spacing and line breaks before the cut are kept (code stays readable); the text
    is returned unchanged when it has at most ``max_words`` words.
    """
    if max_words < 0:
        raise ValueError("max_words must be >= 0")
    if max_words == 0:
        return ""
    for i, match in enumerate(_WORD.finditer(text), 1):
        if i == max_words:
            return text[: match.end()]
    return text


class Corpus:
    """Documents with uniform seeded sampling and a resumable stream.

    ``documents`` is a list or a zero-argument callable returning one (loaded on first use).
    ``max_words`` truncates every document handed out (``None``: no truncation).
    """

    def __init__(self, documents: list[Document] | Callable[[], list[Document]], *,
                 name: str = "corpus", description: str = "", max_words: int | None = None,
                 seed: int = 0, info: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.description = description
        self.max_words = max_words
        self.info = dict(info or {})
        self._loader = documents if callable(documents) else None
        self._docs: list[Document] | None = None if callable(documents) else list(documents)
        self.seed = int(seed)
        self.position = 0

    # -- contents ------------------------------------------------------------------------------

    @property
    def documents(self) -> list[Document]:
        if self._docs is None:
            assert self._loader is not None
            docs = list(self._loader())
            if not docs:
                raise CorpusError(f"corpus {self.name!r} holds no documents")
            self._docs = docs
        return self._docs

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> Document:
        return self.documents[index].truncated(self.max_words)

    def __iter__(self):
        return (doc.truncated(self.max_words) for doc in self.documents)

    def with_max_words(self, max_words: int | None) -> "Corpus":
        """A view of the same documents with another truncation (shares the loaded list)."""
        other = Corpus(self.documents, name=self.name, description=self.description,
                       max_words=max_words, seed=self.seed, info=self.info)
        other.position = self.position
        return other

    # -- sampling ------------------------------------------------------------------------------

    def sample(self, rng: random.Random | None = None) -> Document:
        """One document drawn uniformly: from ``rng`` when given, else from the corpus's own
        stream (which then advances :attr:`position` by one)."""
        if rng is not None:
            return self[rng.randrange(len(self))]
        index = self.index_at(self.position)
        self.position += 1
        return self[index]

    def index_at(self, position: int) -> int:
        """Index of the document drawn at ``position`` of this corpus's stream."""
        return random.Random(f"{self.seed}/{position}").randrange(len(self))

    def state(self) -> dict[str, Any]:
        """JSON-safe sampling state: restore with :meth:`set_state` to continue the stream."""
        return {"name": self.name, "seed": self.seed, "position": self.position,
                "size": len(self)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if state.get("size") not in (None, len(self)):
            raise CorpusError(f"corpus state was saved for {state['size']} documents, but "
                              f"{self.name!r} holds {len(self)}: not the same corpus")
        self.seed = int(state.get("seed", self.seed))
        self.position = int(state["position"])

    # -- description ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the corpus holds: name, description, document and word counts, truncation."""
        words = [count_words(d.text) for d in self.documents]
        out = {"name": self.name, "description": self.description, "documents": len(words),
               "words": sum(words), "mean_words": round(sum(words) / len(words), 1),
               "max_words_per_document": max(words), "truncate_to": self.max_words}
        out.update(self.info)
        return out

    def __repr__(self) -> str:
        size = "unloaded" if self._docs is None else f"{len(self._docs)} documents"
        return f"Corpus({self.name!r}, {size})"


# ---------------------------------------------------------------------------------------------
# file sources
# ---------------------------------------------------------------------------------------------


def _text_of(record: Any, where: str) -> str | None:
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in TEXT_FIELDS:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value
    if not any(key in record for key in TEXT_FIELDS):
        raise CorpusError(f"{where}: no 'text' or 'orig_doc' field (keys: "
                          f"{', '.join(sorted(map(str, record))[:8])})")
    return None  # present but empty or null: skipped


def _read_jsonl(path: Path, label: str) -> list[Document]:
    opener = gzip.open if path.suffix == ".gz" else open
    docs = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:  # the hardened decoder, bounded nesting (NaN, in fields unused here: None)
                record = safe_json.decode(line, nonfinite="null").value
            except safe_json.UntrustedJsonError as exc:
                raise CorpusError(f"{where}: invalid JSON ({exc.detail})") from None
            text = _text_of(record, where)
            if text is None:
                continue
            rid = record.get("id")
            doc_id = f"{label}#{rid}" if isinstance(rid, (str, int)) else f"{label}:{lineno}"
            docs.append(Document(doc_id, text, str(path)))
    return docs


def _read_parquet(path: Path, label: str) -> list[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or "
                          "convert the file to JSONL with a 'text' field") from None
    names = pq.read_schema(path).names
    column = next((c for c in TEXT_FIELDS if c in names), None)
    if column is None:
        raise CorpusError(f"{path}: no 'text' or 'orig_doc' column (columns: {', '.join(names)})")
    columns = [column] + (["id"] if "id" in names else [])
    table = pq.read_table(path, columns=columns).to_pydict()
    return _column_documents(table[column], table.get("id"), label, path)


def _read_hf_dataset(path: Path) -> list[Document]:
    try:
        import datasets
    except ImportError:
        raise CorpusError(f"{path}: this is a Hugging Face dataset directory; reading it needs "
                          "the 'datasets' package (pip install datasets)") from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        split = "train" if "train" in data else sorted(data)[0]
        data = data[split]
    column = next((c for c in TEXT_FIELDS if c in data.column_names), None)
    if column is None:
        raise CorpusError(f"{path}: no 'text' or 'orig_doc' column "
                          f"(columns: {', '.join(data.column_names)})")
    ids = data["id"] if "id" in data.column_names else None
    return _column_documents(data[column], ids, path.name, path)


def _column_documents(texts, ids, label: str, path: Path) -> list[Document]:
    """Documents from a text column (and an optional id column) of a table; empty rows skipped.
    Ids are ``label#id`` when an id exists, else ``label:row``."""
    docs = []
    for row, text in enumerate(texts):
        if isinstance(text, str) and text.strip():
            key = f"#{ids[row]}" if ids is not None and ids[row] is not None else f":{row}"
            docs.append(Document(f"{label}{key}", text, str(path)))
    return docs


_HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _read_folder(path: Path) -> list[Document]:
    docs: list[Document] = []
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        suffix = file.suffix.lower()
        if suffix in (".txt", ".md"):
            text = file.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                docs.append(Document(rel, text, str(file)))
        elif suffix == ".jsonl" or file.name.endswith(".jsonl.gz"):
            docs += _read_jsonl(file, rel)
        elif suffix == ".parquet":
            docs += _read_parquet(file, rel)
    return docs


def _file_loader(path: Path) -> Callable[[], list[Document]]:
    name = path.name
    if path.is_dir():
        if any((path / marker).exists() for marker in _HF_MARKERS):
            return lambda: _read_hf_dataset(path)
        return lambda: _read_folder(path)
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json")):
        return lambda: _read_jsonl(path, path.name)
    if name.endswith(".parquet"):
        return lambda: _read_parquet(path, path.name)
    if name.endswith((".txt", ".md")):
        return lambda: [Document(path.name, path.read_text(encoding="utf-8"), str(path))]
    raise CorpusError(f"{path}: unknown corpus format (use .jsonl, .parquet, a folder of "
                      ".txt/.md files, or a Hugging Face dataset directory)")


def load_corpus(spec: str | Path | Corpus | None = None, *, max_words: int | None = None,
                seed: int = 0) -> Corpus:
    """A corpus from ``spec``: ``None``/``"default"`` (the shipped default), a path, or a Corpus.

    Files are read lazily (on first use); a missing path is an error at once.
    """
    if isinstance(spec, Corpus):
        return spec if max_words is None else spec.with_max_words(max_words)
    if spec is None or str(spec).strip().lower() in ("", "default"):
        return default_corpus(max_words=max_words, seed=seed)
    path = Path(spec).expanduser()
    if not path.exists():
        raise CorpusError(f"corpus not found: {path} (give a .jsonl/.parquet file, a folder, or "
                          "'default')")
    loader = _file_loader(path)
    kind = "folder" if path.is_dir() else path.suffix.lstrip(".")
    return Corpus(loader, name=str(path), description=f"{kind} corpus at {path}",
                  max_words=max_words, seed=seed, info={"path": str(path)})


# ---------------------------------------------------------------------------------------------
# the corpus file format, and the shipped default corpus
# ---------------------------------------------------------------------------------------------


def corpus_digest(documents: Iterable[Document]) -> str:
    """SHA-256 over every document's id, text and source, in order."""
    h = hashlib.sha256()
    for doc in documents:
        for part in (doc.id, doc.text, doc.source):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        h.update(b"\n")
    return h.hexdigest()


def write_corpus_file(path: Path, documents: list[Document], *, name: str, description: str = "",
                      info: Mapping[str, Any] | None = None, notice: str | None = None,
                      digest: str | None = None, compresslevel: int = 9) -> str:
    """Write ``documents`` in the corpus file format (atomically: a unique temporary file, then
    a rename); returns their digest. The bytes depend only on the arguments (and zlib): keys in
    a fixed order, ASCII JSON, gzip with mtime 0 and no file name."""
    digest = digest or corpus_digest(documents)
    header: dict[str, Any] = {"spadekit_corpus": FILE_FORMAT}
    if notice is not None:  # first, where ``zcat FILE | head -c 400`` shows it
        header["notice"] = notice
    header.update(name=name, description=description, documents=len(documents), digest=digest,
                  info=dict(sorted(dict(info or {}).items())))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                                                    compresslevel=compresslevel) as gz:
            gz.write((json.dumps(header) + "\n").encode("ascii"))
            for doc in documents:
                gz.write((json.dumps({"id": doc.id, "source": doc.source, "text": doc.text},
                                     sort_keys=True) + "\n").encode("ascii"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def read_corpus_file(path: Path, *, what: str = "corpus file"
                     ) -> tuple[list[Document], dict[str, Any]]:
    """``(documents, header)`` of a file written by :func:`write_corpus_file`. Anything else (not
    gzip, truncated, no header, a bad record, documents that do not match the header's count and
    digest, none at all) is a ``CorpusError`` naming ``path`` and ``what`` it is."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") as fh:
            lines = fh.read().decode("utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        header = json.loads(lines[0]) if lines else None
        if not isinstance(header, dict) or header.get("spadekit_corpus") != FILE_FORMAT \
                or not isinstance(header.get("info", {}), dict):
            raise CorpusError(f"{path}: {what} is not a spadekit corpus file (format "
                              f"{FILE_FORMAT} header missing)")
        docs = []
        for lineno, line in enumerate(lines[1:], 2):
            record = json.loads(line)
            if not (isinstance(record, dict) and all(isinstance(record.get(k), str)
                                                     for k in ("id", "text", "source"))):
                raise CorpusError(f"{path}:{lineno}: {what}: not a document record")
            docs.append(Document(record["id"], record["text"], record["source"]))
    except CorpusError:
        raise
    except (OSError, EOFError, zlib.error, ValueError, RecursionError) as exc:
        raise CorpusError(f"{path}: {what} does not read ({type(exc).__name__}: {exc})") from None
    if len(docs) != header.get("documents") or corpus_digest(docs) != header.get("digest"):
        raise CorpusError(f"{path}: {what} is damaged (its documents do not match the digest "
                          "written with them)")
    if not docs:
        raise CorpusError(f"{path}: {what} holds no documents")
    return docs, header


@functools.lru_cache(maxsize=4)
def _shipped(path: Path) -> tuple[tuple[Document, ...], str, dict[str, Any]]:
    docs, header = read_corpus_file(path, what="the default corpus file")
    info = {**header.get("info", {}), "digest": header["digest"]}
    return tuple(docs), str(header.get("description") or ""), info


def default_corpus(max_words: int | None = None, seed: int = 0, *,
                   path: Path | None = None) -> Corpus:
    """The default corpus: the documents of the file spadekit ships (:data:`DEFAULT_CORPUS_FILE`,
    read and checked against its digest once per process).

    Contents: docstrings of standard-library modules, fixed when the release was built (see the
    file's header, or ``data/README.md``); ``info`` holds the ``digest``
    (:func:`corpus_digest`), the ``spadekit`` and ``python`` versions that built the file, its
    module list and minimum prose words. ``path``: another file in the same format (a
    maintainer's new build). A damaged file is a ``CorpusError`` naming it.
    """
    docs, description, info = _shipped(Path(path or DEFAULT_CORPUS_FILE))
    return Corpus(list(docs), name="default", description=description, max_words=max_words,
                  seed=seed, info=info)
