"""What one experiment-tracking backend (W&B, trackio) must do for a self-play run.

A :class:`Tracker` is a thin adapter over one package: :meth:`Tracker.start` opens (or, on a
resume, continues) the tracked run ``run_id``, :meth:`Tracker.log` sends one round's scalars at
its step, :meth:`Tracker.log_environments` that round's environments as a table, and
:meth:`Tracker.close` finishes the run. Adapters may raise anything: ``spadekit.runs.tracking``
wraps every call, so a failing backend is disabled there and the run goes on.

:class:`TrackingStart` is what ``start`` gets; :data:`ENV_COLUMNS` are the columns of the
environments table, the same for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spadekit.common.errors import SpadekitError

__all__ = ["ENV_COLUMNS", "Tracker", "TrackerMissing", "TrackingStart"]

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


class Tracker:
    """One backend (see the module docstring); subclasses set ``name`` and ``package``."""

    name = ""
    package = ""
    """The module ``start`` imports (missing: :class:`TrackerMissing`)."""

    def start(self, how: TrackingStart) -> None:
        raise NotImplementedError

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_environments(self, step: int, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _import(self) -> Any:
        """The backend's package, or :class:`TrackerMissing` naming the extra to install."""
        import importlib

        try:
            return importlib.import_module(self.package)
        except ImportError as exc:
            raise TrackerMissing(f"logging backend {self.name!r} needs the {self.package} "
                                 f"package: pip install -e \".[{self.name}]\" ({exc})",
                                 backend=self.name) from None
