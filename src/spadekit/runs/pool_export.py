"""``spadekit pool export``: a run's (or a pool directory's) environments as a release directory
and a Hugging Face dataset, in one directory.

:func:`export_entries` reads what leaves: from a run, the designed programs that passed
validation and entered the pool (status ``pooled``, or ``retired`` at the end of their interval;
bootstrap copies of the library never), with their statistics measured from the run's ``plays``
(:data:`~spadekit.runs.release.STAT_KEYS`; the designer reward from the memory) and the run's
config (its secret stream key withheld); programs taken out for cause (``blacklisted``: hung,
gamed, slow) only with ``include_removed``, each naming its ``removed_reason``. From a pool
directory: its validated programs (never-validated ones are counted and left out), with the
statistics they carry.
:func:`export_pool` writes the release (``spadekit.runs.release``) plus ``data/train-*.parquet``
and a dataset card ``README.md`` (``spadekit.runs.pool_card``), so ``datasets.load_dataset(DIR)``
reads it offline. The same input exports the same bytes. Details: docs/pools.md.
"""

from __future__ import annotations

import math
import re
import sqlite3
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

from spadekit.common.errors import ConfigError
from spadekit.runs.release import STAT_KEYS, plain_json as _plain, round_number, write_release

__all__ = ["export_entries", "export_pool"]

_KEPT = ("pooled", "retired")


def export_entries(source: str | Path, include_removed: bool = False,
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The entries that leave ``source`` (a run or a pool directory) and what the card says of
    the source: ``{"kind", "name", "config": text or None, "rounds"}``."""
    path = Path(source).expanduser()
    if (path / "run.sqlite").is_file():
        return _run_entries(path, include_removed)
    if (path / "pool.jsonl").is_file():
        return _pool_entries(path, include_removed)
    raise ConfigError(f"{source}: not a run directory (run.sqlite) or a pool directory "
                      "(pool.jsonl)")


def _finite(value: Any) -> Any:
    """A statistic as exported: a finite number, or None (NaN, infinities and non-numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _read_only(db: Path) -> sqlite3.Connection:
    """A read-only connection to a run database (a run on read-only storage exports too):
    ``immutable=1`` when no writer holds it (no ``-wal``), else a ``mode=ro`` WAL reader."""
    wal = db.with_name(db.name + "-wal")
    params = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"file:{quote(str(db.resolve()))}?{params}", uri=True,
                           isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def _run_entries(path: Path, include_removed: bool) -> tuple[list[dict], dict]:
    from spadekit.runs.schema import STATS_SQL, decode_env, program_of

    try:
        conn = _read_only(path / "run.sqlite")
        try:
            rows = [decode_env(r) for r in conn.execute(
                "SELECT * FROM environments ORDER BY rowid")]
            stats = {r["sha256"]: dict(r) for r in conn.execute(STATS_SQL, (None, None, None))}
            designer = dict(conn.execute("SELECT sha256, designer_reward FROM memory").fetchall())
            removed = dict(conn.execute("SELECT sha256, reason FROM blacklist").fetchall())
            rounds = conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
        finally:
            conn.close()
    except (sqlite3.Error, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the run database: {exc}") from None
    entries = []
    for row in rows:
        status, validation = row["status"], row.get("validation")
        if (row.get("lineage") or {}).get("bootstrap") or not isinstance(validation, dict):
            continue
        if not validation.get("ok") or status == "invalid":
            continue
        if status not in _KEPT and not (include_removed and status == "blacklisted"):
            continue
        sha, s = row["sha256"], stats.get(row["sha256"], {})
        entries.append({
            "program": program_of(row), "validation": validation, "status": status,
            "removed_reason": removed.get(sha) if status == "blacklisted" else None,
            "created_step": row.get("created_step"), "retired_step": row.get("retired_step"),
            "parents": row.get("parents") or [], "lineage": {
                **(row.get("lineage") or {}), "run": path.name,
                "designer_sample_id": row.get("designer_sample_id")},
            **{k: _finite(s.get(k)) for k in ("win_rate", "win_rate_with_hint", "n_plays",
                                              "n_plays_with_hint")},
            "regret": _finite(s.get("regret_at_gen")),
            "designer_reward": _finite(designer.get(sha))})
    return entries, {"kind": "run", "name": path.name, "rounds": rounds,
                     "config": _public_config(path / "config.yaml")}


_SECRET_KEYS = ("stream_key",)
"""Config keys that stay with the run (the random streams' key: a program that knew it could
compute the seeds it is played on)."""


def _public_config(path: Path) -> str | None:
    """The run's config as YAML with its secrets withheld (None when absent or unreadable)."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    for key in _SECRET_KEYS:
        if key in config:
            config[key] = "withheld"
    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


_REPORT_KEYS = ("ok", "stage", "reason", "message")


def _full_report(summary: Any) -> dict | None:
    """A pool line's validation summary in a run's report shape (``ok``, ``stage``, ``reason``,
    ``message``, ``details``); None when the program was never validated."""
    if not isinstance(summary, Mapping) or not isinstance(summary.get("ok"), bool):
        return None
    summary = _plain(summary)
    if isinstance(summary.get("details"), dict):
        return summary
    return {**{k: summary.get(k) for k in _REPORT_KEYS},
            "details": {k: v for k, v in summary.items() if k not in _REPORT_KEYS}}


def _pool_entry(program: Any, include_removed: bool) -> dict | None:
    """One pool program's export entry; None when it does not leave (never validated, failed
    validation, or removed without ``include_removed``). Odd meta is read as absent."""
    def mapping(value: Any) -> dict:
        return _plain(value) if isinstance(value, Mapping) else {}

    lineage, stats = mapping(program.meta.get("lineage")), mapping(
        program.meta.get("reference_stats"))
    validation = _full_report(program.meta.get("validation"))
    status = lineage.get("status") if isinstance(lineage.get("status"), str) else "pooled"
    if validation is None or not validation["ok"]:
        return None
    if status not in _KEPT and not (include_removed and status == "blacklisted"):
        return None
    parents = lineage.get("parents")
    reason = lineage.get("removed_reason")
    return {"program": program, "status": status, "validation": validation,
            "removed_reason": reason if isinstance(reason, str) else None,
            "created_step": round_number(lineage.get("created_step")),
            "retired_step": round_number(lineage.get("retired_step")),
            "parents": [p for p in parents if isinstance(p, str)] if isinstance(
                parents, list) else [],
            "lineage": {k: v for k, v in lineage.items() if k not in _RELEASE_KEYS},
            **{k: _finite(stats.get(k)) for k in STAT_KEYS}}


def _pool_entries(path: Path, include_removed: bool) -> tuple[list[dict], dict]:
    from spadekit.runs.pool import PoolError, read_pool

    try:
        programs, _skipped = read_pool(path, strict=True)
    except PoolError as exc:
        raise ConfigError(str(exc)) from None
    entries, unvalidated = [], 0
    for program in programs:
        entry = _pool_entry(program, include_removed)
        if entry is not None:
            entries.append(entry)
        else:
            unvalidated += _full_report(program.meta.get("validation")) is None
    return entries, {"kind": "pool", "name": path.name, "rounds": None, "config": None,
                     "unvalidated": unvalidated}


_RELEASE_KEYS = ("parents", "status", "removed_reason", "created_step", "retired_step")
"""Lineage keys an imported release's record fills, exported as the record's own fields."""
_LICENSE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]{0,63}$")


def export_pool(source: str | Path, out: str | Path, *, include_removed: bool = False,
                license: str = "unknown", name: str | None = None, parquet: bool = True,
                force: bool = False) -> dict[str, Any]:
    """Export ``source`` into ``out`` (see the module docstring); returns the validation
    summary plus ``out`` and ``parquet`` (the data file, or None)."""
    from spadekit import __version__
    from spadekit.runs.pool_card import dataset_card, parquet_bytes, rows_of

    if not isinstance(license, str) or not _LICENSE.fullmatch(license):
        raise ConfigError(f"--license {license!r} is not a licence id (letters, digits, '.', "
                          "'+', '-'; e.g. apache-2.0, mit, cc-by-4.0)")
    source_dir, out_dir = Path(source).expanduser().resolve(), Path(out).expanduser().resolve()
    if out_dir == source_dir or out_dir in source_dir.parents or source_dir in out_dir.parents:
        raise ConfigError(f"{out}: the export would write over or into {source}: choose a "
                          "directory outside it")
    if parquet:
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise ConfigError("writing the dataset needs pyarrow: install the trl extra (`bash "
                              "install.sh` does), or export with --format release")
    entries, about = export_entries(source_dir, include_removed)
    if not entries:
        raise ConfigError(f"{source}: no environment leaves it (no validated program entered "
                          "its pool" + ("" if include_removed else "; --include-removed adds "
                                        "the ones taken out") + ")")
    name = name or about["name"]
    snapshot = {"spadekit_version": __version__, "name": name, "license": license,
                "source": {k: about[k] for k in ("kind", "name", "rounds")},
                "included": "pooled and removed" if include_removed else "pooled"}
    data_file = "data/train-00000-of-00001.parquet" if parquet else None

    def extra(manifest: list[dict], validations: list[dict]) -> dict[str, bytes]:
        files = {}
        if about.get("config"):
            files["run_config.yaml"] = about["config"].encode("utf-8")
        if data_file:
            codes = [e["program"].code for e in entries]
            rows = rows_of(manifest, validations, codes, name)
            files[data_file] = parquet_bytes(rows)
            files["README.md"] = dataset_card(rows, snapshot, about.get("config"), data_file)
        return files

    summary = write_release(out, entries, snapshot, extra, force=force)
    return {**summary, "out": str(out), "parquet": data_file, "name": name,
            "unvalidated_left_out": about.get("unvalidated", 0)}
