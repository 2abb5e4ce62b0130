"""A run's own copy of its default corpus, so a resumed run grounds on the documents it began
with, and says so when the default has changed since.

A new run grounded on the default keeps its documents in ``run_dir/corpus.jsonl.gz`` (corpus
file format; a hard link to one cached copy per corpus, a copy across file systems); a resume
reads them from there. When they differ from the current default, :func:`run_corpus` warns and
sets ``info["corpus_changed"]``. A file that does not read back to its digest is a
``CorpusError``: the run stops rather than ground on other documents. A run made before pinning
grounds on the current default; corpora from a path are not copied.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from spadekit.selfplay import corpus as corpus_module
from spadekit.selfplay.corpus import (Corpus, CorpusError, corpus_digest, read_corpus_file,
                                      write_corpus_file)

__all__ = ["PIN_NAME", "corpus_digest", "default_change", "is_default", "pin", "read_pinned",
           "run_corpus", "write_pinned"]

log = logging.getLogger(__name__)

PIN_NAME = "corpus.jsonl.gz"


def is_default(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "default"))


def write_pinned(corpus: Corpus, path: Path, digest: str | None = None) -> str:
    """Write ``corpus`` to ``path`` (atomically); returns the digest."""
    return write_corpus_file(path, corpus.documents, name=corpus.name,
                             description=corpus.description, info=corpus.info, digest=digest)


def read_pinned(path: Path, *, seed: int = 0) -> Corpus:
    """The corpus kept at ``path``; ``CorpusError`` when it is damaged or not a corpus file.
    Its ``info`` is the one written with it, plus ``pinned`` (the path) and ``digest``."""
    docs, header = read_corpus_file(path, what="the run's pinned corpus")
    info = {**header.get("info", {}), "pinned": str(path), "digest": header["digest"]}
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


def default_change(pinned: Corpus) -> dict[str, Any] | None:
    """None when ``pinned`` holds the current default corpus's documents; else what differs:
    ``{"pinned_digest", "default_digest", "pinned_spadekit", "default_spadekit"}`` (the
    spadekit versions that built each, None where unknown). A default that does not load is
    logged and counts as no change (the run grounds on its pinned copy either way)."""
    try:
        current = corpus_module.default_corpus()
    except CorpusError as exc:
        log.warning("cannot compare the run's pinned corpus with the default corpus: %s", exc)
        return None
    was = pinned.info.get("digest") or corpus_digest(pinned.documents)
    now = current.info.get("digest") or corpus_digest(current.documents)
    if was == now:
        return None
    return {"pinned_digest": was, "default_digest": now,
            "pinned_spadekit": pinned.info.get("spadekit"),
            "default_spadekit": current.info.get("spadekit")}


def run_corpus(spec: Any, run_dir: Path, *, seed: int, resume: bool) -> Corpus:
    """The corpus a run grounds on: a resumed run's pinned copy when it has one; otherwise
    ``load_corpus(spec)``, pinned into the run's directory when it is the default (a resumed
    run whose copy is missing says so in ``info["corpus_changed"]``, reason ``missing``).

    A pinned copy whose documents are not the current default's (:func:`default_change`) is
    still the one returned; a warning is logged and its ``info["corpus_changed"]`` holds what
    differs (absent when nothing does), for the caller's event log."""
    path = Path(run_dir) / PIN_NAME
    if is_default(spec) and path.exists():
        corpus = read_pinned(path, seed=seed)
        changed = default_change(corpus)
        if changed is not None:
            corpus.info["corpus_changed"] = changed
            log.warning("%s: the run grounds on the default corpus it began with (digest "
                        "%.12s), not on this spadekit's default (digest %.12s)", path,
                        changed["pinned_digest"], changed["default_digest"])
        return corpus
    corpus = corpus_module.load_corpus(spec, seed=seed)
    if is_default(spec) and resume:
        # the run's own copy is gone (deleted, or a run from before pinning): it grounds on
        # this spadekit's default from here on, pinned now, and says so
        corpus.info["corpus_changed"] = {"pinned_digest": None, "pinned_spadekit": None,
                                         "default_digest": corpus.info.get("digest"),
                                         "default_spadekit": corpus.info.get("spadekit"),
                                         "reason": f"{PIN_NAME} is missing"}
        log.warning("%s is missing: the resumed run grounds on this spadekit's default corpus "
                    "(digest %.12s) from here on", path, str(corpus.info.get("digest")))
    if is_default(spec):
        pin(corpus, run_dir)
    return corpus
