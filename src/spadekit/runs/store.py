"""The run directory and its SQLite database: everything a self-play run needs after a crash.

``runs/<name>/`` holds ``run.sqlite`` (WAL mode; schema in ``spadekit.runs.schema``),
``events.jsonl`` (:meth:`RunStore.append_event`) and ``checkpoints/step-N/`` (:meth:`checkpoint_dir`).
Every write method is atomic; ``with store.round(step):`` makes everything written inside it (by
any thread) commit together with a ``rounds`` row and any checkpoint pointer, or roll back on an
exception; a process killed inside it leaves the previous round's state. Events reach
``events.jsonl`` only after their commit. ``synchronous="NORMAL"`` survives a killed process,
``"FULL"`` also a power loss. Every SQLite failure is a :class:`StoreError` naming the file
(:class:`StoreCorruptError` for an unreadable file, :class:`SchemaVersionError` for a newer one).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from spadekit.envs.program import EnvProgram
from spadekit.runs.schema import (
    APPLICATION_ID, DELAY_INSERT, ENV_INSERT, EPISODE_INSERT, MIGRATIONS, PLAY_INSERT,
    QUEUE_INSERT, SCHEMA_VERSION, SQLITE_MAGIC, STATS_SQL, TURN_INSERT, SchemaVersionError,
    StoreCorruptError, StoreError, StoreNotFound, check_status, decode_delay, decode_env,
    decode_episode, decode_queue, delay_row, dumps, env_row, episode_rows, finite, loads, opt_int,
    play_row, program_of, queue_row,
)

__all__ = ["RunStore", "SchemaVersionError", "StoreCorruptError", "StoreError", "StoreNotFound",
           "SCHEMA_VERSION"]

DB_NAME = "run.sqlite"
EVENTS_NAME = "events.jsonl"
_CORRUPT_HINTS = ("not a database", "malformed", "corrupt", "file is encrypted")


class RunStore:
    """The run directory ``run_dir`` and its database ``run_dir/run.sqlite``.

    ``create=True`` makes the directory and database when missing (and opens an existing one);
    ``create=False`` requires an existing run database (:meth:`open`). ``verify=True`` runs
    ``PRAGMA quick_check`` on open (reads the whole file).
    """

    def __init__(self, run_dir: str | Path, create: bool = False, *,
                 synchronous: str = "NORMAL", busy_timeout_ms: int = 10_000,
                 verify: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        self.events_path = self.run_dir / EVENTS_NAME
        if synchronous.upper() not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self._lock = threading.RLock()
        self._depth = 0  # open transaction levels (round = level 1)
        self._black_codes: dict[str, str] = {}  # blacklisted sha -> extracted code (immutable)
        self._round: int | None = None
        self._pending: list[str] = []  # events.jsonl lines waiting for the outer commit
        self._conn: sqlite3.Connection | None = None
        if not self.path.exists():
            if not create:
                raise StoreNotFound(f"no run database at {self.path}", self.path)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        elif self.path.stat().st_size:
            with open(self.path, "rb") as fh:
                if fh.read(16) != SQLITE_MAGIC:
                    raise StoreCorruptError(f"{self.path} is not a SQLite database", self.path)
        try:
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False,
                                         timeout=busy_timeout_ms / 1000)
            self._conn.row_factory = sqlite3.Row
            self._setup(synchronous.upper(), int(busy_timeout_ms), create)
            if verify:
                self.integrity_check(raise_on_error=True)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, run_dir: str | Path, **kwargs: Any) -> RunStore:
        """Open an existing run (for ``--resume``)."""
        return cls(run_dir, create=False, **kwargs)

    # -- connection and schema ------------------------------------------------------------------

    def _error(self, exc: sqlite3.Error, what: str) -> StoreError:
        text = str(exc)
        kind = StoreCorruptError if any(h in text.lower() for h in _CORRUPT_HINTS) else StoreError
        return kind(f"{what} failed: {type(exc).__name__}: {text}", self.path)

    def _sql(self, sql: str, params: Any = (), what: str = "query") -> sqlite3.Cursor:
        if self._conn is None:
            raise StoreError("the store is closed", self.path)
        try:
            return self._conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._error(exc, what) from exc

    def _setup(self, synchronous: str, busy_timeout_ms: int, create: bool) -> None:
        self._sql(f"PRAGMA busy_timeout = {busy_timeout_ms}", what="open")
        mode = self._sql("PRAGMA journal_mode = WAL", what="open").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"could not switch {self.path} to WAL mode (got {mode!r})", self.path)
        self._sql(f"PRAGMA synchronous = {synchronous}")
        self._sql("PRAGMA foreign_keys = ON")
        tables = {r[0] for r in self._sql("SELECT name FROM sqlite_master WHERE type='table'",
                                          what="open")}
        if "schema_version" in tables:
            row = self._sql("SELECT MAX(version) FROM schema_version").fetchone()
            version = row[0]
            if not isinstance(version, int) or version < 1:
                raise SchemaVersionError(f"{self.path} has an invalid schema version {version!r}",
                                         self.path, found=version, supported=SCHEMA_VERSION)
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.path} has schema version {version}, newer than the {SCHEMA_VERSION} "
                    "this spadekit understands; upgrade spadekit to open it",
                    self.path, found=version, supported=SCHEMA_VERSION)
        elif tables - {"sqlite_sequence"}:
            raise StoreError(f"{self.path} is a SQLite database but not a spadekit run "
                             f"(tables: {', '.join(sorted(tables))})", self.path)
        elif not create:
            raise StoreNotFound(f"{self.path} is empty: not an initialised run", self.path)
        else:
            version = 0
        if version < SCHEMA_VERSION:
            with self.transaction():
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[v]:
                        self._sql(statement, what=f"migration to schema {v}")
                    self._sql("INSERT INTO schema_version VALUES (?, ?, ?)",
                              (v, time.time(), f"spadekit migration {v}"))
            self._sql(f"PRAGMA application_id = {APPLICATION_ID}")

    @property
    def schema_version(self) -> int:
        return int(self._sql("SELECT MAX(version) FROM schema_version").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def integrity_check(self, raise_on_error: bool = False) -> list[str]:
        """``PRAGMA quick_check`` messages (``["ok"]`` for a healthy file)."""
        found = [r[0] for r in self._sql("PRAGMA quick_check", what="integrity check")]
        if raise_on_error and found != ["ok"]:
            raise StoreCorruptError(f"{self.path} failed its integrity check: {found[:5]}",
                                    self.path)
        return found

    # -- transactions ---------------------------------------------------------------------------

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error, StoreError):
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        self._pending.clear()

    def _commit(self) -> None:
        try:
            self._sql("COMMIT", what="commit")
        except BaseException:
            self._rollback()
            raise
        self._flush_events()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[RunStore]:
        """Atomic block: a transaction, or a savepoint when one (e.g. a round) is already open.

        Holds the store's lock for the block, so keep it short; use :meth:`round` for a round.
        """
        with self._lock:
            level = self._depth
            self._sql("BEGIN IMMEDIATE" if level == 0 else f"SAVEPOINT sp{level}", what="begin")
            self._depth += 1
            mark = len(self._pending)
            try:
                yield self
            except BaseException:
                self._depth = level
                if level == 0:
                    self._rollback()
                else:
                    with contextlib.suppress(StoreError):
                        self._sql(f"ROLLBACK TO sp{level}")
                        self._sql(f"RELEASE sp{level}")
                    del self._pending[mark:]
                raise
            self._depth = level
            if level == 0:
                self._commit()
            else:
                self._sql(f"RELEASE sp{level}")

    @contextlib.contextmanager
    def round(self, step: int) -> Iterator[RunStore]:
        """Everything written inside the block commits atomically as round ``step``.

        ``step`` must be larger than :meth:`latest_complete_step`. Writes from other threads
        through this store during the block join the round. The store lock is not held across
        the block (rollout threads may write), only the SQLite write lock.
        """
        step = int(step)
        with self._lock:
            if self._round is not None or self._depth:
                raise StoreError(f"round({step}) opened inside another round or transaction",
                                 self.path)
            last = self.latest_complete_step()
            if last is not None and step <= last:
                raise StoreError(f"round {step} is not after the last completed round {last}",
                                 self.path)
            self._sql("BEGIN IMMEDIATE", what="begin round")
            self._depth, self._round = 1, step
        started = time.time()
        try:
            yield self
        except BaseException:
            with self._lock:
                self._depth, self._round = 0, None
                self._rollback()
            raise
        with self._lock:
            try:
                self._sql("INSERT INTO rounds VALUES (?, ?, ?)", (step, started, time.time()))
            except BaseException:
                self._depth, self._round = 0, None
                self._rollback()
                raise
            self._depth, self._round = 0, None
            self._commit()

    @property
    def current_round(self) -> int | None:
        """The step of the open round, or ``None``."""
        return self._round

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        """Run one statement atomically (inside the open transaction, if any)."""
        with self._lock:
            if self._depth:
                return self._sql(sql, params)
            with self.transaction():
                return self._sql(sql, params)

    def query(self, sql: str, params: Any = ()) -> list[sqlite3.Row]:
        """Rows of a read-only statement."""
        with self._lock:
            return self._sql(sql, params).fetchall()

    # -- environments ---------------------------------------------------------------------------

    def add_environment(self, program: EnvProgram, *, step: int | None = None,
                        status: str = "pooled", parents: Iterable[str] = (),
                        lineage: Mapping[str, Any] | None = None, validation: Any = None,
                        designer_sample_id: str | None = None, exist_ok: bool = False) -> str:
        """Insert a program; returns its sha256. An existing sha256 is an error unless
        ``exist_ok`` (then nothing changes). ``validation``: a ``ValidationReport`` or its dict."""
        values = env_row(program, step, check_status(status), parents, lineage, validation,
                         designer_sample_id, time.time())
        with self._lock:
            if self.has_environment(program.sha256):
                if exist_ok:
                    return program.sha256
                raise StoreError(f"environment {program.short_id} already stored", self.path)
            self.execute(ENV_INSERT, values)
        return program.sha256

    def has_environment(self, sha: str) -> bool:
        return bool(self.query("SELECT 1 FROM environments WHERE sha256 = ?", (sha,)))

    def get_environment(self, sha: str) -> dict[str, Any]:
        """The stored row as a dict (JSON columns decoded); ``StoreNotFound`` when absent."""
        rows = self.query("SELECT * FROM environments WHERE sha256 = ?", (sha,))
        if not rows:
            raise StoreNotFound(f"no environment {sha[:12]}", self.path)
        return decode_env(rows[0])

    def get_program(self, sha: str) -> EnvProgram:
        return program_of(self.get_environment(sha))

    def set_status(self, sha: str, status: str, step: int | None = None) -> None:
        """Change an environment's status; ``retired`` also records ``retired_step``."""
        check_status(status)
        cur = self.execute(
            "UPDATE environments SET status = ?, retired_step = CASE WHEN ? = 'retired' "
            "THEN ? ELSE retired_step END WHERE sha256 = ?",
            (status, status, opt_int(step), sha))
        if cur.rowcount == 0:
            raise StoreNotFound(f"no environment {sha[:12]}", self.path)

    def environments(self, status: str | None = None,
                     skill: str | None = None) -> list[dict[str, Any]]:
        """Rows in insertion order, optionally filtered by status and skill."""
        rows = self.query(
            "SELECT * FROM environments WHERE (?1 IS NULL OR status = ?1) "
            "AND (?2 IS NULL OR skill = ?2) ORDER BY rowid", (status, skill))
        return [decode_env(r) for r in rows]

    def pool(self, active_only: bool = True, skill: str | None = None) -> list[EnvProgram]:
        """The programs of the pool (status ``pooled``), or of every stored environment."""
        return [program_of(r) for r in self.environments("pooled" if active_only else None, skill)]

    # -- plays and episodes ---------------------------------------------------------------------

    def record_play(self, env_sha: str, step: int, *, with_hint: bool, episode_return: float,
                    failure: str | None = None, turns: int | None = None,
                    tokens: int | None = None, seed: int | None = None,
                    episode_id: int | None = None) -> int:
        """One played episode (``failure``: a reason code for crashed episodes). Returns its id."""
        row = play_row(dict(env_sha=env_sha, step=step, with_hint=with_hint,
                            episode_return=episode_return, failure=failure, turns=turns,
                            tokens=tokens, seed=seed, episode_id=episode_id))
        return self.execute(PLAY_INSERT, row).lastrowid

    def record_plays(self, plays: Iterable[Mapping[str, Any]]) -> int:
        """Many plays (mappings with :meth:`record_play`'s argument names); returns the count."""
        rows = [play_row(p) for p in plays]
        with self.transaction():
            for row in rows:
                self._sql(PLAY_INSERT, row, what="record plays")
        return len(rows)

    def record_episode(self, episode: Any, *, step: int, env_sha: str | None = None,
                       with_hint: bool | None = None, role: str = "agent",
                       play: bool = True) -> int:
        """Store one trajectory (``rollout.Trajectory`` or its ``to_dict()``) with its turns.

        ``env_sha`` defaults to ``program_sha256``; ``with_hint`` to ``tag["with_hint"]``, else
        whether a hint was given. ``play=True`` also writes the matching ``plays`` row (failure
        reduced to its reason code). Returns the episode id.
        """
        ep = episode.to_dict() if hasattr(episode, "to_dict") else dict(episode)
        values, turn_rows, play_kw = episode_rows(ep, step, env_sha, with_hint, role, time.time())
        with self.transaction():
            episode_id = self._sql(EPISODE_INSERT, values, what="record episode").lastrowid
            for row in turn_rows:
                self._sql(TURN_INSERT, (episode_id, *row), what="record turns")
            if play:
                self._sql(PLAY_INSERT, play_row({**play_kw, "episode_id": episode_id}))
        return episode_id

    def get_episode(self, episode_id: int) -> dict[str, Any]:
        """An episode with decoded BLOBs and its ``turns`` list."""
        rows = self.query("SELECT * FROM episodes WHERE id = ?", (episode_id,))
        if not rows:
            raise StoreNotFound(f"no episode {episode_id}", self.path)
        turns = self.query("SELECT * FROM turns WHERE episode_id = ? ORDER BY idx", (episode_id,))
        return decode_episode(rows[0], turns)

    def episode_ids(self, env_sha: str | None = None, step: int | None = None) -> list[int]:
        rows = self.query("SELECT id FROM episodes WHERE (?1 IS NULL OR env_sha = ?1) AND "
                          "(?2 IS NULL OR step = ?2) ORDER BY id", (env_sha, step))
        return [r[0] for r in rows]

    def env_stats(self, sha: str, *, until_step: int | None = None) -> dict[str, Any]:
        """Life statistics of one environment (only plays with ``step <= until_step`` if given).

        ``win_rate``: the reference's win rate, the mean return of the no-hint plays over all
        steps clipped to [0, 1] (``None`` before the first play; the plateau's default input,
        ``reward.win_rate_input``); ``positive_share``: the share of those plays with return
        > 0 (the other choice of that knob); ``return_variance``: the population variance of
        their returns (the bimodal-hack monitor); ``regret_at_gen``: mean return with hint minus
        without, both at the environment's ``created_step`` (``None`` when either side has no
        play there); also ``n_plays``, ``n_plays_with_hint``, ``win_rate_with_hint``,
        ``positive_share_with_hint``, ``mean_return(_with_hint)`` (unclipped),
        ``n_plays_at_gen``, ``n_hint_plays_at_gen``, ``n_failures``, ``first_step``,
        ``last_step``, ``status``, ``skill``, ``created_step``, ``retired_step``.
        """
        rows = self.query(STATS_SQL, (opt_int(until_step), sha, None))
        if not rows:
            raise StoreNotFound(f"no environment {sha[:12]}", self.path)
        return dict(rows[0])

    def all_env_stats(self, status: str | None = None, *,
                      until_step: int | None = None) -> dict[str, dict[str, Any]]:
        """:meth:`env_stats` of every environment (optionally of one status), in one query."""
        rows = self.query(STATS_SQL, (opt_int(until_step), None, status))
        return {r["sha256"]: dict(r) for r in rows}

    # -- delayed designer samples ---------------------------------------------------------------

    def push_delayed(self, sample: Mapping[str, Any]) -> int:
        """Queue a designer sample until ``due_step``; returns its id. Keys: ``token_ids``,
        ``loss_mask``, ``generated_step``, ``due_step`` (required); ``logprobs`` (behaviour
        logprobs aligned with ``token_ids``, or ``None``: the trainer then drops the sample),
        ``prompt_len``, ``skill``, ``env_sha``, ``sample_id``, ``meta`` (JSON-safe)."""
        return self.execute(DELAY_INSERT, delay_row(sample, time.time())).lastrowid

    def pop_due(self, step: int) -> list[dict[str, Any]]:
        """Remove and return every queued sample with ``due_step <= step`` (oldest first)."""
        with self.transaction():
            rows = self._sql("SELECT * FROM delay_buffer WHERE due_step <= ? "
                             "ORDER BY due_step, id", (int(step),)).fetchall()
            self._sql("DELETE FROM delay_buffer WHERE due_step <= ?", (int(step),))
        return [decode_delay(r) for r in rows]

    def delayed_count(self) -> int:
        return int(self.query("SELECT COUNT(*) FROM delay_buffer")[0][0])

    def fix_delayed_reward(self, env_sha: str, reward: float, reason: str) -> int:
        """Give the queued designer samples of ``env_sha`` the fixed reward ``reward`` (their
        ``meta["fixed_reward"]``, with ``reason``) instead of the signal computed when due;
        returns how many were queued (0 once trained, or for an environment without one)."""
        value = finite(reward, "fixed reward")
        with self.transaction():
            rows = self._sql("SELECT id, meta FROM delay_buffer WHERE env_sha = ?",
                             (env_sha,)).fetchall()
            for row in rows:
                meta = {**loads(row["meta"], {}), "fixed_reward": value, "reason": str(reason)}
                self._sql("UPDATE delay_buffer SET meta = ? WHERE id = ?",
                          (dumps(meta, "meta"), row["id"]))
        return len(rows)

    # -- blacklist and hints --------------------------------------------------------------------

    def blacklist(self, sha: str, reason: str, step: int | None = None) -> None:
        """Blacklist a program (the first reason is kept); a stored environment's status
        becomes ``blacklisted``."""
        with self.transaction():
            self._sql("INSERT OR IGNORE INTO blacklist VALUES (?, ?, ?, ?)",
                      (sha, str(reason), opt_int(step), time.time()))
            self._sql("UPDATE environments SET status = 'blacklisted' WHERE sha256 = ?", (sha,))

    def record_rejected(self, *, step: int | None, skill: str | None, stage: str | None,
                        reason: str, message: str = "", sha256: str | None = None,
                        text: str = "", details: Mapping[str, Any] | None = None) -> int:
        """Keep a designer output that was not pooled (invalid, duplicate, hanging...)."""
        blob = zlib.compress(str(text).encode("utf-8", "replace"), 1)
        return self.execute(
            "INSERT INTO rejected (step, skill, stage, reason, message, sha256, text, details, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (opt_int(step), skill, stage, str(reason), str(message)[:4000], sha256, blob,
             dumps(dict(details or {}), "details"), time.time())).lastrowid

    def rejected(self, reason: str | None = None) -> list[dict[str, Any]]:
        """Rejected designer outputs (oldest first), text decoded, details parsed."""
        rows = self.query("SELECT * FROM rejected WHERE (?1 IS NULL OR reason = ?1) ORDER BY id",
                          (reason,))
        out = []
        for r in rows:
            d = dict(r)
            d["text"] = zlib.decompress(d["text"]).decode("utf-8", "replace") if d["text"] else ""
            d["details"] = loads(d["details"], {})
            out.append(d)
        return out

    def is_blacklisted(self, sha: str) -> bool:
        return self.blacklist_reason(sha) is not None

    def blacklist_reason(self, sha: str) -> str | None:
        """Why ``sha`` was blacklisted (the first reason), or None when it is not."""
        rows = self.query("SELECT reason FROM blacklist WHERE sha256 = ?", (sha,))
        return rows[0][0] if rows else None

    def blacklisted(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.query("SELECT * FROM blacklist ORDER BY created_at")]

    def blacklisted_codes(self) -> list[tuple[str, str, str]]:
        """``(sha256, reason, code)`` of every blacklisted program whose code is known: a stored
        environment's (retired by the watch), else the program extracted from the designer
        output recorded as rejected with that sha256 (a hang in validation). The near-duplicate
        blacklist gate (``EnvironmentMemory.blacklist_reason``) compares against these."""
        from spadekit.envs.extract import ExtractionError, extract_program

        cache = self._black_codes
        rows = self.query(
            "SELECT b.sha256, b.reason, e.code, (SELECT r.text FROM rejected r WHERE "
            "r.sha256 = b.sha256 ORDER BY r.id DESC LIMIT 1) AS text FROM blacklist b "
            "LEFT JOIN environments e ON e.sha256 = b.sha256 ORDER BY b.created_at")
        out = []
        for sha, reason, code, text in rows:
            if code is None:
                code = cache.get(sha)
            if code is None and text:
                try:
                    program = extract_program(zlib.decompress(text).decode(
                        "utf-8", "replace")).to_program()
                except (ExtractionError, zlib.error):
                    continue
                if program.sha256 != sha:
                    continue
                code = cache[sha] = program.code
            if code is not None:
                out.append((sha, reason, code))
        return out

    def put_hint(self, env_sha: str, hint: str, how: str, step: int | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        """Cache a hint; ``how`` says how it was produced (``designer``, ``second_call``...)."""
        self.execute("INSERT OR REPLACE INTO hint_cache VALUES (?, ?, ?, ?, ?, ?)",
                     (env_sha, str(hint), str(how), opt_int(step),
                      dumps(dict(meta or {}), "meta"), time.time()))

    def get_hint(self, env_sha: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM hint_cache WHERE env_sha = ?", (env_sha,))
        if not rows:
            return None
        out = dict(rows[0])
        out["meta"] = loads(out["meta"], {})
        return out

    # -- asynchronous rollouts: the queue of generated samples and the token ledger -----------

    def queue_batch(self, batch: Mapping[str, Any], samples: Iterable[Mapping[str, Any]]) -> int:
        """Queue one round's training samples for a later update (``rollout.max_staleness``).
        ``batch``: ``step``, ``version``, ``trainer_start``, ``trainer_end``; each sample:
        ``role``, ``group_id``, ``token_ids``, ``loss_mask``, ``behaviour_logprobs`` (or None),
        ``advantage``, ``weight``, ``generated_at_step``, ``truncated``. Returns the count."""
        now = time.time()
        rows = [queue_row(batch, s, now) for s in samples]
        with self.transaction():
            for row in rows:
                self._sql(QUEUE_INSERT, row)
        return len(rows)

    def queued(self) -> list[dict[str, Any]]:
        """Every queued sample (oldest round first, in the order they were queued)."""
        return [decode_queue(r) for r in self.query(
            "SELECT * FROM rollout_queue ORDER BY step, id")]

    def queued_steps(self) -> list[int]:
        return [int(r[0]) for r in self.query(
            "SELECT DISTINCT step FROM rollout_queue ORDER BY step")]

    def drop_queued(self, step: int) -> int:
        """Remove round ``step``'s queued samples (trained or cancelled); returns the count."""
        return self.execute("DELETE FROM rollout_queue WHERE step = ?", (int(step),)).rowcount

    def record_ledger(self, step: int, rows: Iterable[Mapping[str, int]]) -> None:
        """The token ledger as of round ``step``'s commit: one row per policy version."""
        with self.transaction():
            for row in rows:
                self._sql("INSERT OR REPLACE INTO token_ledger VALUES (?, ?, ?, ?, ?, ?)",
                          (int(step), int(row["version"]), int(row["generated"]),
                           int(row["trained"]), int(row["discarded"]), int(row["in_flight"])))

    def ledger(self, step: int | None = None) -> list[dict[str, int]]:
        """The token ledger rows of round ``step`` (default: every round), by version."""
        sql, params = "SELECT * FROM token_ledger", ()
        if step is not None:
            sql, params = sql + " WHERE step = ?", (int(step),)
        return [dict(r) for r in self.query(sql + " ORDER BY step, version", params)]

    # -- state, metrics, events -----------------------------------------------------------------

    def put_state(self, key: str, obj: Any) -> None:
        """Store a JSON-safe value under ``key`` (tuples come back as lists)."""
        self.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)",
                     (str(key), dumps(obj, f"state {key!r}"), time.time()))

    def get_state(self, key: str, default: Any = None) -> Any:
        rows = self.query("SELECT value FROM kv WHERE key = ?", (str(key),))
        return loads(rows[0][0]) if rows else default

    def log_metrics(self, step: int, values: Mapping[str, Any]) -> None:
        """Record ``name -> number`` at ``step`` (a repeated name at a step is replaced)."""
        rows = [(str(k), int(step), finite(v, f"metric {k!r}")) for k, v in values.items()]
        with self.transaction():
            for row in rows:
                self._sql("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)", row)

    def metrics(self, name: str) -> list[tuple[int, float]]:
        return [(r[0], r[1]) for r in self.query(
            "SELECT step, value FROM metrics WHERE name = ? ORDER BY step", (name,))]

    def metric_names(self) -> list[str]:
        return [r[0] for r in self.query("SELECT DISTINCT name FROM metrics ORDER BY name")]

    def append_event(self, event: Mapping[str, Any]) -> int:
        """Store an event and append it to ``events.jsonl`` (after the round commits, if a
        round is open). ``step`` defaults to the open round; ``kind`` is taken from the event's
        ``kind``/``type``/``event`` key. Returns the event id."""
        data = dict(event)
        step = data.get("step", self._round)
        kind = data.get("kind", data.get("type", data.get("event")))
        now = float(data.get("time", time.time()))
        text = dumps(data, "event")
        with self.transaction():
            event_id = self._sql("INSERT INTO events (step, time, kind, data) VALUES "
                                 "(?, ?, ?, ?)", (opt_int(step), now, kind, text)).lastrowid
            line = {"id": event_id, "time": now, "step": step, **data}
            self._pending.append(dumps(line, "event"))
        return event_id

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        rows = self.query("SELECT * FROM events WHERE (?1 IS NULL OR kind = ?1) ORDER BY id",
                          (kind,))
        return [{**dict(r), "data": loads(r["data"])} for r in rows]

    def _flush_events(self) -> None:
        lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            with open(self.events_path, "a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in lines))
                fh.flush()
        except OSError as exc:
            raise StoreError(f"could not append to {self.events_path}: {exc}",
                             self.events_path) from exc

    # -- rounds and checkpoints -----------------------------------------------------------------

    def latest_complete_step(self) -> int | None:
        """The step of the last committed round, or ``None`` before the first."""
        return self.query("SELECT MAX(step) FROM rounds")[0][0]

    def completed_rounds(self) -> list[int]:
        return [r[0] for r in self.query("SELECT step FROM rounds ORDER BY step")]

    def checkpoint_dir(self, step: int, create: bool = False) -> Path:
        """``run_dir/checkpoints/step-N`` (made when ``create``)."""
        path = self.run_dir / "checkpoints" / f"step-{int(step)}"
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return path

    def record_checkpoint(self, step: int, path: str | Path | None = None,
                          meta: Mapping[str, Any] | None = None) -> None:
        """Point at the checkpoint for ``step`` (call inside the round, after the files are
        written, so the pointer commits with the round it matches)."""
        target = Path(path) if path is not None else self.checkpoint_dir(step)
        with contextlib.suppress(ValueError):
            target = target.relative_to(self.run_dir)
        self.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?)",
                     (int(step), str(target), dumps(dict(meta or {}), "meta"), time.time()))

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """``{"step", "path" (absolute), "meta"}`` of the newest recorded checkpoint."""
        rows = self.checkpoints()
        return rows[-1] if rows else None

    def checkpoints(self) -> list[dict[str, Any]]:
        """Every recorded checkpoint pointer (as :meth:`latest_checkpoint`), oldest first."""
        out = []
        for row in self.query("SELECT * FROM checkpoints ORDER BY step"):
            path = Path(row["path"])
            out.append({"step": row["step"], "meta": loads(row["meta"], {}),
                        "path": path if path.is_absolute() else self.run_dir / path})
        return out

    def forget_checkpoints(self, steps: Iterable[int]) -> None:
        """Drop the pointers of ``steps`` (committed at once; their files go after)."""
        with self.transaction():
            for step in steps:
                self._sql("DELETE FROM checkpoints WHERE step = ?", (int(step),))

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r})"

