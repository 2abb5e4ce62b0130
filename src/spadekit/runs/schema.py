"""The run database's schema, migrations, typed errors and value codecs (helpers of ``store.py``).

:data:`SCHEMA_VERSION` is the newest version; :data:`MIGRATIONS` maps each version to the SQL
statements that reach it (run in order, in one transaction). ``RunStore`` applies every missing
version when it opens a database and refuses a newer one (:class:`SchemaVersionError`).
Version 1 creates the core tables (environments, plays, episodes, turns, memory, delay_buffer,
blacklist, hint_cache, kv, metrics, events, rounds, checkpoints), version 2 adds ``rejected``,
version 3 the asynchronous rollouts' ``rollout_queue`` and ``token_ledger``. JSON columns are
written strictly (:func:`dumps`, no NaN), token arrays as packed compressed BLOBs.
The tables, column by column: docs/design/runs.md.
"""

from __future__ import annotations

import array
import json
import math
import sys
import zlib
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from spadekit.common.errors import SpadekitError

__all__ = [
    "APPLICATION_ID", "MIGRATIONS", "SCHEMA_VERSION", "SQLITE_MAGIC", "STATUSES",
    "SchemaVersionError", "StoreCorruptError", "StoreError", "StoreNotFound",
    "dumps", "finite", "loads", "pack_array", "pack_json", "unpack_array", "unpack_json",
]

#: ``PRAGMA application_id`` of a spadekit run database ("SPKT").
APPLICATION_ID = 0x53504B54
#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Allowed values of ``environments.status``.
STATUSES = ("pooled", "retired", "invalid", "blacklisted")


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


ZLEVEL = 1
"""zlib level for BLOBs: level 1 is several times faster than 6 at a slightly larger size, and a
round stores hundreds of episodes while its rollout waits (reading is the same at any level)."""


class StoreError(SpadekitError):
    """A run database could not be opened, read or written; ``path`` names the file."""

    reason = "store"

    def __init__(self, message: str, path: str | Path | None = None, **details: Any) -> None:
        path_text = None if path is None else str(path)
        if path_text and path_text not in message:
            message = f"{message} [{path_text}]"
        super().__init__(message, path=path_text, **details)
        self.path = path_text


class StoreCorruptError(StoreError):
    """The database file is not a SQLite database, or SQLite reports it malformed."""

    reason = "corrupt"


class SchemaVersionError(StoreError):
    """The database's schema version is newer than (or unknown to) this version of spadekit."""

    reason = "schema_version"

    def __init__(self, message: str, path: str | Path | None = None, found: Any = None,
                 supported: int = 0, **details: Any) -> None:
        super().__init__(message, path, found=found, supported=supported, **details)
        self.found = found
        self.supported = supported


class StoreNotFound(StoreError, LookupError):
    """A row that the call needs (an environment, a memory record) does not exist."""

    reason = "not_found"


# ---------------------------------------------------------------------------------------------
# schema and migrations
# ---------------------------------------------------------------------------------------------

_STATUS_CHECK = "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")"

_V1 = (
    """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, note TEXT)""",
    f"""CREATE TABLE environments (
        sha256 TEXT PRIMARY KEY, code TEXT NOT NULL, hint TEXT, skill TEXT, domain TEXT,
        source TEXT, class_name TEXT, meta TEXT NOT NULL DEFAULT '{{}}',
        parents TEXT NOT NULL DEFAULT '[]', lineage TEXT NOT NULL DEFAULT '{{}}', validation TEXT,
        status TEXT NOT NULL DEFAULT 'pooled' CHECK ({_STATUS_CHECK}),
        created_step INTEGER, retired_step INTEGER, designer_sample_id TEXT,
        created_at REAL NOT NULL)""",
    "CREATE INDEX environments_status ON environments(status, skill)",
    """CREATE TABLE episodes (
        id INTEGER PRIMARY KEY, env_sha TEXT NOT NULL REFERENCES environments(sha256),
        step INTEGER NOT NULL, with_hint INTEGER NOT NULL CHECK (with_hint IN (0, 1)),
        seed INTEGER, role TEXT NOT NULL DEFAULT 'agent', episode_return REAL NOT NULL,
        stop_reason TEXT, terminated INTEGER, truncated INTEGER, failure TEXT, n_turns INTEGER,
        prompt_len INTEGER, n_tokens INTEGER, n_sampled INTEGER, generate_s REAL, step_s REAL,
        hint TEXT, tag TEXT, messages BLOB, token_ids BLOB, loss_mask BLOB, logprobs BLOB,
        created_at REAL NOT NULL)""",
    "CREATE INDEX episodes_env ON episodes(env_sha, step)",
    "CREATE INDEX episodes_step ON episodes(step)",
    """CREATE TABLE turns (
        episode_id INTEGER NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL, action TEXT, observation TEXT, reward REAL, terminated INTEGER,
        truncated INTEGER, new_tokens INTEGER, finish_reason TEXT, generate_s REAL, step_s REAL,
        extra TEXT, PRIMARY KEY (episode_id, idx))""",
    """CREATE TABLE plays (
        id INTEGER PRIMARY KEY, env_sha TEXT NOT NULL REFERENCES environments(sha256),
        step INTEGER NOT NULL, with_hint INTEGER NOT NULL CHECK (with_hint IN (0, 1)),
        episode_return REAL NOT NULL, failure TEXT, turns INTEGER, tokens INTEGER, seed INTEGER,
        episode_id INTEGER REFERENCES episodes(id) ON DELETE SET NULL)""",
    "CREATE INDEX plays_env ON plays(env_sha, with_hint, step)",
    "CREATE INDEX plays_step ON plays(step)",
    """CREATE TABLE memory (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT NOT NULL UNIQUE, code TEXT NOT NULL,
        hint TEXT, skill TEXT, domain TEXT, win_rate REAL, win_rate_with_hint REAL, regret REAL,
        designer_reward REAL, n_plays INTEGER NOT NULL DEFAULT 0, step INTEGER,
        parents TEXT NOT NULL DEFAULT '[]', validation TEXT,
        library INTEGER NOT NULL DEFAULT 0 CHECK (library IN (0, 1)),
        created_at REAL NOT NULL, updated_step INTEGER)""",
    "CREATE INDEX memory_skill ON memory(skill, win_rate)",
    """CREATE TABLE delay_buffer (
        id INTEGER PRIMARY KEY, sample_id TEXT,
        env_sha TEXT REFERENCES environments(sha256), skill TEXT,
        generated_step INTEGER NOT NULL, due_step INTEGER NOT NULL,
        prompt_len INTEGER, token_ids BLOB NOT NULL, loss_mask BLOB NOT NULL, logprobs BLOB,
        meta TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL)""",
    "CREATE INDEX delay_buffer_due ON delay_buffer(due_step, id)",
    """CREATE TABLE blacklist (
        sha256 TEXT PRIMARY KEY, reason TEXT NOT NULL, step INTEGER, created_at REAL NOT NULL)""",
    """CREATE TABLE hint_cache (
        env_sha TEXT PRIMARY KEY, hint TEXT NOT NULL, how TEXT NOT NULL, step INTEGER,
        meta TEXT NOT NULL DEFAULT '{}', created_at REAL NOT NULL)""",
    """CREATE TABLE kv (
        key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL)""",
    """CREATE TABLE metrics (
        name TEXT NOT NULL, step INTEGER NOT NULL, value REAL, PRIMARY KEY (name, step))""",
    "CREATE INDEX metrics_step ON metrics(step)",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY, step INTEGER, time REAL NOT NULL, kind TEXT, data TEXT NOT NULL)""",
    """CREATE TABLE rounds (
        step INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL NOT NULL)""",
    """CREATE TABLE checkpoints (
        step INTEGER PRIMARY KEY, path TEXT NOT NULL, meta TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL)""",
)

_V2 = (
    """CREATE TABLE rejected (
        id INTEGER PRIMARY KEY, step INTEGER, skill TEXT, stage TEXT, reason TEXT NOT NULL,
        message TEXT, sha256 TEXT, text BLOB, details TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL)""",
    "CREATE INDEX rejected_reason ON rejected(reason, step)",
)

_V3 = (
    """CREATE TABLE rollout_queue (
        id INTEGER PRIMARY KEY, step INTEGER NOT NULL, version INTEGER NOT NULL,
        trainer_start INTEGER NOT NULL, trainer_end INTEGER NOT NULL, role TEXT NOT NULL,
        group_id TEXT NOT NULL, token_ids BLOB NOT NULL, loss_mask BLOB NOT NULL, logprobs BLOB,
        advantage REAL NOT NULL, weight REAL NOT NULL, generated_at_step INTEGER NOT NULL,
        truncated INTEGER NOT NULL CHECK (truncated IN (0, 1)), created_at REAL NOT NULL)""",
    "CREATE INDEX rollout_queue_step ON rollout_queue(step, id)",
    """CREATE TABLE token_ledger (
        step INTEGER NOT NULL, version INTEGER NOT NULL, generated INTEGER NOT NULL,
        trained INTEGER NOT NULL, discarded INTEGER NOT NULL, in_flight INTEGER NOT NULL,
        PRIMARY KEY (step, version))""",
)

#: version -> statements that bring a database from ``version - 1`` to ``version``.
MIGRATIONS: dict[int, tuple[str, ...]] = {1: _V1, 2: _V2, 3: _V3}
#: The schema version this code writes.
SCHEMA_VERSION = max(MIGRATIONS)

if sorted(MIGRATIONS) != list(range(1, SCHEMA_VERSION + 1)):  # pragma: no cover - a coding error
    raise RuntimeError("store_schema.MIGRATIONS must be numbered 1..N without gaps")


# ---------------------------------------------------------------------------------------------
# JSON and packed arrays
# ---------------------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-safe")


def dumps(value: Any, what: str = "value") -> str:
    """Strict JSON text of ``value`` (no NaN/inf); ``StoreError`` when it is not JSON-safe.

    Mappings, tuples, sets (sorted), dataclasses, objects with ``to_dict()`` and numpy-style
    scalars are converted; anything else is refused rather than stored lossily.
    """
    try:
        return json.dumps(value, default=_default, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-safe: {exc}", reason_detail="not_json") from exc


def loads(text: str | None, default: Any = None) -> Any:
    """Inverse of :func:`dumps`; ``None`` (SQL NULL) gives ``default``."""
    return default if text is None else json.loads(text)


def finite(value: Any, what: str, *, optional: bool = False) -> float | None:
    """``float(value)``, refusing NaN, infinities and non-numbers with ``StoreError``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not (hasattr(value, "item") and callable(value.item)):
            raise StoreError(f"{what} must be a number, got {type(value).__name__}")
        value = value.item()
    value = float(value)
    if not math.isfinite(value):
        raise StoreError(f"{what} must be finite, got {value!r}")
    return value


_ARRAY_CODES = {"i": 4, "d": 8, "B": 1}


def pack_array(values: Any, code: str) -> bytes:
    """Pack a sequence of numbers as a zlib-compressed little-endian ``array`` BLOB.

    ``code`` is ``"i"`` (int32: token ids), ``"B"`` (uint8: loss masks) or ``"d"`` (float64:
    logprobs). The first byte of the BLOB is the type code, so :func:`unpack_array` needs nothing
    else. Values out of range for the type raise ``StoreError``.
    """
    if code not in _ARRAY_CODES:
        raise ValueError(f"unsupported array code {code!r}")
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        arr = array.array(code, values)
    except (TypeError, OverflowError) as exc:
        raise StoreError(f"cannot pack {code!r} array: {exc}") from exc
    if arr.itemsize != _ARRAY_CODES[code]:  # pragma: no cover - exotic platforms
        raise StoreError(f"array {code!r} has item size {arr.itemsize} on this platform")
    if sys.byteorder == "big":  # pragma: no cover
        arr.byteswap()
    return code.encode("ascii") + zlib.compress(arr.tobytes(), ZLEVEL)


def unpack_array(blob: bytes | None) -> list | None:
    """Inverse of :func:`pack_array` (``None`` stays ``None``)."""
    if blob is None:
        return None
    try:
        arr = array.array(chr(blob[0]))
        arr.frombytes(zlib.decompress(blob[1:]))
    except (IndexError, TypeError, ValueError, zlib.error) as exc:  # a damaged row
        raise StoreCorruptError(f"a stored array does not decode ({type(exc).__name__}: "
                                f"{exc}); the run database is damaged") from None
    if sys.byteorder == "big":  # pragma: no cover
        arr.byteswap()
    return arr.tolist()


def pack_json(value: Any, what: str = "value") -> bytes | None:
    """zlib-compressed strict JSON (``None`` stays ``None``): for big blobs such as messages."""
    return None if value is None else zlib.compress(dumps(value, what).encode("utf-8"), ZLEVEL)


def unpack_json(blob: bytes | None) -> Any:
    return None if blob is None else json.loads(zlib.decompress(blob).decode("utf-8"))


# ---------------------------------------------------------------------------------------------
# row codecs (pure functions; ``RunStore`` runs the SQL)
# ---------------------------------------------------------------------------------------------


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise StoreError(f"status must be one of {STATUSES}, got {status!r}")
    return status


ENV_INSERT = (
    "INSERT INTO environments (sha256, code, hint, skill, domain, source, class_name, meta,"
    " parents, lineage, validation, status, created_step, designer_sample_id, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_ENV_JSON = ("meta", "parents", "lineage", "validation")


def env_row(program: Any, step: Any, status: str, parents: Any, lineage: Any, validation: Any,
            designer_sample_id: Any, now: float) -> tuple:
    """The ``environments`` values of an ``EnvProgram`` and its provenance."""
    return (program.sha256, program.code, program.hint, program.skill, program.domain,
            program.source, program.class_name, dumps(program.to_dict()["meta"], "meta"),
            dumps(list(parents), "parents"), dumps(dict(lineage or {}), "lineage"),
            None if validation is None else dumps(validation, "validation"), status,
            opt_int(step), None if designer_sample_id is None else str(designer_sample_id), now)


def decode_env(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in _ENV_JSON:
        out[key] = loads(out[key])
    return out


def program_of(row: Mapping[str, Any]) -> Any:
    """The ``EnvProgram`` of a decoded ``environments`` row."""
    from spadekit.envs.program import EnvProgram

    return EnvProgram(code=row["code"], hint=row["hint"], skill=row["skill"],
                      domain=row["domain"], source=row["source"], class_name=row["class_name"],
                      meta=row["meta"])


PLAY_KEYS = ("env_sha", "step", "with_hint", "episode_return", "failure", "turns", "tokens",
             "seed", "episode_id")
PLAY_INSERT = f"INSERT INTO plays ({', '.join(PLAY_KEYS)}) VALUES ({', '.join('?' * 9)})"


def play_row(play: Mapping[str, Any]) -> tuple:
    """The ``plays`` values of a mapping with :data:`PLAY_KEYS` (the last five optional)."""
    unknown = set(play) - set(PLAY_KEYS)
    if unknown:
        raise StoreError(f"unknown play fields {sorted(unknown)}")
    return (str(play["env_sha"]), int(play["step"]), int(bool(play["with_hint"])),
            finite(play["episode_return"], "episode_return"),
            None if play.get("failure") is None else str(play["failure"]),
            opt_int(play.get("turns")), opt_int(play.get("tokens")),
            opt_int(play.get("seed")), opt_int(play.get("episode_id")))


_EPISODE_COLUMNS = ("env_sha", "step", "with_hint", "seed", "role", "episode_return",
                    "stop_reason", "terminated", "truncated", "failure", "n_turns", "prompt_len",
                    "n_tokens", "n_sampled", "generate_s", "step_s", "hint", "tag", "messages",
                    "token_ids", "loss_mask", "logprobs", "created_at")
EPISODE_INSERT = (f"INSERT INTO episodes ({', '.join(_EPISODE_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(_EPISODE_COLUMNS))})")
TURN_INSERT = "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_TURN_KEYS = ("action", "observation", "reward", "terminated", "truncated", "new_tokens",
              "finish_reason", "generate_s", "step_s")


def episode_rows(ep: Mapping[str, Any], step: int, env_sha: str | None,
                 with_hint: bool | None, role: str, now: float) -> tuple[tuple, list[tuple], dict]:
    """Encode a trajectory dict (``rollout.Trajectory.to_dict()`` keys).

    Returns the ``episodes`` values, the ``turns`` values without the leading episode id, and the
    keyword arguments of the matching play (``failure`` reduced to its ``reason`` code).
    """
    sha = env_sha or ep.get("env_sha") or ep.get("program_sha256")
    if not sha:
        raise StoreError("an episode needs env_sha (or program_sha256)")
    tag = dict(ep.get("tag") or {})
    if with_hint is None:
        with_hint = bool(tag.get("with_hint", ep.get("hint") is not None))
    turns = [dict(t) for t in ep.get("turns") or []]
    tokens, mask = list(ep.get("token_ids") or []), list(ep.get("loss_mask") or [])
    logprobs, failure = ep.get("logprobs"), ep.get("failure")
    ret = finite(ep.get("episode_return", 0.0), "episode_return")
    values = (
        sha, int(step), int(with_hint), opt_int(ep.get("seed")), role, ret,
        ep.get("stop_reason"), int(bool(ep.get("terminated"))), int(bool(ep.get("truncated"))),
        None if failure is None else dumps(failure, "failure"), len(turns),
        opt_int(ep.get("prompt_len")), len(tokens), int(sum(mask)),
        sum(float(t.get("generate_s") or 0.0) for t in turns),
        sum(float(t.get("step_s") or 0.0) for t in turns), ep.get("hint"), dumps(tag, "tag"),
        pack_json(ep.get("messages"), "messages"), pack_array(tokens, "i"),
        pack_array(mask, "B"), None if logprobs is None else pack_array(logprobs, "d"), now)
    turn_rows = [
        (i, t.get("action"), t.get("observation"),
         finite(t.get("reward"), "reward", optional=True), int(bool(t.get("terminated"))),
         int(bool(t.get("truncated"))), opt_int(t.get("new_tokens")), t.get("finish_reason"),
         t.get("generate_s"), t.get("step_s"),
         dumps({k: v for k, v in t.items() if k not in _TURN_KEYS}, "turn"))
        for i, t in enumerate(turns)]
    reason = None
    if failure is not None:
        reason = str(failure.get("reason", "failure") if isinstance(failure, Mapping)
                     else failure)
    play = dict(env_sha=sha, step=int(step), with_hint=bool(with_hint), episode_return=ret,
                failure=reason, turns=len(turns), tokens=len(tokens), seed=ep.get("seed"))
    return values, turn_rows, play


def decode_episode(row: Mapping[str, Any], turn_rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Inverse of :func:`episode_rows`: JSON and BLOB columns decoded, ``turns`` as dicts."""
    out = dict(row)
    out["with_hint"] = bool(out["with_hint"])
    out["terminated"], out["truncated"] = bool(out["terminated"]), bool(out["truncated"])
    out["failure"], out["tag"] = loads(out["failure"]), loads(out["tag"], {})
    out["messages"] = unpack_json(out["messages"])
    for key in ("token_ids", "loss_mask", "logprobs"):
        out[key] = unpack_array(out[key])
    turns = []
    for r in turn_rows:
        t = {k: r[k] for k in _TURN_KEYS}
        t["terminated"], t["truncated"] = bool(t["terminated"]), bool(t["truncated"])
        t.update(loads(r["extra"], {}))
        turns.append(t)
    out["turns"] = turns
    return out


DELAY_INSERT = (
    "INSERT INTO delay_buffer (sample_id, env_sha, skill, generated_step, due_step, prompt_len,"
    " token_ids, loss_mask, logprobs, meta, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def delay_row(sample: Mapping[str, Any], now: float) -> tuple:
    """Encode a delayed designer sample (see ``RunStore.push_delayed``)."""
    tokens, mask = list(sample["token_ids"]), list(sample["loss_mask"])
    logprobs = sample.get("logprobs")
    if len(mask) != len(tokens) or (logprobs is not None and len(logprobs) != len(tokens)):
        raise StoreError("token_ids, loss_mask and logprobs must have the same length")
    return (sample.get("sample_id"), sample.get("env_sha"), sample.get("skill"),
            int(sample["generated_step"]), int(sample["due_step"]),
            opt_int(sample.get("prompt_len")), pack_array(tokens, "i"), pack_array(mask, "B"),
            None if logprobs is None else pack_array(logprobs, "d"),
            dumps(dict(sample.get("meta") or {}), "meta"), now)


QUEUE_INSERT = (
    "INSERT INTO rollout_queue (step, version, trainer_start, trainer_end, role, group_id,"
    " token_ids, loss_mask, logprobs, advantage, weight, generated_at_step, truncated,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def queue_row(batch: Mapping[str, Any], sample: Mapping[str, Any], now: float) -> tuple:
    """Encode one queued training sample of ``batch`` (see ``RunStore.queue_batch``)."""
    tokens, mask = list(sample["token_ids"]), list(sample["loss_mask"])
    logprobs = sample.get("behaviour_logprobs")
    if len(mask) != len(tokens) or (logprobs is not None and len(logprobs) != len(tokens)):
        raise StoreError("token_ids, loss_mask and behaviour_logprobs must have the same length")
    return (int(batch["step"]), int(batch["version"]), int(batch["trainer_start"]),
            int(batch["trainer_end"]), str(sample["role"]), str(sample["group_id"]),
            pack_array(tokens, "i"), pack_array(mask, "B"),
            None if logprobs is None else pack_array(logprobs, "d"),
            finite(sample["advantage"], "advantage"), finite(sample["weight"], "weight"),
            int(sample["generated_at_step"]), int(bool(sample["truncated"])), now)


def decode_queue(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in ("token_ids", "loss_mask", "logprobs"):
        out[key] = unpack_array(out[key])
    out["behaviour_logprobs"] = out.pop("logprobs")
    out["truncated"] = bool(out["truncated"])
    return out


def decode_delay(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in ("token_ids", "loss_mask", "logprobs"):
        out[key] = unpack_array(out[key])
    out["meta"] = loads(out["meta"], {})
    return out


#: Life statistics of environments; parameters: until_step, sha256, status (each may be NULL).
STATS_SQL = """
    SELECT e.sha256, e.skill, e.status, e.created_step, e.retired_step,
      COALESCE(SUM(p.with_hint = 0), 0) AS n_plays,
      COALESCE(SUM(p.with_hint = 1), 0) AS n_plays_with_hint,
      MIN(1.0, MAX(0.0, AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END))) AS win_rate,
      MIN(1.0, MAX(0.0, AVG(CASE WHEN p.with_hint = 1 THEN p.episode_return END)))
        AS win_rate_with_hint,
      AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return > 0 END) AS positive_share,
      AVG(CASE WHEN p.with_hint = 1 THEN p.episode_return > 0 END) AS positive_share_with_hint,
      AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END) AS mean_return,
      AVG(CASE WHEN p.with_hint = 1 THEN p.episode_return END) AS mean_return_with_hint,
      MAX(0.0, AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return * p.episode_return END)
        - AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END)
        * AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END)) AS return_variance,
      AVG(CASE WHEN p.with_hint = 1 AND p.step = e.created_step THEN p.episode_return END)
        - AVG(CASE WHEN p.with_hint = 0 AND p.step = e.created_step THEN p.episode_return END)
        AS regret_at_gen,
      COALESCE(SUM(p.with_hint = 0 AND p.step = e.created_step), 0) AS n_plays_at_gen,
      COALESCE(SUM(p.with_hint = 1 AND p.step = e.created_step), 0) AS n_hint_plays_at_gen,
      COALESCE(SUM(p.failure IS NOT NULL), 0) AS n_failures,
      MIN(p.step) AS first_step, MAX(p.step) AS last_step
    FROM environments e
    LEFT JOIN plays p ON p.env_sha = e.sha256 AND (?1 IS NULL OR p.step <= ?1)
    WHERE (?2 IS NULL OR e.sha256 = ?2) AND (?3 IS NULL OR e.status = ?3)
    GROUP BY e.sha256 ORDER BY e.rowid"""
