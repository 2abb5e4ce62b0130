"""The policy's own replies as a spot-check baseline.

Drawn garbage, however model-like, is a grammar; a program can pay for what the policy writes
and garbage does not (a sentence before the box, a phrase the hint asks for). So the watch also
replays, on a pooled program, replies the agent wrote in earlier rounds to OTHER programs: real
model text of the policy being trained, which cannot hold this program's answer for this seed.
They are judged as garbage (their mean return must be ``action_margin`` below the solution's on
the same seeds). Read from the run database's stored episodes (``turns.action`` is exactly the
text the environment got); empty before the first round is recorded, when the drawn garbage
stands alone.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["REPLY_SCAN", "recent_replies", "reply_actions"]

REPLY_SCAN = 400
"""At most this many of the most recent stored agent turns are read per program checked."""


def recent_replies(store: Any, exclude_sha: str, limit: int = REPLY_SCAN) -> list[list[str]]:
    """The actions of the most recent stored agent episodes of environments other than
    ``exclude_sha`` (newest first; each episode's actions in turn order, from its last
    ``limit`` turns at most), empty replies left out."""
    rows = store.query(
        "SELECT t.episode_id, t.idx, t.action FROM turns t JOIN episodes e "
        "ON e.id = t.episode_id WHERE e.env_sha != ? AND e.role = 'agent' "
        "AND t.action IS NOT NULL AND t.action != '' ORDER BY t.episode_id DESC, t.idx "
        "LIMIT ?", (exclude_sha, int(limit)))
    episodes: dict[int, list[str]] = {}
    for episode_id, _idx, action in rows:
        if isinstance(action, str):
            episodes.setdefault(int(episode_id), []).append(action)
    return list(episodes.values())


def reply_actions(episodes: list[list[str]], n: int, rng: random.Random) -> list[str]:
    """``n`` replies for one scripted episode, each drawn from all the stored ones (a model's
    turns answer another program's observations, so one order is as good as another); empty
    when there are none."""
    pool = [reply for episode in episodes for reply in episode]
    if not pool or n <= 0:
        return []
    return [rng.choice(pool) for _ in range(n)]
