"""The released-pool layout (the SPADE reference's published pool), written and read.

A release directory holds ``games/game_<step>_<index>_<skill>.py`` (each program's code exactly),
``manifest.jsonl`` (one record an environment: identity, hint, skill, status, lineage and
statistics; :data:`MANIFEST_KEYS`), ``validation_manifest.jsonl`` (its validation report),
``validation_summary.json``, ``snapshot_summary.json`` and ``checksums.sha256`` (``sha256sum -c``
format, every other file). :func:`write_release` builds it in a sibling temporary directory and
renames it into place, so a failure (a full disk) leaves no half release. :func:`read_release`
reads one as untrusted: every file's checksum is verified, a game file must lie in ``games/``,
and a record that fails either is skipped with its reason, never loaded. Details:
docs/pools.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from spadekit.common.errors import ConfigError
from spadekit.common.jsonl import read_jsonl
from spadekit.common.safe_json import MAX_DOCUMENT_BYTES, load_file
from spadekit.envs.program import EnvProgram
from spadekit.envs.refimport import MAX_GAME_FILE_BYTES

__all__ = ["CHECKSUMS", "FORMAT", "MANIFEST", "MANIFEST_KEYS", "ReleaseError", "STAT_KEYS",
           "VALIDATION_MANIFEST", "game_file_name", "gym_id", "is_games_of_spadekit_release",
           "is_release", "plain_json", "read_release", "round_number", "sha256_file",
           "verified_snapshot", "write_release"]

FORMAT = "spadekit-release/1"
MANIFEST, VALIDATION_MANIFEST = "manifest.jsonl", "validation_manifest.jsonl"
VALIDATION_SUMMARY, SNAPSHOT_SUMMARY, CHECKSUMS = (
    "validation_summary.json", "snapshot_summary.json", "checksums.sha256")
GAMES = "games"
STAT_KEYS = ("win_rate", "win_rate_with_hint", "regret", "designer_reward", "n_plays",
             "n_plays_with_hint")
"""The statistics of an environment, as its run measured them (None where never measured)."""
MANIFEST_KEYS = ("id", "sha256", "game_file", "class_name", "skill", "domain", "hint", "status",
                 "removed_reason", "source", "created_step", "retired_step", "rollout_id",
                 "parents", "lineage", *STAT_KEYS, "actor_win_rate", "valid", "meta")
MAX_CHECKSUMS_BYTES = 64 * 1024 * 1024
_OWN_KEYS = ("lineage", "validation", "generation", "reference_stats")
"""Program meta keys the manifest carries elsewhere (its own fields, the validation manifest)."""
_CHECKSUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


class ReleaseError(ConfigError):
    """A release directory that cannot be written or read (names the path and why)."""

    reason = "release"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def game_file_name(step: int | None, index: int, skill: str | None) -> str:
    """``game_<step:05d>_<index:03d>_<skill slug>.py``, the reference's naming."""
    slug = re.sub(r"[^a-z0-9]+", "_", (skill or "unknown").lower()).strip("_") or "unknown"
    return f"game_{round_number(step) or 0:05d}_{index:03d}_{slug}.py"


def gym_id(pool_name: str, short_id: str, hinted: bool = False) -> str:
    """``spadekit/<pool>-<short id>`` (``...-hinted`` with the hint shown): the Gymnasium id of a
    pool's program (the pool name with anything but letters, digits, ``_``, ``.`` and ``-`` made
    ``_``)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", pool_name).strip("_.-") or "pool"
    return f"spadekit/{name}-{short_id}" + ("-hinted" if hinted else "")


def is_release(path: str | Path) -> bool:
    path = Path(path)
    return (path / MANIFEST).is_file() and (path / GAMES).is_dir()


def verified_snapshot(path: str | Path) -> dict:
    """A release's ``snapshot_summary.json`` when ``checksums.sha256`` lists it and it matches,
    else ``{}`` (an unlisted or changed snapshot names nothing)."""
    root = Path(path)
    try:
        sums = _checksums(root)
        decoded = load_file(_verified(root, SNAPSHOT_SUMMARY, sums)).value
    except ConfigError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def is_games_of_spadekit_release(path: str | Path) -> bool:
    """``path`` is the ``games/`` folder of a spadekit export (read the release instead: its
    manifest says which programs its run took out)."""
    path = Path(path).expanduser().resolve()
    return (path.name == GAMES and is_release(path.parent)
            and verified_snapshot(path.parent).get("format") == FORMAT)


def _json_line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False, sort_keys=False) + "\n"


ExtraFiles = Callable[[list[dict], list[dict]], Mapping[str, bytes]]


def write_release(out: str | Path, entries: Iterable[Mapping[str, Any]],
                  snapshot: Mapping[str, Any], extra_files: ExtraFiles | None = None,
                  force: bool = False) -> dict:
    """Write the release ``out`` from ``entries`` (each: ``program`` (EnvProgram), ``validation``
    (a report dict), ``status``, ``removed_reason``, ``created_step``, ``retired_step``,
    ``parents``, ``lineage``, and :data:`STAT_KEYS`). ``extra_files(manifest, validations)``:
    more files by relative path (a dataset's parquet and card), checksummed too. ``out`` must
    not exist unless ``force`` (then it is replaced whole). Returns the validation summary."""
    out = Path(out).expanduser()
    out = out.resolve() if out.name in ("", ".", "..") else out.parent.resolve() / out.name
    if (out.exists() or out.is_symlink()) and not force:
        raise ReleaseError(f"{out} exists: choose a new directory, or pass --force to replace it")
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        summary = _write_tree(tmp, list(entries), snapshot, extra_files)
        if out.exists() or out.is_symlink():  # a link is replaced, never its target
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)  # the old OUT comes back whole
                raise
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        else:
            os.replace(tmp, out)
    except (OSError, ValueError) as exc:  # a full disk; a value JSON cannot hold
        shutil.rmtree(tmp, ignore_errors=True)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ReleaseError(f"{out}: cannot write the release: {why}") from None
    except BaseException:  # an interrupt: nothing half written stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _write_tree(root: Path, entries: list[Mapping[str, Any]], snapshot: Mapping[str, Any],
                extra_files: ExtraFiles | None) -> dict:
    (root / GAMES).mkdir(parents=True)
    per_step: Counter = Counter()
    manifest, validations = [], []
    for entry in entries:
        program: EnvProgram = entry["program"]
        step = round_number(entry.get("created_step"))
        name = game_file_name(step, per_step[step], program.skill)
        per_step[step] += 1
        (root / GAMES / name).write_bytes(program.code.encode("utf-8", "surrogatepass"))
        meta = {k: v for k, v in plain_json(program.meta).items() if k not in _OWN_KEYS}
        record = {"id": program.short_id, "sha256": program.sha256, "game_file": f"{GAMES}/{name}",
                  "class_name": program.class_name, "skill": program.skill,
                  "domain": program.domain, "hint": program.hint, "status": entry["status"],
                  "removed_reason": entry.get("removed_reason"), "source": program.source,
                  "created_step": step, "retired_step": entry.get("retired_step"),
                  "rollout_id": step, "parents": list(entry.get("parents") or []),
                  "lineage": dict(entry.get("lineage") or {}),
                  **{k: entry.get(k) for k in STAT_KEYS},
                  "actor_win_rate": entry.get("win_rate"),
                  "valid": bool((entry.get("validation") or {}).get("ok", True)), "meta": meta}
        manifest.append(record)
        validations.append({"id": program.short_id, "sha256": program.sha256,
                            "game_file": record["game_file"], "valid": record["valid"],
                            "validation": entry.get("validation")})
    summary = _summary(manifest)
    files = {MANIFEST: "".join(_json_line(r) for r in manifest).encode("utf-8"),
             VALIDATION_MANIFEST: "".join(_json_line(v) for v in validations).encode("utf-8"),
             VALIDATION_SUMMARY: _pretty(summary),
             SNAPSHOT_SUMMARY: _pretty({"format": FORMAT, **snapshot, "counts": summary}),
             **(extra_files(manifest, validations) if extra_files else {})}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    listed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    (root / CHECKSUMS).write_text("".join(f"{sha256_file(root / rel)}  {rel}\n" for rel in listed),
                                  encoding="utf-8")
    for path in [*root.rglob("*"), root]:
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    return summary


def _pretty(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


def plain_json(value: Any) -> Any:
    """Frozen program meta (mappings, tuples) as plain JSON values (dicts, lists)."""
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def _summary(manifest: list[Mapping[str, Any]]) -> dict:
    """Counts by validity, status, skill and removal reason."""
    by_skill: dict[str, Counter] = {}
    for r in manifest:
        by_skill.setdefault(r["skill"] or "unknown", Counter())[
            "valid" if r["valid"] else "invalid"] += 1
    return {"total": len(manifest), "valid": sum(1 for r in manifest if r["valid"]),
            "invalid": sum(1 for r in manifest if not r["valid"]),
            "by_status": dict(sorted(Counter(r["status"] for r in manifest).items())),
            "by_skill": {k: dict(sorted(v.items())) for k, v in sorted(by_skill.items())},
            "removed": dict(sorted(Counter(r["removed_reason"] for r in manifest
                                           if r["removed_reason"]).items()))}


# -- reading ---------------------------------------------------------------------------------


def _checksums(root: Path) -> dict[str, str]:
    """Relative path -> expected SHA-256 from ``checksums.sha256`` (ReleaseError when absent or
    malformed: a release without checksums cannot be trusted)."""
    path = root / CHECKSUMS
    if not path.is_file() or path.is_symlink():
        raise ReleaseError(f"{root}: no {CHECKSUMS}: not a release directory (or an incomplete "
                           "copy of one)")
    if path.stat().st_size > MAX_CHECKSUMS_BYTES:
        raise ReleaseError(f"{path} is larger than {MAX_CHECKSUMS_BYTES} bytes")
    out = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"{path}: cannot read: {exc}") from None
    for number, line in enumerate(lines, 1):
        match = _CHECKSUM_LINE.match(line)
        if not match:
            raise ReleaseError(f"{path}: line {number} is not '<sha256>  <file>'")
        if out.get(match.group(2), match.group(1)) != match.group(1):
            raise ReleaseError(f"{path}: line {number} gives {match.group(2)} a second, "
                               "different checksum")
        out[match.group(2)] = match.group(1)
    return out


def _verified(root: Path, rel: str, sums: Mapping[str, str]) -> Path:
    """``root/rel`` once it is a regular file inside ``root`` whose checksum matches (else
    ReleaseError saying why)."""
    if rel not in sums:
        raise ReleaseError(f"{rel} is not listed in {CHECKSUMS}")
    path = root / rel
    resolved = path.resolve()
    if root.resolve() not in resolved.parents or path.is_symlink() or not path.is_file():
        raise ReleaseError(f"{rel} is not a regular file inside the release")
    limit = MAX_GAME_FILE_BYTES if rel.startswith(f"{GAMES}/") else MAX_DOCUMENT_BYTES
    if path.stat().st_size > limit:
        raise ReleaseError(f"{rel} is larger than {limit} bytes")
    if sha256_file(path) != sums[rel]:
        raise ReleaseError(f"{rel} does not match its checksum (changed or corrupt)")
    return path


def _records(root: Path, name: str, sums: Mapping[str, str], skipped: list[dict],
             ) -> list[dict | None]:
    """The JSON objects of a verified JSON-lines file; a line that is not one is None, and
    added to ``skipped`` with its reason."""
    out: list[dict | None] = []
    for line in read_jsonl(_verified(root, name, sums)):
        if line.error is None and isinstance(line.value, dict):
            out.append(line.value)
            continue
        why = line.error.message if line.error is not None else "not a JSON object"
        skipped.append({"what": f"{name} line {line.number}", "why": why})
        out.append(None)
    return out


def read_release(path: str | Path, include_removed: bool = False,
                 ) -> tuple[list[EnvProgram], list[dict], dict]:
    """The programs of a release, their validation records (by position), and a summary
    ``{"records", "imported", "skipped": [{"what", "why"}], "snapshot"}``. Each program carries
    ``meta["lineage"]`` (its run lineage, its record's status and steps, the release's name and
    game file) and ``meta["reference_stats"]`` (:data:`STAT_KEYS`). Programs the run took out
    (status ``blacklisted``) are skipped unless ``include_removed``."""
    root = Path(path)
    sums = _checksums(root)
    skipped: list[dict] = []
    manifest = _records(root, MANIFEST, sums, skipped)
    checks = {}
    if VALIDATION_MANIFEST in sums:
        checks = {r["sha256"]: r.get("validation") for r in
                  _records(root, VALIDATION_MANIFEST, sums, [])
                  if r is not None and isinstance(r.get("sha256"), str)}
    snapshot = verified_snapshot(root) if SNAPSHOT_SUMMARY in sums else {}
    name = snapshot.get("name") if isinstance(snapshot.get("name"), str) else root.name
    programs, validations, seen, named = [], [], set(), set()
    for index, record in enumerate(manifest):
        what = f"{MANIFEST} record {index}"
        if record is None:
            continue
        game_file = record.get("game_file")
        if isinstance(game_file, str) and game_file in named:
            skipped.append({"what": what, "why": f"names {game_file[:200]} again (an earlier "
                            "record's game file)"})
            continue
        if isinstance(game_file, str):
            named.add(game_file)
        if record.get("status") == "blacklisted" and not include_removed:
            skipped.append({"what": what, "why": "taken out of its run's pool ("
                            f"{str(record.get('removed_reason'))[:100]}): only with "
                            "include_removed"})
            continue
        try:
            program = _program(root, name, record, sums)
        except (ReleaseError, TypeError, ValueError) as exc:
            skipped.append({"what": what, "why": getattr(exc, "message", str(exc))})
            continue
        if program.sha256 in seen:
            skipped.append({"what": what, "why": "a repeat of an earlier record"})
            continue
        seen.add(program.sha256)
        programs.append(program)
        validations.append(checks.get(program.sha256))
    return programs, validations, {"records": len(manifest), "imported": len(programs),
                                   "skipped": skipped, "snapshot": snapshot}


def _text(record: Mapping[str, Any], key: str) -> str | None:
    value = record.get(key)
    if value is not None and not isinstance(value, str):
        raise ReleaseError(f"{key!r} must be a string or null")
    return value


def round_number(value: Any) -> int | None:
    """A round number, or None (anything but an int in [0, 10**9))."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9
    return value if ok else None


def _code(root: Path, game_file: str, sums: Mapping[str, str]) -> str:
    """The verified text of a game file (each is named by one record at most)."""
    path = _verified(root, game_file, sums)
    if path.resolve().parent != (root / GAMES).resolve():
        raise ReleaseError(f"game_file {game_file!r} is not a file in {GAMES}/")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ReleaseError(f"{game_file} is not UTF-8") from None


def _program(root: Path, name: str, record: Mapping[str, Any], sums: Mapping[str, str],
             ) -> EnvProgram:
    game_file = _text(record, "game_file")
    if not game_file or not game_file.startswith(f"{GAMES}/") or "\0" in game_file:
        raise ReleaseError(f"game_file {game_file!r} is not a file in {GAMES}/")
    code = _code(root, game_file, sums)
    meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
    lineage = record.get("lineage") if isinstance(record.get("lineage"), dict) else {}
    stats = {k: record.get(k) for k in STAT_KEYS}
    for key, value in stats.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ReleaseError(f"statistic {key!r} must be a number or null")
    program = EnvProgram(
        code=code, hint=_text(record, "hint"), skill=_text(record, "skill"),
        domain=_text(record, "domain"), source=_text(record, "source"),
        class_name=_text(record, "class_name"),
        meta={**meta, "reference_stats": stats,
              "lineage": {**lineage, "release": name, "release_game_file": game_file,
                          "parents": record.get("parents") if isinstance(
                              record.get("parents"), list) else [],
                          "status": record.get("status"),
                          "removed_reason": record.get("removed_reason"),
                          "created_step": round_number(record.get("created_step")),
                          "retired_step": round_number(record.get("retired_step"))}})
    if isinstance(record.get("sha256"), str) and record["sha256"] != program.sha256:
        raise ReleaseError(f"{game_file}: the manifest's sha256 is not the program's")
    return program
