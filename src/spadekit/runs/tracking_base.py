"""One adapter for the wandb-style tracking API (``init``, ``run.log``, ``Table``, ``finish``).

W&B and trackio share that API; a :class:`Backend` says how one of them is opened, and a
:class:`Tracker` drives it for a run: :meth:`Tracker.start` opens (on a resume, continues) the
tracked run ``run_id``, :meth:`Tracker.log` sends a round as ONE log entry at ``step=`` the round
(its scalars and its environments table under ``environments``, :data:`ENV_COLUMNS`), and
:meth:`Tracker.close` finishes the run. Adapters may raise anything: ``spadekit.runs.tracking``
wraps every call, so a failing backend is disabled there and the run goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from spadekit.common.errors import SpadekitError

__all__ = ["BUILTIN", "ENV_COLUMNS", "Backend", "Tracker", "TrackerMissing", "TrackingStart"]

ENV_COLUMNS = ("round", "sha", "skill", "origin", "valid", "status", "reason", "plays",
               "win_rate", "regret", "designer_reward", "code_chars", "hint_chars", "code")
"""The environments table of a round: one row per environment played in the round (``valid``
true) and per design rejected in it (``valid`` false, ``reason`` says why). ``win_rate`` is the
round's no-hint mean return clipped to [0, 1], ``regret`` the hinted minus the no-hint mean
return at the environment's creation round, ``designer_reward`` the scored delayed reward (None
until scored), as the dashboard counts them (``spadekit.report.data``)."""


class TrackerMissing(SpadekitError):
    """A tracking backend's package is not installed (``pip install -e ".[NAME]"``)."""

    reason = "tracking_missing"


@dataclass(frozen=True)
class TrackingStart:
    """What a backend needs to open its run."""

    run_id: str
    """Stable for the run directory (``spadekit.runs.tracking``): a resume continues it."""
    name: str
    """The run's display name (``logging.name``, default the run directory's name)."""
    project: str
    config: dict[str, Any]
    """The run's resolved config (``config.yaml``)."""
    resume: bool
    """True when the run directory already holds this tracked run."""
    run_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """How one wandb-style package is opened: ``init_kwargs(start)`` are the arguments of its
    ``init`` (always with ``resume="allow"``), ``table_kwargs`` extra arguments of its
    ``Table``; ``quiet`` keeps its own prints off the run's stdout."""

    name: str
    package: str
    init_kwargs: Callable[[TrackingStart], dict[str, Any]]
    table_kwargs: dict[str, Any] = field(default_factory=dict)
    quiet: bool = False


def _wandb_init(how: TrackingStart) -> dict[str, Any]:
    # files under $WANDB_DIR, else the run directory; WANDB_MODE=offline works the same
    return {"project": how.project, "name": how.name, "id": how.run_id, "config": how.config,
            "dir": os.environ.get("WANDB_DIR") or str(how.run_dir), "reinit": "create_new"}


def _trackio_init(how: TrackingStart) -> dict[str, Any]:
    # trackio names a run by its name: the stable run_id; the display name is its group
    return {"project": how.project, "name": how.run_id, "group": how.name,
            "config": how.config, "embed": False, "auto_log_gpu": False, "auto_log_cpu": False}


BUILTIN = (Backend("wandb", "wandb", _wandb_init),
           Backend("trackio", "trackio", _trackio_init, {"allow_mixed_types": True}, quiet=True))
"""W&B (``pip install -e ".[wandb]"``) and trackio (``pip install -e ".[trackio]"``)."""


class Tracker:
    """One backend driven for one run (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name
        self.module: Any = None
        self.run: Any = None

    def start(self, how: TrackingStart) -> None:
        """Open (or continue) the tracked run; :class:`TrackerMissing` without the package."""
        try:
            self.module = importlib.import_module(self.backend.package)
        except ImportError as exc:
            raise TrackerMissing(f"logging backend {self.name!r} needs the "
                                 f"{self.backend.package} package: pip install -e "
                                 f"\".[{self.name}]\" ({exc})", backend=self.name) from None
        with self._quiet():
            self.run = self.module.init(resume="allow", **self.backend.init_kwargs(how))

    def log(self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """Round ``step``: its scalars and its environments table, as one log entry."""
        table = self.module.Table(columns=list(ENV_COLUMNS),
                                  data=[[row[c] for c in ENV_COLUMNS] for row in rows],
                                  **self.backend.table_kwargs)
        self.run.log({**metrics, "environments": table}, step=step)

    def close(self) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        current = getattr(getattr(self.module, "context_vars", None), "current_run", None)
        with self._quiet():
            if current is not None and current.get() is run:
                self.module.finish()  # trackio: also forgets it, no second finish at exit
            else:
                run.finish()

    def _quiet(self) -> contextlib.AbstractContextManager:
        if self.backend.quiet:
            return contextlib.redirect_stdout(io.StringIO())
        return contextlib.nullcontext()
