"""Program records: one model-written text environment, as source code plus provenance.

A program is one Python source defining exactly one top-level class whose name ends in ``Env``,
with ``reset(seed=None, options=None) -> (str, dict)``, ``step(action) -> (str, float, bool,
bool, dict)`` and optionally ``solution()``, ``max_turns`` and ``tools()``. This module only
records programs; it never imports or executes them (the sandbox does). :class:`EnvProgram` is
frozen, with a deep-frozen ``meta`` (:class:`FrozenDict`); ``sha256``/``short_id`` identify the
normalised code (:func:`normalize_code`). :func:`find_env_classes` raises
:class:`ProgramSyntaxError` (an ``ExtractionError`` and a ``SyntaxError``) for source that does
not parse. Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import Any

from spadekit.envs import pyparse
from spadekit.envs.extract_errors import ExtractionError

__all__ = [
    "DOMAINS",
    "EnvProgram",
    "FrozenDict",
    "ProgramSyntaxError",
    "find_env_classes",
    "normalize_code",
]

#: Allowed values of :attr:`EnvProgram.domain` (besides ``None``).
DOMAINS: frozenset[str] = frozenset({"games", "tooluse"})

#: Keys written by :meth:`EnvProgram.to_dict` that are derived, not fields.
_DERIVED_KEYS = ("sha256", "short_id")


# -- errors and helpers -----------------------------------------------------------------------


class ProgramSyntaxError(ExtractionError, SyntaxError):
    """Program source that does not parse: an ``ExtractionError`` (``reason == "syntax_error"``), so
    a ``ValueError``, and a ``SyntaxError`` with the parser's ``msg``, ``lineno``, ``offset`` and
    ``text``. The constructor mirrors ``SyntaxError(msg, details)`` so the error pickles.
    """

    def __init__(self, msg: str, details: tuple | None = None) -> None:
        if details is None:
            SyntaxError.__init__(self, msg)
        else:
            SyntaxError.__init__(self, msg, details)
        where = f" (line {self.lineno})" if self.lineno else ""
        self.reason = "syntax_error"
        self.message = f"program does not parse: {msg}{where}"

    def __str__(self) -> str:
        return self.message


def normalize_code(code: str) -> str:
    """Return *code* in the canonical form hashed by :attr:`EnvProgram.sha256`.

    Only cosmetic edits are ignored: a leading BOM is dropped, line endings become ``"\\n"``,
    trailing whitespace is stripped from every line, and trailing blank lines are removed so the
    result ends with exactly one ``"\\n"`` (the empty string stays
    empty). Raises ``TypeError`` for a non-``str``.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be str, not {type(code).__name__}")
    code = code.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in code.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def _top_level_env_classes(tree: ast.Module) -> list[str]:
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env")
    ]


def find_env_classes(code: str, *, filename: str = "<program>") -> list[str]:
    """Names of the top-level ``class ...Env`` statements in *code*, in source order (with repeats),
    found with :func:`ast.parse` (nested, conditional and imported classes do not count).

    Raises ``TypeError`` for a non-``str`` and :class:`ProgramSyntaxError` when it does not parse.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be str, not {type(code).__name__}")
    try:
        tree = pyparse.parse(code, filename=filename)
    except SyntaxError as exc:
        raise ProgramSyntaxError(
            exc.msg or "invalid syntax", (exc.filename, exc.lineno, exc.offset, exc.text)
        ) from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        message = str(exc) or type(exc).__name__
        raise ProgramSyntaxError(message, (filename, None, None, None)) from exc
    return _top_level_env_classes(tree)


# meta: deep-frozen JSON-safe values ------------------------------------------------------------


class FrozenDict(Mapping):
    """An immutable, hashable, picklable mapping (``EnvProgram.meta`` and its nested dicts), equal
    to any mapping with the same items; unlike ``MappingProxyType`` it pickles (sandbox workers need
    it).
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data) if data else {})
        object.__setattr__(self, "_hash", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self):
        return (FrozenDict, (self._data,))


def _freeze(value: Any, path: str) -> Any:
    """Deep, JSON-safe, read-only copy: mapping -> FrozenDict, list/tuple -> tuple."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path}: non-finite float {value!r} is not JSON-safe")
        return value
    if isinstance(value, Mapping):
        frozen = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: keys must be str, got {type(key).__name__} {key!r}")
            frozen[key] = _freeze(item, f"{path}[{key!r}]")
        return FrozenDict(frozen)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item, f"{path}[{i}]") for i, item in enumerate(value))
    raise TypeError(
        f"{path}: {type(value).__name__} is not JSON-safe "
        "(allowed: str, int, float, bool, None, list/tuple, mapping with str keys)"
    )


def _thaw(value: Any) -> Any:
    """Inverse of :func:`_freeze`: plain dicts and lists, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value


def _empty_meta() -> Mapping[str, Any]:
    return FrozenDict()


# -- the record -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EnvProgram:
    """One environment program: source code plus hint and provenance.

    ``code`` is the source exactly as given (non-empty); ``hint`` the privileged hint or None;
    ``skill`` a free-form label; ``domain`` None or one of :data:`DOMAINS`; ``source`` where it came
    from (``"library:<name>"``, a path, ``"designer:<run>/<step>"``); ``class_name`` a Python
    identifier (not checked against the code here). ``meta`` is JSON-safe data (``str`` keys;
    scalars, finite floats, lists and mappings), deep-copied into an immutable form (mappings become
    :class:`FrozenDict`, lists tuples); a program importing the game kit gets ``meta["gamekit"]``.
    Equality compares all fields and ``code`` verbatim (compare ``sha256`` for identity of the
    text); programs are hashable, picklable and deep-copyable.
    """

    code: str
    hint: str | None = None
    skill: str | None = None
    domain: str | None = None
    source: str | None = None
    class_name: str | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=_empty_meta)

    def __post_init__(self) -> None:
        if not isinstance(self.code, str):
            raise TypeError(f"EnvProgram.code must be str, not {type(self.code).__name__}")
        if not self.code.strip():
            raise ValueError("EnvProgram.code must be a non-empty string")
        for name in ("hint", "skill", "domain", "source", "class_name"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"EnvProgram.{name} must be str or None, not {type(value).__name__}"
                )
        if self.domain is not None and self.domain not in DOMAINS:
            raise ValueError(
                f"EnvProgram.domain must be None or one of {sorted(DOMAINS)}, got {self.domain!r}"
            )
        if self.class_name is not None and not self.class_name.isidentifier():
            raise ValueError(
                f"EnvProgram.class_name must be a Python identifier, got {self.class_name!r}"
            )
        meta = {} if self.meta is None else self.meta
        if not isinstance(meta, Mapping):
            raise TypeError(f"EnvProgram.meta must be a mapping, not {type(meta).__name__}")
        if "spadekit.envs.gamekit" in self.code:  # the kit version it imports is part of it
            from spadekit.envs.gamekit import kit_meta

            meta = {**{k: v for k, v in meta.items() if k != "gamekit"}, **kit_meta(self.code)}
        object.__setattr__(self, "meta", _freeze(meta, "EnvProgram.meta"))

    # identity ---------------------------------------------------------------------------------

    @property
    def normalized_code(self) -> str:
        """``normalize_code(self.code)``: the text that :attr:`sha256` is computed over."""
        return normalize_code(self.code)

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the UTF-8 bytes of :attr:`normalized_code` (64 lowercase hex chars)."""
        cached = self.__dict__.get("_sha256")
        if cached is None:
            cached = hashlib.sha256(self.normalized_code.encode("utf-8")).hexdigest()
            object.__setattr__(self, "_sha256", cached)  # not a field: eq/hash/repr ignore it
        return cached

    @property
    def short_id(self) -> str:
        """First 12 hex characters of :attr:`sha256`."""
        return self.sha256[:12]

    # copies -----------------------------------------------------------------------------------

    def with_hint(self, hint: str | None) -> EnvProgram:
        """A copy with ``hint`` replaced (``None`` removes it)."""
        return dataclasses.replace(self, hint=hint)

    # serialisation ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of all fields plus ``sha256`` and ``short_id``; ``from_dict(p.to_dict())
        == p``.
        """
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "meta": _thaw(self.meta), "sha256": self.sha256, "short_id": self.short_id}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvProgram:
        """Rebuild a program from :meth:`to_dict` output. Only ``code`` is required (``meta: null``
        is empty); ``ValueError`` when a given ``sha256``/``short_id`` does not match the code or a
        key is unknown.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"EnvProgram.from_dict expects a mapping, not {type(data).__name__}")
        if "code" not in data:
            raise ValueError("EnvProgram.from_dict: missing required key 'code'")
        field_names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in field_names and k not in _DERIVED_KEYS)
        if unknown:
            raise ValueError(f"EnvProgram.from_dict: unknown key(s) {unknown}")
        kwargs = {name: data[name] for name in field_names if name in data}
        if kwargs.get("meta") is None:
            kwargs.pop("meta", None)
        program = cls(**kwargs)
        for key in _DERIVED_KEYS:
            if key in data and data[key] != getattr(program, key):
                raise ValueError(
                    f"EnvProgram.from_dict: {key} {data[key]!r} does not match the code "
                    f"({getattr(program, key)!r})"
                )
        return program
