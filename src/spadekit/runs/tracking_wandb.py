"""The Weights & Biases backend of ``logging.backends`` (``pip install -e ".[wandb]"``).

One W&B run per run directory: ``wandb.init(id=run_id, resume="allow")``, so a resume continues
it (offline too: ``WANDB_MODE=offline`` writes ``wandb/offline-run-*/run-<id>.wandb`` files that
``wandb sync`` uploads later, and every session of the run carries the same id). Its files go
under ``$WANDB_DIR``, or the run directory when that is unset. Each round is one W&B step
(``step=`` the round): its scalars, then its environments as a ``wandb.Table`` under the key
``environments`` (:data:`spadekit.runs.tracking_base.ENV_COLUMNS`).
"""

from __future__ import annotations

import os
from typing import Any

from spadekit.runs.tracking_base import ENV_COLUMNS, Tracker, TrackingStart

__all__ = ["WandbTracker"]


class WandbTracker(Tracker):
    name = "wandb"
    package = "wandb"

    def __init__(self) -> None:
        self.run: Any = None
        self.wandb: Any = None

    def start(self, how: TrackingStart) -> None:
        self.wandb = wandb = self._import()
        self.run = wandb.init(project=how.project, name=how.name, id=how.run_id,
                              resume="allow", config=how.config,
                              dir=os.environ.get("WANDB_DIR") or str(how.run_dir),
                              reinit="create_new")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_environments(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = self.wandb.Table(columns=list(ENV_COLUMNS),
                                 data=[[row[c] for c in ENV_COLUMNS] for row in rows])
        self.run.log({"environments": table}, step=step)

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish()
