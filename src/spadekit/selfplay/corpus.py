"""Grounding corpora for the environment designer (SPEC point 10).

A :class:`Corpus` is an ordered list of :class:`Document` objects with uniform, seeded sampling.
Every designer prompt is grounded on one sampled document, truncated to a word budget (6000 words
for games, 4000 for tool use in the paper).

Sources (:func:`load_corpus`):

- ``None`` / ``"default"``: the offline default corpus (:func:`default_corpus`), built from
  documentation already installed on this machine: docstrings of Python standard library modules
  and, when installed, of scientific packages (numpy, scipy, networkx, sympy). No download.
- ``PATH.jsonl`` (also ``.jsonl.gz``/``.json`` lines): one JSON object per line with a ``text`` (or
  ``orig_doc``) string; an ``id`` field is used when present.
- ``PATH.parquet``: a ``text`` (or ``orig_doc``) column; needs ``pyarrow``.
- a directory holding ``dataset_info.json``/``state.json``/``dataset_dict.json``: a Hugging Face
  dataset saved with ``save_to_disk`` (needs ``datasets``; a ``DatasetDict`` uses its ``train``
  split, else the first split by name).
- any other directory: every ``.txt``/``.md`` file below it (one document each), plus any
  ``.jsonl``/``.parquet`` files, in sorted path order.

Sampling: :meth:`Corpus.sample` without an argument draws from the corpus's own stream, whose
state is just ``(seed, position)``: draw ``k`` is ``random.Random(f"{seed}/{k}").randrange(len)``,
so :meth:`Corpus.state` / :meth:`Corpus.set_state` resume a stream exactly, at no cost. With an
explicit ``random.Random`` it draws from that generator instead.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib
import inspect
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from spadekit.common import safe_json

__all__ = [
    "DEFAULT_MIN_WORDS",
    "DEFAULT_SCIENTIFIC_MODULES",
    "DEFAULT_STDLIB_MODULES",
    "Corpus",
    "CorpusError",
    "Document",
    "count_words",
    "default_corpus",
    "load_corpus",
    "truncate_words",
]

TEXT_FIELDS = ("text", "orig_doc")
_WORD = re.compile(r"\S+")
_PROSE_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")

#: Standard library modules whose documentation makes up the default corpus.
DEFAULT_STDLIB_MODULES: tuple[str, ...] = (
    "argparse", "array", "ast", "asyncio", "base64", "bisect", "calendar", "cmath", "codecs",
    "collections", "colorsys", "concurrent.futures", "configparser", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
    "ftplib", "functools", "graphlib", "hashlib", "heapq", "html", "http.client", "http.cookies",
    "imaplib", "inspect", "ipaddress", "itertools", "json", "logging", "math", "mimetypes",
    "numbers", "operator", "pickle", "pprint", "queue", "random", "re", "sched", "secrets",
    "shlex", "shutil", "smtplib", "sqlite3", "statistics", "string", "struct", "tarfile",
    "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "unicodedata",
    "urllib.parse", "urllib.request", "uuid", "wave", "xml.etree.ElementTree", "zipfile", "zlib",
)
#: Scientific modules added when importable (each skipped silently when missing).
DEFAULT_SCIENTIFIC_MODULES: tuple[str, ...] = (
    "numpy", "numpy.fft", "numpy.linalg", "numpy.polynomial.polynomial", "numpy.random",
    "scipy.integrate", "scipy.interpolate", "scipy.linalg", "scipy.optimize", "scipy.signal",
    "scipy.sparse.csgraph", "scipy.spatial", "scipy.special", "scipy.stats",
    "networkx.algorithms", "sympy",
)
#: A docstring enters the default corpus only with at least this many prose words.
DEFAULT_MIN_WORDS = 60


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

    def reseed(self, seed: int) -> None:
        self.seed, self.position = int(seed), 0

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
    """A corpus from ``spec``: ``None``/``"default"`` (the offline default), a path, or a Corpus.

    Files are read lazily (on first use); a missing path is an error at once.
    """
    if isinstance(spec, Corpus):
        return spec if max_words is None else spec.with_max_words(max_words)
    if spec is None or str(spec).strip().lower() in ("", "default"):
        base = default_corpus()
        corpus = Corpus(base.documents, name=base.name, description=base.description,
                        max_words=max_words, seed=seed, info=base.info)
        return corpus
    path = Path(spec).expanduser()
    if not path.exists():
        raise CorpusError(f"corpus not found: {path} (give a .jsonl/.parquet file, a folder, or "
                          "'default')")
    loader = _file_loader(path)
    kind = "folder" if path.is_dir() else path.suffix.lstrip(".")
    return Corpus(loader, name=str(path), description=f"{kind} corpus at {path}",
                  max_words=max_words, seed=seed, info={"path": str(path)})


# ---------------------------------------------------------------------------------------------
# the offline default corpus
# ---------------------------------------------------------------------------------------------


def _prose_words(text: str) -> int:
    return len(_PROSE_WORD.findall(text))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
_MAY_VARY = re.compile(r"(?m)^(\s*)\S.*?\s*# may vary$")
"""An example's output line that its own docstring marks as varying (scipy.stats draws them
at import): its value is taken out, so the document is the same in every process."""


def _signature(obj: Any) -> str:
    """``obj``'s signature, with the memory addresses of default values' reprs taken out
    (``fallback=<object object at 0x7f...>``): they change with every process, and the corpus
    must be the same in each."""
    try:
        return _ADDRESS.sub(">", str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return ""


def _members(module: Any) -> Iterable[tuple[str, Any]]:
    """Public functions and classes of ``module`` (its ``__all__`` when defined), sorted."""
    names = getattr(module, "__all__", None)
    if not isinstance(names, (list, tuple)):
        names = [n for n in dir(module) if not n.startswith("_")]
    for name in sorted({str(n) for n in names}):
        try:
            obj = getattr(module, name)
        except Exception:  # noqa: BLE001 - lazy attributes may fail to import
            continue
        if inspect.ismodule(obj) or not _native(obj, module.__name__):
            continue
        if callable(obj):
            yield name, obj


def _native(obj: Any, modname: str) -> bool:
    """Whether ``obj`` belongs to the package of ``modname``. Other packages patch things into
    modules and classes they do not own (transformers adds methods to ``logging.Logger``), and
    lazily exposed aliases appear only after some import: keeping only native objects makes the
    corpus the same in every process, which resuming a run's sampling stream relies on."""
    owner = getattr(obj, "__module__", None)
    if not isinstance(owner, str):
        return True  # builtins without a module (C functions of the module itself)
    root = modname.split(".")[0]
    return owner == root or owner.startswith(root + ".") or owner.lstrip("_").split(".")[0] \
        == root.lstrip("_")


def _module_documents(modname: str, origin: str, min_words: int) -> list[Document]:
    try:
        module = importlib.import_module(modname)
    except Exception:  # noqa: BLE001 - an optional package that is missing or broken
        return []
    docs: list[Document] = []

    def add(qualname: str, obj: Any, header: str) -> None:
        doc = inspect.getdoc(obj)
        if isinstance(doc, str) and _prose_words(doc) >= min_words:
            doc = _MAY_VARY.sub(r"\1...  # may vary", doc)
            docs.append(Document(f"{origin}:{qualname}", f"{header}\n\n{doc.strip()}\n",
                                 f"{origin}:{modname}"))

    add(modname, module, f"Module {modname}")
    for name, obj in _members(module):
        qual = f"{modname}.{name}"
        if inspect.isclass(obj):
            add(qual, obj, f"class {qual}{_signature(obj)}")
            for meth_name, meth in sorted(vars(obj).items()):
                if meth_name.startswith("_") or not callable(meth) \
                        or not _native(meth, modname):
                    continue
                add(f"{qual}.{meth_name}", meth, f"{qual}.{meth_name}{_signature(meth)}")
        else:
            add(qual, obj, f"{qual}{_signature(obj)}")
    return docs


def _version_of(package: str) -> str | None:
    module = sys.modules.get(package)
    return getattr(module, "__version__", None) if module is not None else None


def build_default_documents(stdlib: Iterable[str] = DEFAULT_STDLIB_MODULES,
                            scientific: Iterable[str] = DEFAULT_SCIENTIFIC_MODULES,
                            min_words: int = DEFAULT_MIN_WORDS) -> list[Document]:
    """Docstring documents of the given modules (uncached). Modules are visited in sorted order,
    members in sorted order; a docstring seen before (aliases, re-exports) is kept only once."""
    docs: list[Document] = []
    for name in sorted(set(stdlib)):
        docs += _module_documents(name, "stdlib", min_words)
    for name in sorted(set(scientific)):
        docs += _module_documents(name, name.split(".")[0], min_words)
    seen: set[str] = set()
    unique = []
    for doc in docs:
        body = doc.text.split("\n\n", 1)[-1]
        if body not in seen:
            seen.add(body)
            unique.append(doc)
    return unique


_CLEAN_BUILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from spadekit.selfplay.corpus import build_default_documents
docs = build_default_documents()
versions = {m: getattr(sys.modules.get(m), "__version__", None) for m in sys.argv[2:]}
json.dump({"docs": [[d.id, d.text, d.source] for d in docs], "versions": versions}, sys.stdout)
"""


def _clean_default_documents() -> tuple[list[Document], dict[str, str | None]]:
    """:func:`build_default_documents` in a fresh interpreter (isolated as ``-I``: no user site,
    no ``PYTHON*`` variables, no script path; hash seed 0): imported packages patch standard-library members (Ray replaces
    ``inspect.isgenerator`` and ``zlib.compressobj``), so a corpus read from this process would
    depend on what it imported before; the fresh one is the same in every process, which a
    resumed run's document stream relies on. Falls back to this process when no interpreter
    can be started."""
    import subprocess

    src = str(Path(__file__).resolve().parents[2])
    roots = sorted({m.split(".")[0] for m in DEFAULT_SCIENTIFIC_MODULES})
    try:
        # -I's isolation with a fixed hash seed (-I would ignore PYTHONHASHSEED): no PYTHON*
        # variables, no user site (-s), no script directory on the path (-P); set reprs in
        # docstrings (scipy writes some at import) then come out in the same order every time
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        done = subprocess.run([sys.executable, "-s", "-P", "-c", _CLEAN_BUILD, src, *roots],
                              capture_output=True, text=True, timeout=300, check=True,
                              env={**env, "PYTHONHASHSEED": "0"})
        data = json.loads(done.stdout)
        return [Document(*row) for row in data["docs"]], data["versions"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return build_default_documents(), {p: _version_of(p) for p in roots}


def cached_default_documents() -> tuple[list[Document], dict[str, Any]]:
    """:func:`_clean_default_documents`, kept on disk (``spadekit.selfplay.corpus_cache``: the
    build takes seconds at the start of every run; a cached one reads in a fraction of that)."""
    from spadekit.selfplay import corpus_cache

    def build() -> tuple[list[list[str]], dict[str, Any]]:
        docs, versions = _clean_default_documents()
        return [[d.id, d.text, d.source] for d in docs], versions

    roots = sorted({m.split(".")[0] for m in DEFAULT_SCIENTIFIC_MODULES})
    rows, versions = corpus_cache.cached_build(corpus_cache.build_key(roots, Path(__file__)),
                                               build)
    return [Document(*row) for row in rows], versions


@functools.lru_cache(maxsize=1)
def _default_documents() -> tuple[tuple[Document, ...], dict[str, Any]]:
    docs, versions = cached_default_documents()
    by_origin: dict[str, int] = {}
    for doc in docs:
        origin = doc.id.split(":", 1)[0]
        by_origin[origin] = by_origin.get(origin, 0) + 1
    packages = sorted(by_origin)
    info = {
        "python": sys.version.split()[0],
        "documents_by_package": dict(sorted(by_origin.items())),
        "package_versions": {p: versions.get(p, _version_of(p)) for p in packages
                             if p != "stdlib"},
        "stdlib_modules": list(DEFAULT_STDLIB_MODULES),
        "scientific_modules": list(DEFAULT_SCIENTIFIC_MODULES),
        "min_prose_words": DEFAULT_MIN_WORDS,
    }
    return tuple(docs), info


def default_corpus(max_words: int | None = None, seed: int = 0) -> Corpus:
    """The offline default corpus (built once per process, then cached in memory).

    Contents: the docstrings, with at least :data:`DEFAULT_MIN_WORDS` prose words, of the modules
    in :data:`DEFAULT_STDLIB_MODULES` (module docstrings, public functions, public classes and
    their public methods) and of the modules in :data:`DEFAULT_SCIENTIFIC_MODULES` that are
    installed. Each document is ``"<qualified name><signature>\\n\\n<docstring>"`` with id
    ``"<package>:<qualified name>"``. Order is deterministic (sorted modules and names; duplicate
    docstrings dropped), so the same interpreter and package versions give the same corpus;
    :meth:`Corpus.describe` records the versions.
    """
    docs, info = _default_documents()
    return Corpus(list(docs), name="default",
                  description=("docstrings (>= %d prose words) of Python standard library modules "
                               "and installed scientific packages" % DEFAULT_MIN_WORDS),
                  max_words=max_words, seed=seed, info=info)
