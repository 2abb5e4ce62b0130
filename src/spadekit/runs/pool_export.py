"""``spadekit pool export``: a run's (or a pool directory's) environments as a release directory
and a Hugging Face dataset, in one directory.

:func:`export_entries` reads what leaves: from a run, the designed programs that passed
validation and entered the pool (status ``pooled``, or ``retired`` at the end of their interval;
bootstrap copies of the library never), with their statistics measured from the run's ``plays``
(:data:`~spadekit.runs.release.STAT_KEYS`; the designer reward from the memory) and the run's
config (its secret stream key withheld); programs taken out for cause (``blacklisted``: hung,
gamed, slow) only with ``include_removed``, each naming its ``removed_reason``. From a pool
directory: its programs, with the statistics they carry.
:func:`export_pool` writes the release (``spadekit.runs.release``) plus ``data/train-*.parquet``
and a dataset card ``README.md`` (``spadekit.runs.pool_card``), so ``datasets.load_dataset(DIR)``
reads it offline. The same input exports the same bytes. Details: docs/pools.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spadekit.common.errors import ConfigError
from spadekit.runs.release import STAT_KEYS, write_release

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
        return _pool_entries(path)
    raise ConfigError(f"{source}: not a run directory (run.sqlite) or a pool directory "
                      "(pool.jsonl)")


def _run_entries(path: Path, include_removed: bool) -> tuple[list[dict], dict]:
    from spadekit.runs.schema import StoreError
    from spadekit.runs.store import RunStore, program_of

    try:
        store = RunStore.open(path)
    except StoreError as exc:
        raise ConfigError(f"{path}: cannot read the run database: {exc}") from None
    try:
        stats = store.all_env_stats()
        designer = {r["sha256"]: r["designer_reward"] for r in
                    store.query("SELECT sha256, designer_reward FROM memory")}
        removed = {r["sha256"]: r["reason"] for r in store.blacklisted()}
        entries = []
        for row in store.environments():
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
                "win_rate": s.get("win_rate"), "win_rate_with_hint": s.get("win_rate_with_hint"),
                "regret": s.get("regret_at_gen"), "designer_reward": designer.get(sha),
                "n_plays": s.get("n_plays"), "n_plays_with_hint": s.get("n_plays_with_hint")})
        rounds = len(store.completed_rounds())
    finally:
        store.close()
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


def _pool_entries(path: Path) -> tuple[list[dict], dict]:
    from spadekit.runs.pool import PoolError, read_pool

    try:
        programs, _skipped = read_pool(path, strict=True)
    except PoolError as exc:
        raise ConfigError(str(exc)) from None
    entries = []
    for program in programs:
        lineage = dict(program.meta.get("lineage") or {})
        stats = dict(program.meta.get("reference_stats") or {})
        validation = program.meta.get("validation")
        entries.append({
            "program": program, "status": lineage.get("status") or "pooled",
            "validation": dict(validation) if validation else {"ok": True, "stage": "unknown",
                                                               "reason": "not recorded"},
            "removed_reason": lineage.get("removed_reason"),
            "created_step": lineage.get("created_step"), "retired_step": None,
            "parents": list(lineage.get("parents") or []),
            "lineage": {k: v for k, v in lineage.items()
                        if k not in ("parents", "status", "removed_reason")},
            **{k: stats.get(k) for k in STAT_KEYS}})
    return entries, {"kind": "pool", "name": path.name, "rounds": None, "config": None}


def export_pool(source: str | Path, out: str | Path, *, include_removed: bool = False,
                license: str = "unknown", name: str | None = None, parquet: bool = True,
                force: bool = False) -> dict[str, Any]:
    """Export ``source`` into ``out`` (see the module docstring); returns the validation
    summary plus ``out`` and ``parquet`` (the data file, or None)."""
    from spadekit import __version__
    from spadekit.runs.pool_card import dataset_card, parquet_bytes, rows_of

    entries, about = export_entries(source, include_removed)
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
    return {**summary, "out": str(out), "parquet": data_file, "name": name}
