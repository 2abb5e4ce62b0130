"""Run storage: everything a run needs after a crash, and the pool format.

Layer 2: runs.
May import: common, envs.

- ``store``: ``RunStore``, the run directory (``config.yaml``, ``run.sqlite`` in WAL mode,
  ``checkpoints/step-N/``, ``events.jsonl``); each round commits in one transaction, so a crash
  loses at most the round in flight and ``--resume`` continues the same run.
- ``schema``: the SQLite schema, its version and migrations (old run directories open and
  resume).
- ``pool``: the environment-pool directory (``pool.jsonl``, ``programs/``, ``rejected.jsonl``).
- ``tracking`` (with ``tracking_base``, one adapter for the wandb-style API): each round also
  to experiment trackers (``logging.backends``: W&B, trackio), never stopping the run.
- ``sources``: where fixed programs come from (``library``, a pool directory, a run directory, a
  folder of ``.py`` files).
"""
