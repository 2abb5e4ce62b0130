"""Run storage: everything a run needs after a crash, and the pool format.

Layer 2: runs.
May import: common, envs.

- ``store``: ``RunStore``, the run directory; each round commits in one transaction, so a crash
  loses at most the round in flight. ``schema``: its SQLite schema, version and migrations.
- ``pool``: the environment-pool directory (``pool.jsonl``, ``programs/``, ``rejected.jsonl``).
- ``tracking`` (adapter in ``tracking_base``): each round also to experiment trackers (W&B,
  trackio), never stopping the run.
- ``sources``: where fixed programs come from (library, pool, run, a folder of ``.py`` files).
"""
