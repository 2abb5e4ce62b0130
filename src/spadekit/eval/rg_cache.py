"""An on-disk cache of generated Reasoning Gym items, so a second ``eval --suite rg-hard`` starts in
seconds.

One JSON file per dataset, under a directory named by everything the items depend on (level,
seed, size, a digest of the parameters, the ``reasoning-gym`` and ``spadekit`` versions), holding
per index the seed, question, answer and the original entry in a tagged JSON form that decodes
to equal values of the same types (an entry it cannot hold exactly is regenerated at scoring).
Files carry a sha256 of their records and key; a bad one is reported (``CacheStats.corrupt``),
ignored and rewritten. Writes are atomic; item ids and contents are the same with or without the
cache. Location: ``$SPADEKIT_CACHE_DIR/rg`` (default ``~/.cache/spadekit/rg``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1
TAG = "__rg__"
"""The key of a tagged value: ``{"__rg__": kind, "v": payload}``."""


class Unencodable(Exception):
    """A value the tagged JSON form cannot hold exactly."""


def encode(value: Any) -> Any:
    """``value`` as plain JSON data; raises Unencodable for what cannot round-trip exactly."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
    if type(value) is list:
        return [encode(v) for v in value]
    if type(value) is tuple:
        return {TAG: "tuple", "v": [encode(v) for v in value]}
    if type(value) in (set, frozenset):
        items = [encode(v) for v in value]
        items.sort(key=lambda x: json.dumps(x, sort_keys=True))
        return {TAG: type(value).__name__, "v": items}
    if type(value) is bytes:
        return {TAG: "bytes", "v": base64.b64encode(value).decode()}
    if type(value) is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            return {k: encode(v) for k, v in value.items()}
        return {TAG: "dict", "v": [[encode(k), encode(v)] for k, v in value.items()]}
    np = _numpy()
    if np is not None:
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return {TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                    "v": [encode(v) for v in value.ravel().tolist()]}
        if isinstance(value, np.generic) and value.dtype.kind in "biuf":
            return {TAG: "npscalar", "dtype": value.dtype.str, "v": encode(value.item())}
    raise Unencodable(type(value).__name__)


def decode(data: Any) -> Any:
    """The value ``encode`` was given (raises ValueError on a malformed tag)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if TAG not in data:
        return {k: decode(v) for k, v in data.items()}
    kind, payload = data[TAG], data.get("v")
    if kind == "float":
        return float(payload)
    if kind == "tuple":
        return tuple(decode(v) for v in payload)
    if kind in ("set", "frozenset"):
        return (set if kind == "set" else frozenset)(decode(v) for v in payload)
    if kind == "bytes":
        return base64.b64decode(payload, validate=True)
    if kind == "dict":
        return {decode(k): decode(v) for k, v in payload}
    if kind in ("ndarray", "npscalar"):
        np = _numpy()
        if np is None:
            raise ValueError("a cached numpy value needs numpy")
        if kind == "npscalar":
            return np.dtype(data["dtype"]).type(decode(payload))
        return np.array([decode(v) for v in payload], dtype=np.dtype(data["dtype"])).reshape(
            data["shape"])
    raise ValueError(f"unknown cache tag {kind!r}")


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, all the way down (numpy arrays elementwise)."""
    if type(a) is not type(b):
        return False
    np = _numpy()
    if np is not None and isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(
            np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - reasoning-gym depends on numpy
        return None
    return numpy


def default_dir() -> Path:
    root = os.environ.get("SPADEKIT_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or
                                        Path.home() / ".cache") / "spadekit"
    return base / "rg"


@dataclass
class CacheStats:
    hits: int = 0
    """Items (or known failures) read from the cache."""
    misses: int = 0
    """Items generated because the cache did not have them."""
    corrupt: list[str] = field(default_factory=list)
    """Files found damaged (ignored and rewritten), with why."""


class ItemCache:
    """The cache of one suite configuration (see the module docstring for the key)."""

    def __init__(self, root: Path, key: dict[str, Any]) -> None:
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = Path(root) / f"{key['suite']}-seed{key['seed']}-{digest}"
        self.stats = CacheStats()

    def path(self, dataset: str) -> Path:
        return self.dir / f"{dataset}.json"

    def load(self, dataset: str) -> dict[str, dict[str, Any]]:
        """The cached records of ``dataset`` by index (as a string), {} when absent or
        damaged (a damaged file is recorded in ``stats.corrupt``)."""
        file = self.path(dataset)
        if not file.is_file():
            return {}
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
            records = doc["records"]
            if doc.get("format") != FORMAT or doc.get("key") != {**self.key,
                                                                   "dataset": dataset}:
                raise ValueError("key or format does not match")
            if doc.get("sha256") != _digest(records):
                raise ValueError("digest does not match its records")
            for index, rec in records.items():
                if not index.isdigit() or not isinstance(rec, dict):
                    raise ValueError(f"malformed record {index!r}")
                if "error" not in rec and not (isinstance(rec.get("question"), str)
                                               and isinstance(rec.get("seed"), int)):
                    raise ValueError(f"record {index} has no question or seed")
                if "entry" in rec:
                    entry = decode(rec["entry"])
                    if not isinstance(entry, dict) or entry.get("question") != rec["question"]:
                        raise ValueError(f"record {index}: its entry is not its question's")
            return records
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            why = f"{file.name}: {type(exc).__name__}: {exc}"[:300]
            self.stats.corrupt.append(why)
            log.warning("Reasoning Gym cache file ignored and regenerated: %s", why)
            return {}

    def save(self, dataset: str, records: dict[str, dict[str, Any]]) -> None:
        """Write ``records`` atomically; a failing write only logs (the cache is optional)."""
        doc = {"format": FORMAT, "key": {**self.key, "dataset": dataset},
               "sha256": _digest(records), "records": records}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{dataset}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out)
            os.replace(tmp, self.path(dataset))
        except OSError as exc:
            log.warning("cannot write the Reasoning Gym cache %s: %s", self.dir, exc)


def record_of(seed: int, entry: dict[str, Any]) -> dict[str, Any]:
    """A cache record of one generated entry; the entry itself only when it round-trips."""
    rec: dict[str, Any] = {"seed": int(seed), "question": str(entry["question"])}
    try:
        encoded = encode(entry)
        if same(decode(json.loads(json.dumps(encoded))), entry):
            rec["entry"] = encoded
    except (Unencodable, ValueError, TypeError, RecursionError):
        pass
    return rec


def _digest(records: Any) -> str:
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def suite_key(level: str, seed: int, size: int, params: dict[str, Any]) -> dict[str, Any]:
    """What a suite's items depend on: level, seed, size, generator parameters, versions."""
    from importlib.metadata import PackageNotFoundError, version

    from spadekit import __version__

    try:
        rg_version = version("reasoning-gym")
    except PackageNotFoundError:
        rg_version = "unknown"
    return {"suite": f"rg-{level}", "seed": int(seed), "size": int(size),
            "params": hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()
                                     ).hexdigest()[:16],
            "reasoning_gym": rg_version, "spadekit": __version__}
