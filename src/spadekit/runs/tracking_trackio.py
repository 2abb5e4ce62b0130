"""The trackio backend of ``logging.backends`` (``pip install -e ".[trackio]"``): local-first,
its store is SQLite under ``$TRACKIO_DIR`` (default ``~/.cache/huggingface/trackio``, one
``<project>.db`` per project), its dashboard ``trackio show --project spadekit``; no network.

trackio names a run by its ``name``, so the tracked run is named by the stable ``run_id`` (the
display name is its ``group``) and opened with ``resume="allow"``: a resume continues it. Each
round is one trackio log entry at ``step=`` the round: its scalars and its environments as a
``trackio.Table`` under ``environments`` (:data:`spadekit.runs.tracking_base.ENV_COLUMNS`),
sent together by :meth:`TrackioTracker.log_environments` (so a step is one entry, not two).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from spadekit.runs.tracking_base import ENV_COLUMNS, Tracker, TrackingStart

__all__ = ["TrackioTracker"]


class TrackioTracker(Tracker):
    name = "trackio"
    package = "trackio"

    def __init__(self) -> None:
        self.run: Any = None
        self.trackio: Any = None
        self._pending: tuple[int, dict[str, float]] | None = None

    def start(self, how: TrackingStart) -> None:
        self.trackio = trackio = self._import()
        with _quiet():  # trackio prints its banner; the run's console says what matters
            self.run = trackio.init(project=how.project, name=how.run_id, group=how.name,
                                    config=how.config, resume="allow", embed=False,
                                    auto_log_gpu=False, auto_log_cpu=False)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._flush()
        self._pending = (step, dict(metrics))

    def log_environments(self, step: int, rows: list[dict[str, Any]]) -> None:
        pending, self._pending = self._pending, None
        metrics = pending[1] if pending is not None and pending[0] == step else {}
        if pending is not None and pending[0] != step:
            self.run.log(pending[1], step=pending[0])
        table = self.trackio.Table(columns=list(ENV_COLUMNS),
                                   data=[[row[c] for c in ENV_COLUMNS] for row in rows],
                                   allow_mixed_types=True)
        self.run.log({**metrics, "environments": table}, step=step)

    def close(self) -> None:
        self._flush()
        run, self.run = self.run, None
        if run is None:
            return
        current = getattr(getattr(self.trackio, "context_vars", None), "current_run", None)
        with _quiet():
            if current is not None and current.get() is run:
                self.trackio.finish()  # also forgets it: no second finish at exit
            else:
                run.finish()

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and self.run is not None:
            self.run.log(pending[1], step=pending[0])


def _quiet() -> contextlib.AbstractContextManager:
    """trackio's own prints (project banner, "Run finished") kept off the run's stdout."""
    return contextlib.redirect_stdout(io.StringIO())
