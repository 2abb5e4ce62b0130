"""A read-only view of a run directory for the dashboard, its web server and the HTML report.

Nothing here writes, and reading never blocks or is blocked by a training run: the database is
opened ``mode=ro`` (a WAL reader) while a ``-wal`` file exists, else ``immutable=1``, with a
failing read retried on a fresh connection. Each public call reads inside one read transaction.
Everything returned is JSON-safe (NaN and infinities become ``None``); strings are verbatim but
capped (:data:`CODE_CAP`, :data:`TEXT_CAP`, :data:`REJECTED_CAP`). Win rate is the mean return
of plays without the hint, clipped to [0, 1]; ``positive_share`` is the share of plays with
return > 0; regret is the mean return with the hint minus without, at ``created_step``. Public
API: :func:`snapshot`, :func:`env_detail`, :func:`episode`, :func:`bundle` (over
:class:`RunReader`) and :class:`ReportError`. Why these modes: docs/design/report.md.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from spadekit.common.errors import SpadekitError
from spadekit.runs.schema import SQLITE_MAGIC, loads, unpack_json

__all__ = ["FORMAT", "ReportError", "RunReader", "bundle", "env_detail", "episode", "snapshot"]

FORMAT = "spadekit-report/1"
CODE_CAP = 200_000
TEXT_CAP = 20_000
REJECTED_CAP = 8_000
READ_RETRIES = 4  # a read failing 5 times in a row (~0.2 s of back-off) is reported
TIMELINE_BUCKETS = 8
TIMELINE_PER_BUCKET = 3
HINT_EFFECTS = 10
_REQUIRED = {"schema_version", "environments", "plays", "episodes", "turns", "metrics", "rounds"}
_LINES = ("(length(e.code) - length(replace(e.code, char(10), ''))) + (CASE WHEN "
          "length(e.code) > 0 AND substr(e.code, -1) != char(10) THEN 1 ELSE 0 END)")
_ENV_SQL = f"""
    SELECT e.rowid AS rid, e.sha256, e.skill, e.status, e.source, e.class_name, e.created_step,
      e.retired_step, e.lineage, length(e.code) AS code_chars, {_LINES} AS code_lines,
      (e.hint IS NOT NULL AND length(e.hint) > 0) AS has_hint,
      COALESCE(SUM(p.with_hint = 0), 0) AS n_plays,
      COALESCE(SUM(p.with_hint = 1), 0) AS n_plays_with_hint,
      MIN(1.0, MAX(0.0, AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END))) AS win_rate,
      MIN(1.0, MAX(0.0, AVG(CASE WHEN p.with_hint = 1 THEN p.episode_return END)))
        AS win_rate_with_hint,
      AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return > 0 END) AS positive_share,
      AVG(CASE WHEN p.with_hint = 1 THEN p.episode_return > 0 END) AS positive_share_with_hint,
      AVG(CASE WHEN p.with_hint = 0 THEN p.episode_return END) AS mean_return,
      AVG(CASE WHEN p.with_hint = 1 AND p.step = e.created_step THEN p.episode_return END)
        - AVG(CASE WHEN p.with_hint = 0 AND p.step = e.created_step THEN p.episode_return END)
        AS regret,
      AVG(CASE WHEN p.with_hint = 0 THEN p.turns END) AS mean_turns,
      (SELECT m.designer_reward FROM memory m WHERE m.sha256 = e.sha256) AS designer_reward
    FROM environments e LEFT JOIN plays p ON p.env_sha = e.sha256
    WHERE (?1 IS NULL OR e.sha256 = ?1)
    GROUP BY e.sha256 ORDER BY e.rowid DESC"""


class ReportError(SpadekitError):
    """A run directory cannot be read as a report (missing, not a run, corrupt), or the
    environment/episode asked for does not exist in it."""

    reason = "report"


def cap(text: Any, limit: int = TEXT_CAP) -> Any:
    """``text`` cut to ``limit`` characters plus a ``…[truncated N chars]`` marker."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated {len(text) - limit} chars]"


def clean(value: Any, loose: bool = False) -> Any:
    """A JSON-safe copy: non-finite floats -> None, tuples -> lists, keys and others -> str;
    ``loose`` (the page's data) also: sets -> lists, bytes -> UTF-8 text, paths -> ``fspath``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, dict):
        return {str(k): clean(v, loose) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or loose and isinstance(value, (set, frozenset)):
        return [clean(v, loose) for v in value]
    if loose and isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if loose and isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)  # dates from YAML and the like


def _num(value: Any) -> float | None:
    try:
        return None if value is None else clean(float(value))
    except (TypeError, ValueError):  # a non-number where a number belongs
        return None


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return _num(sum(values) / len(values)) if values else None


def _json(text: Any, default: Any = None) -> Any:
    try:
        return loads(text, default)
    except (TypeError, ValueError):
        return default


def _origin(source: str | None, lineage: dict) -> str:
    """baseline (a baseline curriculum's row), bootstrap (joined the pool as a reference),
    designed (written by the designer), library (anything else: library or external programs)."""
    if lineage.get("baseline"):
        return "baseline"
    if lineage.get("bootstrap"):
        return "bootstrap"
    if (source or "").startswith("designer"):
        return "designed"
    return "library"


class RunReader:
    """One read-only connection to ``run_dir`` (``with RunReader(d) as r: r.snapshot()``).

    Opening is cheap (no full scan); keep a reader for one request or a handful of calls, not
    for hours: an immutable connection (see the module docstring) does not see later rounds.
    """

    def __init__(self, run_dir: str | Path, *, busy_timeout_ms: int = 5000) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "run.sqlite"
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._conn: sqlite3.Connection | None = None
        self._immutable = False
        if not self.run_dir.is_dir():
            raise ReportError(f"no run directory at {self.run_dir}", path=str(self.run_dir))
        if not self.path.is_file():
            raise ReportError(f"{self.run_dir} is not a spadekit run (no run.sqlite)",
                              path=str(self.run_dir))
        try:
            with open(self.path, "rb") as fh:
                head = fh.read(16)
        except OSError as exc:
            raise ReportError(f"cannot read {self.path}: {exc}", path=str(self.path)) from exc
        if head != SQLITE_MAGIC:
            raise ReportError(f"{self.path} is not a SQLite database (corrupt or not a run)",
                              path=str(self.path))
        self._retrying(f"{self.path} is unreadable", self._connect)

    def _connect(self) -> None:
        """Connect read-only: ``immutable=1`` when no writer has the database open (no
        ``-wal``), otherwise a plain ``mode=ro`` WAL reader (see the module docstring)."""
        self.close()
        wal = self.path.with_name(self.path.name + "-wal")
        self._immutable = not wal.exists()
        params = "mode=ro&immutable=1" if self._immutable else "mode=ro"
        uri = f"file:{quote(str(self.path.resolve()))}?{params}"
        conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_ms / 1000,
                               isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        self.tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not _REQUIRED <= self.tables:
            self.close()
            raise ReportError(f"{self.path} is a SQLite database but not a spadekit run "
                              f"(missing tables: {', '.join(sorted(_REQUIRED - self.tables))})",
                              path=str(self.path))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _q(self, sql: str, params: Any = ()) -> list[sqlite3.Row]:
        if self._conn is None:
            raise ReportError("the reader is closed", path=str(self.path))
        return self._conn.execute(sql, params).fetchall()

    def _read(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` inside one read transaction (connecting first when needed); SQLite
        failures are retried, then mapped to ReportError (see :meth:`_retrying`)."""
        return self._retrying(f"cannot read {self.path}", self._transaction, fn, *args)

    def _transaction(self, fn: Any, *args: Any) -> Any:
        if self._conn is None:
            self._connect()
        self._conn.execute("BEGIN")
        try:
            return clean(fn(*args))
        finally:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")

    def _retrying(self, what: str, attempt: Any, *args: Any) -> Any:
        """``attempt(*args)``, retried on a fresh connection up to :data:`READ_RETRIES` times
        with a short back-off when SQLite fails: a writer opening or closing the database
        (creating or removing ``-wal``) can fail one connection or read, never several in a
        row. A database that stays unreadable raises ReportError (``what: the error``)."""
        for tries in range(READ_RETRIES + 1):
            try:
                return attempt(*args)
            except sqlite3.Error as exc:
                self.close()
                if tries == READ_RETRIES:
                    raise ReportError(f"{what}: {type(exc).__name__}: {exc}",
                                      path=str(self.path)) from exc
                time.sleep(0.02 * (tries + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- public calls ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The overview (keys in the brief of ``spadekit-report/1``). ``None`` where nothing was
        measured: an environment's win rates, mean return and turns before its first play,
        ``regret`` unless played with and without the hint at ``created_step``, ``designer_reward``
        until scored; per skill/round ``mean_regret``/``mean_designer_reward`` when no environment
        of that skill was created that round; ``complexity`` without designed environments;
        ``run.model/setting`` without a config.yaml; ``latest_step`` before the first round; any
        NaN/inf. Unnamed skills are ``"unknown"``.
        """
        return self._read(self._snapshot)

    def env_detail(self, sha: str, max_episodes: int = 6) -> dict[str, Any]:
        return self._read(self._env_detail, sha, max_episodes)

    def episode(self, episode_id: int | str) -> dict[str, Any]:
        return self._read(self._episode, episode_id)

    def bundle(self, max_episodes_per_env: int = 2, max_envs: int = 500) -> dict[str, Any]:
        return self._read(self._bundle, max_episodes_per_env, max_envs)

    # -- building blocks ------------------------------------------------------------------------

    def _config(self, warnings: list[str]) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.is_file():
            warnings.append("config.yaml is missing")
            return {}
        try:
            import yaml

            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except Exception as exc:  # any parse/read problem is a warning, not a failure
            warnings.append(f"config.yaml is unreadable: {type(exc).__name__}: {exc}"[:500])
            return {}
        if not isinstance(data, dict):
            warnings.append("config.yaml does not hold a mapping")
            return {}
        return data

    def _summaries(self, sha: str | None = None) -> list[dict[str, Any]]:
        out = []
        for r in self._q(_ENV_SQL, (sha,)):
            lineage = _json(r["lineage"], {}) or {}
            out.append({
                "sha": r["sha256"], "short": r["sha256"][:12], "skill": r["skill"],
                "status": r["status"], "source": r["source"], "class_name": r["class_name"],
                "created_step": r["created_step"], "retired_step": r["retired_step"],
                "code_lines": int(r["code_lines"] or 0), "code_chars": int(r["code_chars"] or 0),
                "has_hint": bool(r["has_hint"]), "n_plays": int(r["n_plays"]),
                "n_plays_with_hint": int(r["n_plays_with_hint"]),
                **{k: _num(r[k]) for k in ("win_rate", "win_rate_with_hint", "positive_share",
                                           "positive_share_with_hint", "mean_return",
                                           "regret", "designer_reward", "mean_turns")},
                "origin": _origin(r["source"], lineage if isinstance(lineage, dict) else {}),
            })
        return out

    def _rounds(self) -> list[dict[str, Any]]:
        rounds = {r["step"]: {"step": r["step"], "finished_at": _num(r["finished_at"]),
                              "metrics": {}, "timings": {}}
                  for r in self._q("SELECT step, finished_at FROM rounds ORDER BY step")}
        for r in self._q("SELECT name, step, value FROM metrics ORDER BY step, name"):
            if r["step"] in rounds:
                rounds[r["step"]]["metrics"][r["name"]] = _num(r["value"])
        if "events" in self.tables:
            for r in self._q("SELECT step, data FROM events WHERE kind = 'round' ORDER BY id"):
                data = _json(r["data"], {})
                timings = data.get("timings_s") if isinstance(data, dict) else None
                if r["step"] in rounds and isinstance(timings, dict):
                    rounds[r["step"]]["timings"] = {
                        str(k): _num(v) for k, v in timings.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return [rounds[s] for s in sorted(rounds)]

    def _evals(self, warnings: list[str]) -> list[dict[str, Any]]:
        folder = self.run_dir / "evals"
        found = []
        for path in folder.glob("step-*.json") if folder.is_dir() else []:
            try:
                step = int(path.stem.split("-", 1)[1])
                data = json.loads(path.read_text(encoding="utf-8"))
                suites = {}
                for name, result in data["suites"].items():
                    summary = result.get("summary") or {}
                    suites[str(name)] = {"overall": summary.get("overall") or {},
                                         "groups": summary.get("groups") or {}}
            except Exception as exc:  # unreadable or unexpected file: listed, not fatal
                warnings.append(f"evals/{path.name} is unreadable: {type(exc).__name__}: "
                                f"{exc}"[:500])
                continue
            found.append({"step": step, "file": f"evals/{path.name}", "suites": suites})
        return sorted(found, key=lambda e: e["step"])

    def _rejected(self) -> dict[str, Any]:
        if "rejected" not in self.tables:
            return {"total": 0, "by_reason": []}
        groups = []
        for g in self._q("SELECT reason, stage, COUNT(*) AS n FROM rejected GROUP BY reason, stage"
                         " ORDER BY n DESC, reason, stage"):
            examples = []
            for r in self._q("SELECT id, step, skill, message, sha256, text FROM rejected WHERE "
                             "reason = ? AND stage IS ? ORDER BY id DESC LIMIT 3",
                             (g["reason"], g["stage"])):
                try:
                    text = zlib.decompress(r["text"]).decode("utf-8", "replace") \
                        if r["text"] else ""
                except (zlib.error, TypeError):
                    text = "(stored text is unreadable)"
                examples.append({"id": r["id"], "step": r["step"], "skill": r["skill"],
                                 "message": cap(r["message"]), "sha": r["sha256"],
                                 "text": cap(text, REJECTED_CAP)})
            groups.append({"reason": g["reason"], "stage": g["stage"], "count": g["n"],
                           "examples": examples})
        return {"total": sum(g["count"] for g in groups), "by_reason": groups}

    def _representative(self, sha: str, step: Any, with_hint: int) -> int | None:
        """The episode of ``sha`` at ``step`` whose return is closest to that side's mean."""
        rows = self._q("SELECT id, episode_return FROM episodes WHERE env_sha = ? AND step IS ? "
                       "AND with_hint = ? ORDER BY id", (sha, step, with_hint))
        if not rows:
            return None
        mean = sum(r[1] for r in rows) / len(rows)
        return min(rows, key=lambda r: (abs(r[1] - mean), r[0]))[0]

    def _snapshot(self) -> dict[str, Any]:
        warnings: list[str] = []
        config = self._config(warnings)
        reward = config.get("reward") if isinstance(config.get("reward"), dict) else {}
        curriculum = config.get("curriculum") if isinstance(config.get("curriculum"), dict) else {}
        rounds = self._rounds()
        steps = [r["step"] for r in rounds]
        envs = self._summaries()
        skill_rows = self._q(
            "SELECT COALESCE(e.skill, 'unknown') AS skill, p.step, "
            "COUNT(DISTINCT p.env_sha) AS n, AVG(p.episode_return) AS ret, "
            "MIN(1.0, MAX(0.0, AVG(p.episode_return))) AS win, "
            "AVG(p.episode_return > 0) AS share FROM plays p JOIN environments e "
            "ON e.sha256 = p.env_sha WHERE p.with_hint = 0 GROUP BY 1, 2 ORDER BY 1, 2")
        born_at: dict[Any, list] = {}  # (skill, created_step) -> environments created there
        for e in envs:
            born_at.setdefault((e["skill"] or "unknown", e["created_step"]), []).append(e)
        skills: dict[str, list] = {}
        for r in skill_rows:
            born = born_at.get((r["skill"], r["step"]), [])
            skills.setdefault(r["skill"], []).append({
                "step": r["step"], "envs_played": r["n"], "mean_return": _num(r["ret"]),
                "win_rate": _num(r["win"]), "positive_share": _num(r["share"]),
                "mean_regret": _mean([e["regret"] for e in born]),
                "mean_designer_reward": _mean([e["designer_reward"] for e in born])})
        per_env: dict[int, list] = {s: [] for s in steps}
        turns: dict[int, float | None] = {}
        for r in self._q("SELECT step, MIN(1.0, MAX(0.0, AVG(episode_return))) AS w FROM "
                         "plays WHERE with_hint = 0 GROUP BY step, env_sha ORDER BY step, w"):
            per_env.setdefault(r["step"], []).append(_num(r["w"]))
        for r in self._q("SELECT step, AVG(turns) FROM plays WHERE with_hint = 0 GROUP BY step"):
            turns[r[0]] = _num(r[1])
        designed: dict[Any, list] = {}
        for e in envs:
            if e["origin"] == "designed":
                designed.setdefault(e["created_step"], []).append(e)
        complexity = []
        for s in steps:
            born = designed.get(s, [])
            complexity.append({"step": s, "mean_turns": turns.get(s),
                               "mean_code_lines": _mean([e["code_lines"] for e in born]),
                               "mean_code_chars": _mean([e["code_chars"] for e in born])})
        effects = sorted((e for e in envs if e["regret"] is not None and e["regret"] > 0),
                         key=lambda e: (-e["regret"], e["sha"]))[:HINT_EFFECTS]
        version = self._q("SELECT MAX(version) FROM schema_version")[0][0]
        return {
            "format": FORMAT,
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run": {"name": self.run_dir.resolve().name, "path": str(self.run_dir.resolve()),
                    "model": config.get("model"), "setting": config.get("setting"),
                    "curriculum": curriculum.get("kind") or "spade", "config": config,
                    "rounds_completed": len(rounds), "latest_step": steps[-1] if steps else None,
                    "schema_version": int(version or 0)},
            "rounds": rounds,
            "metric_names": [r[0] for r in self._q(
                "SELECT DISTINCT name FROM metrics ORDER BY name")],
            "skills": skills,
            "plateau": {"low": float(reward.get("plateau_low", 0.4)),
                        "high": float(reward.get("plateau_high", 0.6)),
                        "ramp": float(reward.get("plateau_ramp", 0.25))},
            "win_rates": [{"step": s, "values": per_env.get(s, [])} for s in
                          sorted(set(steps) | set(per_env))],
            "complexity": complexity,
            "environments": envs,
            "rejected": self._rejected(),
            "timeline": _timeline(steps, envs),
            "hint_effects": [{
                "sha": e["sha"], "skill": e["skill"], "regret": e["regret"],
                "win_rate": e["win_rate"], "win_rate_with_hint": e["win_rate_with_hint"],
                "episode_without": self._representative(e["sha"], e["created_step"], 0),
                "episode_with": self._representative(e["sha"], e["created_step"], 1)}
                for e in effects],
            "evals": self._evals(warnings),
            "warnings": warnings,
        }

    def _resolve(self, sha: str) -> str:
        key = str(sha or "").strip().lower()
        if len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
            raise ReportError(f"not an environment id: {str(sha)[:80]!r} (give at least 8 hex "
                              "characters of its sha256)")
        rows = self._q("SELECT sha256 FROM environments WHERE sha256 >= ? AND sha256 < ? "
                       "ORDER BY sha256 LIMIT 2", (key, key + "g"))
        if len(rows) > 1 and rows[0][0] != key:
            raise ReportError(f"environment id {key} is ambiguous (matches "
                              f"{rows[0][0][:12]}, {rows[1][0][:12]}, ...)")
        if not rows:
            raise ReportError(f"no environment {key[:12]} in {self.run_dir}")
        return rows[0][0]

    def _env_detail(self, sha: str, max_episodes: int) -> dict[str, Any]:
        full = self._resolve(sha)
        env = self._summaries(full)[0]
        row = self._q("SELECT code, hint, validation, lineage, parents, meta FROM environments "
                      "WHERE sha256 = ?", (full,))[0]
        parents = []
        for p in _json(row["parents"], []) or []:
            p = str(p)
            hit = self._q("SELECT skill FROM environments WHERE sha256 = ?", (p,))
            mem = hit or self._q("SELECT skill FROM memory WHERE sha256 = ?", (p,))
            parents.append({"sha": p, "short": p[:12], "skill": mem[0][0] if mem else None,
                            "in_run": bool(hit)})
        black = self._q("SELECT reason FROM blacklist WHERE sha256 = ?", (full,)) \
            if "blacklist" in self.tables else []
        env.update(code=cap(row["code"], CODE_CAP), hint=cap(row["hint"]),
                   validation=_json(row["validation"]), lineage=_json(row["lineage"], {}),
                   parents=parents, meta=_json(row["meta"], {}),
                   blacklisted=black[0][0] if black else None)
        n = max(int(max_episodes), 0)
        sides = {h: self._q("SELECT id, step, with_hint, episode_return, n_turns, stop_reason, "
                            "failure FROM episodes WHERE env_sha = ? AND with_hint = ? "
                            "ORDER BY id DESC LIMIT ?", (full, h, n)) for h in (0, 1)}
        take_with = min(len(sides[1]), max(n // 2, n - len(sides[0])))
        chosen = sides[1][:take_with] + sides[0][:n - take_with]
        episodes = [{"id": r["id"], "step": r["step"], "with_hint": bool(r["with_hint"]),
                     "return": _num(r["episode_return"]), "turns": r["n_turns"],
                     "stop_reason": r["stop_reason"], "failure": _json(r["failure"])}
                    for r in sorted(chosen, key=lambda r: -r["id"])]
        return {"env": env, "episodes": episodes}

    def _episode(self, episode_id: int | str) -> dict[str, Any]:
        try:
            key = int(episode_id)
        except (TypeError, ValueError):
            raise ReportError(f"not an episode id: {str(episode_id)[:80]!r}") from None
        rows = self._q("SELECT id, env_sha, step, with_hint, hint, episode_return, stop_reason, "
                       "failure, messages FROM episodes WHERE id = ?", (key,))
        if not rows:
            raise ReportError(f"no episode {key} in {self.run_dir}")
        r = rows[0]
        try:
            raw = unpack_json(r["messages"]) or []
        except (zlib.error, ValueError, TypeError):
            raw = [{"role": "error", "content": "(stored messages are unreadable)"}]
        messages = []
        for m in raw if isinstance(raw, list) else []:
            m = m if isinstance(m, dict) else {"role": "?", "content": m}
            content = m.get("content")
            if content is not None and not isinstance(content, str):
                content = json.dumps(clean(content), ensure_ascii=False)
            messages.append({"role": str(m.get("role") or "?"), "content": cap(content)})
        turns = [{"idx": t["idx"], "action": cap(t["action"]),
                  "observation": cap(t["observation"]), "reward": _num(t["reward"]),
                  "terminated": bool(t["terminated"]), "truncated": bool(t["truncated"])}
                 for t in self._q("SELECT * FROM turns WHERE episode_id = ? ORDER BY idx",
                                  (key,))]
        return {"id": r["id"], "env_sha": r["env_sha"], "step": r["step"],
                "with_hint": bool(r["with_hint"]), "hint": cap(r["hint"]),
                "return": _num(r["episode_return"]), "stop_reason": r["stop_reason"],
                "failure": _json(r["failure"]), "messages": messages, "turns": turns}

    def _bundle(self, max_episodes_per_env: int, max_envs: int) -> dict[str, Any]:
        out = self._snapshot()
        envs = out["environments"]  # newest first
        ranked = [e for e in envs if e["origin"] == "designed"] + \
                 [e for e in envs if e["origin"] != "designed"]
        details, ids = {}, []
        for e in ranked[:max(int(max_envs), 0)]:
            details[e["sha"]] = self._env_detail(e["sha"], max_episodes_per_env)
            ids += [ep["id"] for ep in details[e["sha"]]["episodes"]]
        for h in out["hint_effects"]:
            ids += [i for i in (h["episode_without"], h["episode_with"]) if i is not None]
        out["details"] = details
        out["episodes"] = {str(i): self._episode(i) for i in sorted(set(ids))}
        return out


def _timeline(steps: list[int], envs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Representative designed environments from early to late.

    The completed rounds are split into up to :data:`TIMELINE_BUCKETS` contiguous buckets of
    (nearly) equal size; in each, the designed environments created there are ranked by how close
    their no-hint win rate is to 0.5 (never played last), then by more plays, then newest first,
    and the first :data:`TIMELINE_PER_BUCKET` are kept. Buckets without one are left out.
    ``step``/``last_step``: the bucket's first and last round.
    """
    if not steps:
        return []
    k = min(TIMELINE_BUCKETS, len(steps))
    out = []
    for b in range(k):
        chunk = steps[b * len(steps) // k:(b + 1) * len(steps) // k]
        inside = set(chunk)
        born = [(i, e) for i, e in enumerate(envs)  # i: newest first
                if e["origin"] == "designed" and e["created_step"] in inside]

        def rank(item: tuple[int, dict]) -> tuple:
            i, e = item
            w = e["win_rate"]
            return (w is None, abs((w or 0.0) - 0.5), -e["n_plays"], i)

        if born:
            out.append({"step": chunk[0], "last_step": chunk[-1],
                        "envs": [e["sha"] for _, e in sorted(born, key=rank)
                                 [:TIMELINE_PER_BUCKET]]})
    return out


def snapshot(run_dir: str | Path) -> dict[str, Any]:
    with RunReader(run_dir) as reader:
        return reader.snapshot()


def env_detail(run_dir: str | Path, sha: str, max_episodes: int = 6) -> dict[str, Any]:
    with RunReader(run_dir) as reader:
        return reader.env_detail(sha, max_episodes)


def episode(run_dir: str | Path, episode_id: int | str) -> dict[str, Any]:
    with RunReader(run_dir) as reader:
        return reader.episode(episode_id)


def bundle(run_dir: str | Path, max_episodes_per_env: int = 2,
           max_envs: int = 500) -> dict[str, Any]:
    with RunReader(run_dir) as reader:
        return reader.bundle(max_episodes_per_env, max_envs)
