"""Named random streams: one run seed, an independent stream for each purpose.

``stream(seed, name, *keys, secret=...)`` is a ``random.Random`` seeded from SHA-256 of the run
seed, the run's secret stream key, the stream's name (one of :data:`STREAMS`) and its keys.
Guarantees: independence (one purpose's draws never move another's); no hidden state (a resumed
run draws what the uninterrupted run drew, on every machine); secrecy (a program without
``SelfPlayConfig.stream_key`` cannot compute which seeds it will be played on).
:class:`RoundStreams` hands out one round's streams, each continued after its first use.
"""

from __future__ import annotations

import hashlib
import json
import random

__all__ = ["STREAMS", "RoundStreams", "derive_seed", "stream"]

#: The registry of stream names and what each one draws.
STREAMS: dict[str, str] = {
    "corpus": "the grounding document of each designer prompt",
    "memory": "the memory references (positive and negative) in each designer prompt",
    "design": "the designer's sampling seeds, its repair turns and the judge",
    "validation": "the validator's seeds and probes, per program",
    "hints": "hint sampling and the leak checks' seeds, per program",
    "bootstrap": "which reference environments join the pool",
    "play": "the agent's play seeds, per environment (hinted plays under 'play_hint')",
    "play_hint": "the agent's hinted play seeds, per environment",
    "spot_checks": "the watch's spot checks and their garbage, per environment",
    "order": "the order of the episodes in a round's batch",
    "curriculum": "a baseline curriculum's draws (fixed pool, RLVE ladder)",
}


def derive_seed(seed: int, name: str, *keys: int | str, secret: str = "") -> int:
    """A 64-bit seed for stream ``name`` with ``keys`` under run seed ``seed`` and the run's
    secret stream key ``secret``."""
    if name not in STREAMS:
        raise ValueError(f"unknown random stream {name!r}; known: {', '.join(sorted(STREAMS))}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a run seed is an int, got {seed!r}")
    if not isinstance(secret, str):
        raise TypeError(f"a stream secret is a str, got {type(secret).__name__}")
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"a stream key is an int or a str, got {key!r}")
    text = json.dumps(["spadekit-stream", 2, seed, secret, name, *keys], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def stream(seed: int, name: str, *keys: int | str, secret: str = "") -> random.Random:
    """A fresh ``random.Random`` for stream ``name`` with ``keys`` under run seed ``seed``."""
    return random.Random(derive_seed(seed, name, *keys, secret=secret))


class RoundStreams:
    """The streams of round ``step`` of a run seeded with ``seed`` (and keyed with ``secret``):
    :meth:`get` returns the same generator for the same name and key within the round, so its
    draws continue."""

    def __init__(self, seed: int, step: int, secret: str = "") -> None:
        self.seed, self.step, self.secret = seed, step, secret
        self._made: dict[tuple, random.Random] = {}

    def get(self, name: str, key: int | str | None = None) -> random.Random:
        keys = (self.step,) if key is None else (self.step, key)
        made = self._made.get((name, *keys))
        if made is None:
            made = self._made[(name, *keys)] = stream(self.seed, name, *keys,
                                                      secret=self.secret)
        return made

    def __repr__(self) -> str:
        return f"RoundStreams(seed={self.seed}, step={self.step})"
