"""Environment memory (SPEC point 9): the programs the designer is shown as references.

Records live in the run database's ``memory`` table (they survive a crash with their round):
program, statistics, step, lineage, validation summary; at most ``cap`` (200), FIFO eviction.
:meth:`EnvironmentMemory.positive_seeds`: same-skill records with a no-hint win rate in
[0.15, 0.85] ranked by regret, top ``max(3n, 10)``, ``n`` sampled (unplayed ones only when none
qualifies); :meth:`EnvironmentMemory.negative_seed`: one too easy (> 0.9) or too hard (< 0.1).
Near duplicates: :func:`fingerprint` canonicalises code (bound names, strings, docstrings,
comments) into 5-token shingles compared by Jaccard similarity (default threshold 0.9); kit
programs by :func:`~spadekit.selfplay.kit_identity.kit_identity`. The blacklist gate uses
:func:`containment`, so dead code added to a blacklisted program does not help. Details:
docs/design/selfplay.md.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spadekit.envs.program import EnvProgram, find_env_classes
from spadekit.runs.store import RunStore
from spadekit.runs.schema import StoreError, StoreNotFound, dumps, finite, loads
from spadekit.selfplay.canonical import canonical_tokens
from spadekit.selfplay.kit_identity import kit_identity
from spadekit.selfplay.rewards import WIN_RATE_INPUTS

__all__ = ["DEFAULT_CAP", "DUPLICATE_THRESHOLD", "EnvironmentMemory", "MemoryRecord",
           "canonical_tokens", "fingerprint", "jaccard", "containment", "similarity_of",
           "summarize_validation"]

DEFAULT_CAP = 200
DUPLICATE_THRESHOLD = 0.9
SHINGLE_SIZE = 5
POSITIVE_BAND = (0.15, 0.85)
TOO_EASY, TOO_HARD = 0.9, 0.1
_STATS = ("win_rate", "win_rate_with_hint", "regret", "designer_reward")
_KEEP = object()


@dataclass(frozen=True)
class MemoryRecord:
    """One memory entry. ``win_rate`` is the no-hint win rate (``None``: not known yet)."""

    sha256: str
    code: str
    hint: str | None = None
    skill: str | None = None
    domain: str | None = None
    win_rate: float | None = None
    win_rate_with_hint: float | None = None
    regret: float | None = None
    designer_reward: float | None = None
    n_plays: int = 0
    step: int | None = None
    parents: tuple[str, ...] = ()
    validation: dict[str, Any] | None = field(default=None, compare=False)
    library: bool = False
    seq: int = 0

    @property
    def program(self) -> EnvProgram:
        return EnvProgram(code=self.code, hint=self.hint, skill=self.skill, domain=self.domain)

    @property
    def repaired(self) -> dict[str, Any] | None:
        """``{"attempts", "first_reason", ...}`` for a program that passed only after repair
        turns (kept in the validation summary), else ``None``."""
        mark = (self.validation or {}).get("repaired")
        return mark if isinstance(mark, dict) else None

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "code": self.code, "hint": self.hint, "skill": self.skill,
                "domain": self.domain, "win_rate": self.win_rate,
                "win_rate_with_hint": self.win_rate_with_hint, "regret": self.regret,
                "designer_reward": self.designer_reward, "n_plays": self.n_plays,
                "step": self.step, "parents": list(self.parents), "validation": self.validation,
                "library": self.library, "seq": self.seq}


def summarize_validation(report: Any) -> dict[str, Any] | None:
    """A small JSON-safe summary of a ``ValidationReport`` (or its dict): ok, stage, reason,
    message (cut to 300 characters), a few details (class name, max_turns, domain) and the
    ``repaired`` mark of a repaired program."""
    if report is None:
        return None
    data = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    details = data.get("details") or {}
    out = {k: data.get(k) for k in ("ok", "stage", "reason")}
    if data.get("message") is not None:
        out["message"] = str(data["message"])[:300]
    out.update({k: details[k] for k in ("class_name", "max_turns", "domain") if k in details})
    if details.get("repaired"):  # a repaired program (spadekit.selfplay.repair): attempts, first reason
        out["repaired"] = details["repaired"]
    return out


# ---------------------------------------------------------------------------------------------
# near-duplicate fingerprints
# ---------------------------------------------------------------------------------------------

def fingerprint(code: str, k: int = SHINGLE_SIZE) -> frozenset[tuple[str, ...]]:
    """The set of ``k``-token shingles of :func:`canonical_tokens`."""
    tokens = canonical_tokens(code)
    if len(tokens) <= k:
        return frozenset([tuple(tokens)])
    return frozenset(tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def containment(new: frozenset, old: frozenset) -> float:
    """The share of ``old``'s shingles that ``new`` holds: 1.0 when ``new`` is ``old`` with code
    added (dead code padding leaves it there, where it drags Jaccard down)."""
    if not old:
        return 1.0
    return len(new & old) / len(old)


def similarity_of(new: frozenset, old: frozenset) -> float:
    """The dedup gate's similarity: the larger of Jaccard and ``containment(new, old)``, so a
    copy padded with code it never calls is as similar as the copy itself."""
    return max(jaccard(new, old), containment(new, old))


# ---------------------------------------------------------------------------------------------
# the memory
# ---------------------------------------------------------------------------------------------


def _record(row: Mapping[str, Any]) -> MemoryRecord:
    return MemoryRecord(
        sha256=row["sha256"], code=row["code"], hint=row["hint"], skill=row["skill"],
        domain=row["domain"], win_rate=row["win_rate"],
        win_rate_with_hint=row["win_rate_with_hint"], regret=row["regret"],
        designer_reward=row["designer_reward"], n_plays=row["n_plays"], step=row["step"],
        parents=tuple(loads(row["parents"], [])), validation=loads(row["validation"]),
        library=bool(row["library"]), seq=row["seq"])


def _stat(name: str, value: Any) -> float | None:
    value = finite(value, name, optional=True)
    if value is not None and name.startswith("win_rate") and not 0.0 <= value <= 1.0:
        raise StoreError(f"{name} must be in [0, 1], got {value}")
    return value


class EnvironmentMemory:
    """A FIFO-capped memory of environments stored in ``store``'s ``memory`` table.

    ``rng`` (or ``seed``) is used by the seed samplers when a call gives no ``rng`` of its own.
    """

    def __init__(self, store: RunStore, cap: int = DEFAULT_CAP, *,
                 duplicate_threshold: float = DUPLICATE_THRESHOLD,
                 shingle_size: int = SHINGLE_SIZE, seed: int = 0,
                 win_rate_input: str = "mean_return") -> None:
        """``win_rate_input``: what a record's win rate is (``reward.win_rate_input``: the mean
        return of the no-hint plays, or the share of them with return > 0), so that the seed
        bands judge the same number the plateau does."""
        if int(cap) < 1:
            raise StoreError(f"memory cap must be at least 1, got {cap}")
        if win_rate_input not in WIN_RATE_INPUTS:
            raise StoreError(f"memory win_rate_input must be one of {WIN_RATE_INPUTS}, got "
                             f"{win_rate_input!r}")
        self.win_rate_input = win_rate_input
        self._black_fps: dict[str, frozenset] = {}
        self.store = store
        self.cap = int(cap)
        self.duplicate_threshold = float(duplicate_threshold)
        self.shingle_size = int(shingle_size)
        self.rng = random.Random(seed)
        self._fingerprints: dict[str, frozenset] = {}
        self._identities: dict[str, Any] = {}

    # -- reading --------------------------------------------------------------------------------

    def records(self, skill: str | None = None) -> list[MemoryRecord]:
        """All records in insertion order (oldest first), optionally of one skill."""
        rows = self.store.query("SELECT * FROM memory WHERE (?1 IS NULL OR skill = ?1) "
                                "ORDER BY seq", (skill,))
        return [_record(r) for r in rows]

    def get(self, sha: str) -> MemoryRecord | None:
        rows = self.store.query("SELECT * FROM memory WHERE sha256 = ?", (sha,))
        return _record(rows[0]) if rows else None

    def __len__(self) -> int:
        return int(self.store.query("SELECT COUNT(*) FROM memory")[0][0])

    def __contains__(self, sha: object) -> bool:
        return isinstance(sha, str) and self.get(sha) is not None

    # -- writing --------------------------------------------------------------------------------

    def add(self, program: EnvProgram, *, step: int | None = None,
            win_rate: float | None = None, win_rate_with_hint: float | None = None,
            regret: float | None = None, designer_reward: float | None = None,
            n_plays: int = 0, parents: Iterable[str] = (), validation: Any = None,
            library: bool = False) -> MemoryRecord:
        """Insert a program (evicting the oldest records beyond the cap) and return its record.

        A program already in memory keeps its place; the statistics given (not ``None``) are
        updated instead.
        """
        given = (win_rate, win_rate_with_hint, regret, designer_reward)
        values = {k: _stat(k, v) for k, v in zip(_STATS, given, strict=True)}
        with self.store.transaction():
            if self.get(program.sha256) is not None:
                known = {k: v for k, v in values.items() if v is not None}
                return self.update_stats(program.sha256, **known)
            self.store.execute(
                "INSERT INTO memory (sha256, code, hint, skill, domain, win_rate,"
                " win_rate_with_hint, regret, designer_reward, n_plays, step, parents,"
                " validation, library, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?)",
                (program.sha256, program.code, program.hint, program.skill, program.domain,
                 values["win_rate"], values["win_rate_with_hint"], values["regret"],
                 values["designer_reward"], int(n_plays), None if step is None else int(step),
                 dumps(list(parents), "parents"),
                 dumps(summarize_validation(validation), "validation"), int(bool(library)),
                 time.time()))
            self._evict()
        return self.get(program.sha256)

    def _evict(self) -> list[str]:
        rows = self.store.query("SELECT sha256 FROM memory ORDER BY seq DESC LIMIT -1 OFFSET ?",
                                (self.cap,))
        gone = [r[0] for r in rows]
        for sha in gone:
            self.store.execute("DELETE FROM memory WHERE sha256 = ?", (sha,))
            self._fingerprints.pop(sha, None)
            self._identities.pop(sha, None)
        return gone

    def update_stats(self, sha: str, *, win_rate: Any = _KEEP, win_rate_with_hint: Any = _KEEP,
                     regret: Any = _KEEP, designer_reward: Any = _KEEP, n_plays: Any = _KEEP,
                     step: int | None = None) -> MemoryRecord:
        """Set the statistics given (``None`` clears one); ``step`` is stored as the step of
        the update. ``StoreNotFound`` when ``sha`` is not in memory."""
        sets, params = [], []
        given = (win_rate, win_rate_with_hint, regret, designer_reward)
        for name, value in zip(_STATS, given, strict=True):
            if value is not _KEEP:
                sets.append(f"{name} = ?")
                params.append(_stat(name, value))
        if n_plays is not _KEEP:
            sets.append("n_plays = ?")
            params.append(int(n_plays))
        if step is not None:
            sets.append("updated_step = ?")
            params.append(int(step))
        if sets:
            cur = self.store.execute(f"UPDATE memory SET {', '.join(sets)} WHERE sha256 = ?",
                                     (*params, sha))
            found = cur.rowcount > 0
        else:
            found = self.get(sha) is not None
        if not found:
            raise StoreNotFound(f"no memory record {sha[:12]}", self.store.path)
        return self.get(sha)

    def refresh_from_store(self, sha: str, *, designer_reward: Any = _KEEP,
                           step: int | None = None) -> MemoryRecord:
        """Copy win rates (of ``win_rate_input``), regret at generation and play count from the
        store's ``plays``."""
        stats = self.store.env_stats(sha)
        share = self.win_rate_input == "positive_share"
        return self.update_stats(sha, win_rate=stats["positive_share" if share else "win_rate"],
                                 win_rate_with_hint=stats["positive_share_with_hint" if share
                                                          else "win_rate_with_hint"],
                                 regret=stats["regret_at_gen"], n_plays=stats["n_plays"],
                                 designer_reward=designer_reward, step=step)

    def remove(self, sha: str) -> bool:
        self._fingerprints.pop(sha, None)
        self._identities.pop(sha, None)
        return self.store.execute("DELETE FROM memory WHERE sha256 = ?", (sha,)).rowcount > 0

    def seed_from_library(self, step: int = 0) -> int:
        """Insert every reference library program (skill and hint from its SKILL/HINT, stats
        unknown, ``library=True``); returns how many were new. Idempotent."""
        from spadekit.envs.library import list_library
        from spadekit.envs.library import program as library_program

        added = 0
        with self.store.transaction():
            for entry in list_library():
                program = library_program(entry)
                classes = find_env_classes(program.code)
                program = dataclasses.replace(
                    program, class_name=classes[0] if len(classes) == 1 else None)
                if self.get(program.sha256) is None:
                    self.add(program, step=step, library=True)
                    added += 1
        return added

    def seed_from_source(self, spec: str, setting: str | None = None, step: int = 0) -> int:
        """Insert the programs of an environment source (``spadekit.runs.sources``: a pool,
        a plain directory of programs, a run, ``library``), with the win rate and regret a
        reference import carries (``meta.reference_stats``); a ``memory_seeded`` event records
        each program's lineage. Returns how many were new. Idempotent."""
        from spadekit.runs.sources import load_programs

        added, lineage = 0, []
        with self.store.transaction():
            for program in load_programs(spec, setting):
                stats = dict(program.meta.get("reference_stats") or {})
                if self.get(program.sha256) is None:
                    self.add(program, step=step, win_rate=stats.get("win_rate"),
                             regret=stats.get("regret"))
                    added += 1
                    lineage.append({"sha256": program.sha256,
                                    "lineage": dict(program.meta.get("lineage") or {})})
        self.store.append_event({"kind": "memory_seeded", "step": step, "source": str(spec),
                                 "added": added, "programs": lineage})
        return added

    # -- seeds for the designer -----------------------------------------------------------------

    def positive_seeds(self, skill: str, n: int = 2,
                       rng: random.Random | None = None) -> list[MemoryRecord]:
        """Up to ``n`` reference records for ``skill`` (rule in the module docstring)."""
        rng = rng or self.rng
        records = self.records(skill)
        lo, hi = POSITIVE_BAND
        eligible = [r for r in records if r.win_rate is not None and lo <= r.win_rate <= hi]
        if eligible:
            eligible.sort(key=lambda r: (r.regret is None, -(r.regret or 0.0), -r.seq))
            pool = eligible[:max(3 * n, 10)]
        else:
            pool = [r for r in records if r.win_rate is None]
            pool.sort(key=lambda r: (not r.library, r.seq))
        return rng.sample(pool, min(n, len(pool))) if n > 0 else []

    def negative_seed(self, skill: str, rng: random.Random | None = None
                      ) -> tuple[MemoryRecord, str] | None:
        """One record to avoid with ``"too easy"`` / ``"too hard"``, or ``None``."""
        rng = rng or self.rng
        everything = [r for r in self.records() if r.win_rate is not None
                      and (r.win_rate > TOO_EASY or r.win_rate < TOO_HARD)]
        candidates = [r for r in everything if r.skill == skill] or everything
        if not candidates:
            return None
        chosen = rng.choice(candidates)
        return chosen, "too easy" if chosen.win_rate > TOO_EASY else "too hard"

    # -- near duplicates ------------------------------------------------------------------------

    def _fingerprint_of(self, record: MemoryRecord) -> frozenset:
        fp = self._fingerprints.get(record.sha256)
        if fp is None:
            fp = self._fingerprints[record.sha256] = fingerprint(record.code, self.shingle_size)
        return fp

    def _identity_of(self, record: MemoryRecord) -> Any:
        if record.sha256 not in self._identities:
            self._identities[record.sha256] = kit_identity(record.code)
        return self._identities[record.sha256]

    def is_near_duplicate(self, code: str | EnvProgram, *, skill: str | None = None,
                          threshold: float | None = None) -> tuple[bool, str | None, float]:
        """``(is_duplicate, closest_sha, similarity)`` against the records in memory
        (optionally of one skill), by :func:`similarity_of` (a record padded with dead code is
        still that record); two kit programs by their kit identity (a copy is 1.0 and nothing
        else is a duplicate). ``closest_sha`` is ``None`` for an empty memory."""
        if isinstance(code, EnvProgram):
            code = code.code
        limit = self.duplicate_threshold if threshold is None else float(threshold)
        target = fingerprint(code, self.shingle_size)
        ident = kit_identity(code)
        best_sha, best, copy, best_is_kit = None, 0.0, False, False
        for record in self.records(skill):
            other = self._identity_of(record) if ident is not None else None
            if other is not None:
                same = other.key == ident.key or (
                    other.composition == ident.composition and
                    similarity_of(target, self._fingerprint_of(record)) >= limit)
                similarity = 1.0 if same else min(ident.similarity(other), 0.99)
            else:
                same = False
                similarity = similarity_of(target, self._fingerprint_of(record))
            if best_sha is None or similarity > best:
                best_sha, best, copy, best_is_kit = record.sha256, similarity, same, \
                    other is not None
        if best_is_kit:  # kit against kit: the identity's verdict, not the threshold
            return copy, best_sha, best
        return best_sha is not None and best >= limit, best_sha, best

    def blacklist_reason(self, program: EnvProgram) -> str | None:
        """Why ``program`` may not be pooled, or None: its own blacklist entry (exact sha256),
        else that of a blacklisted program it is a near duplicate of: the share of the
        blacklisted program's shingles found in ``program``'s (``containment``) is
        ``>= duplicate_threshold``, so a one-token edit of a retired program is refused, and so
        is one padded with dead code (which Jaccard similarity would let through)."""
        reason = self.store.blacklist_reason(program.sha256)
        if reason is not None:
            return reason
        hit = self.blacklisted_near(program.code)
        return None if hit is None else hit[1]

    def blacklisted_near(self, code: str) -> tuple[str, str, float] | None:
        """``(sha256, reason, containment)`` of the blacklisted program whose code is known
        (``RunStore.blacklisted_codes``) that ``code`` holds most of (``containment`` of its
        shingles in ``code``'s) when that is at least ``duplicate_threshold``, else None."""
        target = fingerprint(code, self.shingle_size)
        best: tuple[str, str, float] | None = None
        for sha, reason, other in self.store.blacklisted_codes():
            fp = self._black_fps.get(sha)
            if fp is None:
                fp = self._black_fps[sha] = fingerprint(other, self.shingle_size)
            similarity = containment(target, fp)
            if similarity >= self.duplicate_threshold and (best is None or similarity > best[2]):
                best = (sha, reason, similarity)
        return best


class SeedlessMemory:
    """The environment memory without designer seeds (the "w/o environment memory" ablation):
    everything else (recording, near-duplicate checks) goes to the real memory."""

    def __init__(self, memory: EnvironmentMemory) -> None:
        self._memory = memory

    def positive_seeds(self, *_args, **_kwargs) -> list:
        return []

    def negative_seed(self, *_args, **_kwargs) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._memory, name)

    def __len__(self) -> int:
        return len(self._memory)

    def __contains__(self, sha: object) -> bool:
        return sha in self._memory
