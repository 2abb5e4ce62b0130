"""Experiment tracking of a self-play run: ``logging.backends`` (``--log wandb --log trackio``).

:data:`BACKENDS` is the explicit registry (name -> :class:`~spadekit.runs.tracking_base.Backend`),
:class:`LoggingConfig` the config section, :class:`Tracking` drives the chosen backends for one
run. Guarantees: the tracked run's ``run_id`` is kept in the run database (state ``tracking``),
so ``--resume`` continues it; committed rounds a backend has not logged yet are sent at start;
no step is logged twice per backend; tracking never raises: a failing backend is disabled for
the rest of the process with one warning and a ``tracking_disabled`` event, and the run goes on.
Only rank 0 tracks. Details: docs/tracking.md.
"""

from __future__ import annotations

import secrets
from dataclasses import field
from pathlib import Path
from typing import Any, Callable

from spadekit.common.config_fields import Str, section
from spadekit.common.errors import ConfigError
from spadekit.runs.tracking_base import (BUILTIN, ENV_COLUMNS, Backend, Tracker, TrackerMissing,
                                         TrackingStart)

__all__ = ["BACKENDS", "CODE_CAP", "LoggingConfig", "Tracking", "register_backend",
           "round_environments", "scalar_metrics"]

BACKENDS: dict[str, Backend] = {}
"""The tracking backends by name (filled below, explicitly)."""


def register_backend(backend: Backend) -> None:
    """Add a wandb-style backend under ``backend.name`` (a name is registered once)."""
    if not isinstance(backend, Backend):
        raise TypeError(f"a tracking backend must be a Backend, got {backend!r}")
    if not backend.name or BACKENDS.get(backend.name, backend) != backend:
        raise ValueError(f"backend {backend.name!r} is already registered or unnamed")
    BACKENDS[backend.name] = backend


for _backend in BUILTIN:
    register_backend(_backend)


@section(knob="logging")
class LoggingConfig:
    """Experiment tracking (``docs/tracking.md``)."""

    backends: list[Str] = field(default_factory=list)
    """Trackers each round is also sent to: ``wandb``, ``trackio`` (optional extras:
    ``pip install -e ".[wandb]"``). Empty: none. CLI: ``--log wandb --log trackio``. On
    ``--resume`` a non-empty list given on the command line replaces the stored one."""
    project: Str = "spadekit"
    """The tracker's project the run is logged under."""
    name: Str | None = None
    """The tracked run's display name; None: the run directory's name."""

    def __post_init__(self) -> None:
        known = sorted(BACKENDS)
        for name in self.backends:
            if name not in BACKENDS:
                raise ConfigError(f"logging.backends: unknown backend {name!r}; valid: "
                                  f"{', '.join(known)}")
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError(f"logging.backends lists a backend twice: {self.backends}")
        if not self.project or "/" in self.project:
            raise ConfigError(f"logging.project must be a plain non-empty name, got "
                              f"{self.project!r}")


STATE_KEY = "tracking"


class Tracking:
    """The chosen backends of one run (see the module docstring). ``store`` is the run's
    ``RunStore``; ``warn`` prints one line on the run's console."""

    def __init__(self, config: LoggingConfig, store: Any, run_dir: str | Path,
                 run_config: dict[str, Any], *, resume: bool,
                 warn: Callable[[str], None] | None = None,
                 backends: dict[str, Backend] | None = None) -> None:
        self.config, self.store, self.run_dir = config, store, Path(run_dir)
        self.warn = warn or (lambda _text: None)
        registry = BACKENDS if backends is None else backends
        self.live: dict[str, Tracker] = {}
        self.disabled: dict[str, str] = {}
        self._where: dict[str, Any] = {}
        state = self._state()
        if not config.backends:
            return
        run_id = state.get("run_id") or _new_run_id(self.run_dir)
        state["run_id"] = run_id
        self._put(state)
        name = config.name or self.run_dir.resolve().name
        logged = state.get("logged", {})
        self._where = {"project": config.project, "name": name, "run_id": run_id}
        for backend in config.backends:
            how = TrackingStart(run_id=run_id, name=name, project=config.project,
                                config=run_config, resume=resume and backend in logged,
                                run_dir=self.run_dir)
            tracker = self._start(backend, registry[backend], how)
            if tracker is not None:
                self.live[backend] = tracker
                self._event({"kind": "tracking_started", "backend": backend,
                             **self._where, "resumed": how.resume})
        self._catch_up()

    # -- the calls -------------------------------------------------------------------------

    def log_round(self, step: int, metrics: dict[str, Any]) -> None:
        """Round ``step`` (committed): its scalars and its environments, to every live backend
        that has not logged ``step`` yet."""
        if not self.live:
            return
        scalars = scalar_metrics(metrics)
        rows: list[dict[str, Any]] | None = None
        for backend in list(self.live):
            if step <= self._last(backend):
                continue
            if rows is None:
                rows = self._rows(step)
            self._send(backend, step, scalars, rows or [])

    def close(self) -> None:
        for backend, tracker in list(self.live.items()):
            self._call(backend, "close", tracker.close)
        self.live.clear()

    @property
    def run_id(self) -> str | None:
        return self._state().get("run_id")

    # -- helpers ---------------------------------------------------------------------------

    def _send(self, backend: str, step: int, scalars: dict[str, float],
              rows: list[dict[str, Any]]) -> None:
        tracker = self.live[backend]
        if self._call(backend, "log", tracker.log, step, scalars, rows):
            state = self._state()
            state.setdefault("logged", {})[backend] = step
            self._put(state)

    def _catch_up(self) -> None:
        """Committed rounds a live backend has not logged, from the run database."""
        if not self.live:
            return
        first = min(self._last(b) for b in self.live)
        try:
            steps = [s for s in self.store.completed_rounds() if s > first]
            values: dict[int, dict[str, float]] = {}
            for row in self.store.query("SELECT name, step, value FROM metrics WHERE step > ? "
                                        "ORDER BY step", (first,)):
                values.setdefault(row[1], {})[row[0]] = row[2]
        except Exception as exc:  # noqa: BLE001 - tracking never stops the run
            self.warn(f"tracking: could not read the logged rounds back ({exc}); "
                      "earlier rounds are not sent")
            return
        for step in steps:
            self.log_round(step, values.get(step, {}))

    def _rows(self, step: int) -> list[dict[str, Any]]:
        try:
            return round_environments(self.store, step)
        except Exception as exc:  # noqa: BLE001
            self.warn(f"tracking: round {step}'s environments could not be read ({exc})")
            return []

    def _start(self, backend: str, spec: Backend, how: TrackingStart) -> Tracker | None:
        """A started tracker, or None (disabled) when starting it fails."""
        tracker = None
        try:
            tracker = Tracker(spec)
            tracker.start(how)
            return tracker
        except Exception as exc:  # noqa: BLE001 - a tracker never stops the run
            self._disable(backend, "start", exc)
            if tracker is not None:
                try:  # whatever half of it started
                    tracker.close()
                except Exception:  # noqa: BLE001
                    pass
            return None

    def _call(self, backend: str, stage: str, fn: Callable, *args: Any) -> bool:
        """``fn(*args)``; on any failure the backend is disabled (once) and False returned."""
        try:
            fn(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - a tracker never stops the run
            self._disable(backend, stage, exc)
            return False

    def _disable(self, backend: str, stage: str, exc: BaseException) -> None:
        tracker = self.live.pop(backend, None)
        if backend in self.disabled:
            return
        message = f"{type(exc).__name__}: {exc}"[:500]
        self.disabled[backend] = message
        self.warn(f"warning: logging backend {backend} disabled ({stage} failed: {message}); "
                  "the run goes on without it")
        self._event({"kind": "tracking_disabled", "backend": backend, **self._where,
                     "stage": stage, "error": type(exc).__name__, "message": message,
                     "missing": isinstance(exc, TrackerMissing)})
        state = self._state()
        failures = state.setdefault("failures", {})
        failures[backend] = failures.get(backend, 0) + 1
        self._put(state)
        if tracker is not None and stage != "close":
            try:  # let it flush what it can (a wandb run left open would block the exit)
                tracker.close()
            except Exception:  # noqa: BLE001
                pass

    def _event(self, event: dict[str, Any]) -> None:
        try:
            self.store.append_event(event)
        except Exception:  # noqa: BLE001 - the store's own failure shows in the round
            pass

    def _last(self, backend: str) -> int:
        return int(self._state().get("logged", {}).get(backend, -1))

    def _state(self) -> dict[str, Any]:
        try:
            return dict(self.store.get_state(STATE_KEY, {}) or {})
        except Exception:  # noqa: BLE001
            return {}

    def _put(self, state: dict[str, Any]) -> None:
        try:
            self.store.put_state(STATE_KEY, state)
        except Exception as exc:  # noqa: BLE001
            self.warn(f"tracking: could not record its state in the run database ({exc})")


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalars of a round's metrics, as TensorBoard gets them: numbers, not bools, not
    ``step``."""
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def _new_run_id(run_dir: Path) -> str:
    """``<run directory name>-<8 hex>``, in the characters every backend accepts."""
    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_dir.resolve().name)
    return f"{base.strip('-')[:48] or 'run'}-{secrets.token_hex(4)}"


_PLAYED_SQL = """
    SELECT e.sha256, e.skill, e.status, e.source, e.lineage, e.created_step,
      length(e.code) AS code_chars, length(COALESCE(e.hint, '')) AS hint_chars, e.code,
      SUM(p.with_hint = 0 AND p.step = ?1) AS plays,
      MIN(1.0, MAX(0.0, AVG(CASE WHEN p.with_hint = 0 AND p.step = ?1
                                 THEN p.episode_return END))) AS win_rate,
      AVG(CASE WHEN p.with_hint = 1 AND p.step = e.created_step THEN p.episode_return END)
        - AVG(CASE WHEN p.with_hint = 0 AND p.step = e.created_step THEN p.episode_return END)
        AS regret,
      (SELECT m.designer_reward FROM memory m WHERE m.sha256 = e.sha256) AS designer_reward
    FROM environments e JOIN plays p ON p.env_sha = e.sha256
    WHERE e.sha256 IN (SELECT env_sha FROM plays WHERE step = ?1)
    GROUP BY e.sha256 ORDER BY e.rowid"""


def round_environments(store: Any, step: int) -> list[dict[str, Any]]:
    """Round ``step``'s environments (:data:`ENV_COLUMNS`, in that order): those played in
    it, then the designs rejected in it; ``code`` capped at :data:`CODE_CAP` characters."""
    import json
    import zlib

    rows = []
    for r in store.query(_PLAYED_SQL, (int(step),)):
        lineage = json.loads(r["lineage"] or "{}") if isinstance(r["lineage"], str) else {}
        origin = ("bootstrap" if lineage.get("bootstrap") else "baseline"
                  if lineage.get("baseline") else "designed")
        rows.append(_row(round=step, sha=r["sha256"][:12], skill=r["skill"], origin=origin,
                         valid=True, status=r["status"], reason="ok",
                         plays=int(r["plays"] or 0), win_rate=r["win_rate"],
                         regret=r["regret"], designer_reward=r["designer_reward"],
                         code_chars=int(r["code_chars"] or 0),
                         hint_chars=int(r["hint_chars"] or 0), code=r["code"]))
    for r in store.query("SELECT sha256, skill, reason, text FROM rejected WHERE step = ? "
                         "ORDER BY id", (int(step),)):
        text = zlib.decompress(r["text"]).decode("utf-8", "replace") if r["text"] else ""
        rows.append(_row(round=step, sha=(r["sha256"] or "")[:12], skill=r["skill"],
                         origin="designed", valid=False, status="rejected",
                         reason=r["reason"], plays=0, win_rate=None, regret=None,
                         designer_reward=None, code_chars=len(text), hint_chars=0, code=text))
    return rows


CODE_CAP = 20_000
"""Characters of a program (or rejected output) kept in the table (the rest is marked)."""


def _row(**values: Any) -> dict[str, Any]:
    code = values["code"] or ""
    if len(code) > CODE_CAP:
        values["code"] = code[:CODE_CAP] + f"…[truncated {len(code) - CODE_CAP} chars]"
    return {column: values[column] for column in ENV_COLUMNS}
