"""The default corpus kept on disk between processes.

The default corpus (``spadekit.selfplay.corpus``) is built in a fresh interpreter from the
docstrings of the standard library and the installed scientific packages: about 6 s on 2 cores,
paid at the start of every new run. The build depends only on that interpreter, on where and at
which version each scientific package is installed, and on the builder's source, so
:func:`build_key` digests exactly those (read by a fresh ``python -I``, as the build itself is)
and :func:`cached_build` keeps one build per key in ``<cache>/corpora/default-build-<key>.json.gz``
(``spadekit.policy.bundled.cache_dir``). A file that does not read back to the digest written
with it is built again and replaced; a cache that cannot be written is skipped. A run still pins
its own copy (``corpus_pin``), so a resumed run never depends on this cache.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["build_key", "cache_path", "cached_build"]

Rows = list[list[str]]

_PROBE = """
import importlib.util, json, os, sys
roots = {}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    where = [] if spec is None else [spec.origin] if spec.origin else sorted(
        spec.submodule_search_locations or [])
    found = []
    for path in where:
        st = os.stat(path)
        found.append([path, st.st_mtime_ns, st.st_size])
        site = os.path.dirname(os.path.dirname(path) if spec.origin else path)
        found += sorted(d for d in os.listdir(site) if d.endswith(".dist-info")
                        and d.lower().startswith(name.lower() + "-"))
    roots[name] = found
print(json.dumps([sys.version, os.path.realpath(sys.executable), sys.path, roots]))
"""


def build_key(roots: list[str], builder: Path, python: str | None = None) -> str | None:
    """A digest of what a fresh ``python -I`` would build from: its version, executable and
    module path; for each top-level package in ``roots``, where it lies (file mtime and size)
    and its installed ``.dist-info`` (name and version); and the builder's source file. None
    when it cannot be read (then nothing is cached)."""
    try:
        done = subprocess.run([python or sys.executable, "-I", "-c", _PROBE, *roots],
                              capture_output=True, text=True, timeout=60, check=True)
        source = Path(builder).read_bytes()
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(source + b"\0" + done.stdout.strip().encode()).hexdigest()[:32]


def cache_path(key: str) -> Path:
    from spadekit.policy.bundled import cache_dir

    return cache_dir() / "corpora" / f"default-build-{key}.json.gz"


def _digest(rows: Rows) -> str:
    return hashlib.sha256(json.dumps(rows).encode("utf-8", "surrogatepass")).hexdigest()


def _read(path: Path) -> tuple[Rows, dict[str, Any]] | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        rows, versions = data["docs"], data["versions"]
        if not (isinstance(rows, list) and rows and isinstance(versions, dict)
                and all(isinstance(r, list) and len(r) == 3
                        and all(isinstance(x, str) for x in r) for r in rows)):
            return None
        return (rows, versions) if _digest(rows) == data["digest"] else None
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, rows: Rows, versions: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as fh:
            json.dump({"docs": rows, "versions": versions, "digest": _digest(rows)}, fh)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def cached_build(key: str | None, build: Callable[[], tuple[Rows, dict[str, Any]]]
                 ) -> tuple[Rows, dict[str, Any]]:
    """``build()`` (rows ``[id, text, source]`` and package versions), read from the cache file
    of ``key`` when it holds a whole one, else built and written there. ``key=None``: built."""
    if key is None:
        return build()
    path = cache_path(key)
    found = _read(path)
    if found is not None:
        return found
    rows, versions = build()
    _write(path, rows, versions)
    return rows, versions
