"""Bounded staleness and the token ledger of asynchronous rollouts (``rollout.max_staleness``).

Each round's samples are a :class:`Batch` tagged with the policy version (weight-changing
updates the generation engine had received) that generated them. A trainer at version ``t``
trains a batch only when ``t - batch.version <= max_staleness``; older work is a counted
:class:`StaleWork` cancellation, never an error. :func:`staleness_parts` splits the staleness
into ``lag + in_flight + waiting`` (behind at the start, moved on during generation, moved on
in the queue). The designer's SPADE delay (``regen_interval``) is not counted here: the
trainer's importance weights correct it. :class:`TokenLedger` keeps, per version,
``generated == trained + discarded + in_flight`` loss tokens at every commit. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from spadekit.common.errors import SpadekitError

__all__ = ["Batch", "LedgerError", "StaleWork", "TokenLedger", "partition", "staleness_parts"]


class StaleWork(SpadekitError):
    """A batch older than ``rollout.max_staleness`` policy versions: cancelled, not trained.
    A counted cancellation the loop records (never raised out of a round)."""

    reason = "stale"


class LedgerError(SpadekitError):
    """The token ledger does not balance, or its stored form is unreadable."""

    reason = "ledger"


@dataclass
class Batch:
    """One round's training samples with where they came from.

    ``version``: the generation engine's policy version while the round generated them;
    ``trainer_start``/``trainer_end``: the trainer's version when that generation began and
    ended (for :func:`staleness_parts`); ``step``: the round that produced them."""

    step: int
    version: int
    samples: list[Any]
    trainer_start: int
    trainer_end: int

    @property
    def tokens(self) -> int:
        return sum(sample_tokens(s) for s in self.samples)


def sample_tokens(sample: Any) -> int:
    """A sample's loss tokens (the tokens the policy produced and is trained on)."""
    return int(sum(sample.loss_mask))


def staleness_parts(batch: Batch, trainer_version: int) -> dict[str, int]:
    """How stale ``batch`` is when the trainer at ``trainer_version`` takes it, and where the
    staleness arose: ``lag + in_flight + waiting == staleness`` (see the module docstring)."""
    lag = batch.trainer_start - batch.version
    in_flight = batch.trainer_end - batch.trainer_start
    waiting = trainer_version - batch.trainer_end
    parts = {"lag": lag, "in_flight": in_flight, "waiting": waiting,
             "staleness": trainer_version - batch.version}
    if min(lag, in_flight, waiting) < 0:
        raise LedgerError(f"batch of round {batch.step}: versions out of order ({parts}); "
                          "a policy version never goes back")
    return parts


def partition(batches: Iterable[Batch], trainer_version: int, max_staleness: int
              ) -> tuple[list[Batch], list[tuple[Batch, StaleWork]]]:
    """The batches the trainer at ``trainer_version`` may train on (staleness at most
    ``max_staleness``, the checked ``rollout.max_staleness``) and the cancelled ones, each with
    its :class:`StaleWork`. The bound is exact: queue time counts."""
    fresh, stale = [], []
    for batch in batches:
        parts = staleness_parts(batch, trainer_version)
        if parts["staleness"] <= max_staleness:
            fresh.append(batch)
        else:
            stale.append((batch, StaleWork(
                f"round {batch.step}'s {len(batch.samples)} samples ({batch.tokens} tokens) "
                f"were generated at policy version {batch.version}; the trainer is at "
                f"{trainer_version}, {parts['staleness']} versions newer, over "
                f"rollout.max_staleness={max_staleness}: cancelled", step=batch.step,
                version=batch.version, trainer_version=trainer_version, **parts)))
    return fresh, stale


@dataclass
class TokenLedger:
    """Loss tokens per policy version: generated, trained, discarded (``in_flight`` is derived
    from the queue at each commit). ``state()``/``from_state`` store it in the run database."""

    generated: dict[int, int] = field(default_factory=dict)
    trained: dict[int, int] = field(default_factory=dict)
    discarded: dict[int, int] = field(default_factory=dict)

    def add(self, kind: str, version: int, tokens: int) -> None:
        if kind not in ("generated", "trained", "discarded"):
            raise ValueError(f"TokenLedger.add: unknown kind {kind!r}")
        if tokens < 0:
            raise ValueError(f"TokenLedger.add: negative token count {tokens}")
        book = getattr(self, kind)
        book[version] = book.get(version, 0) + int(tokens)

    def rows(self, queued: Iterable[Batch]) -> list[dict[str, int]]:
        """One row per version: ``version, generated, trained, discarded, in_flight``."""
        in_flight: dict[int, int] = {}
        for batch in queued:
            in_flight[batch.version] = in_flight.get(batch.version, 0) + batch.tokens
        versions = sorted(set(self.generated) | set(self.trained) | set(self.discarded)
                          | set(in_flight))
        return [{"version": v, "generated": self.generated.get(v, 0),
                 "trained": self.trained.get(v, 0), "discarded": self.discarded.get(v, 0),
                 "in_flight": in_flight.get(v, 0)} for v in versions]

    def check(self, queued: Iterable[Batch]) -> list[dict[str, int]]:
        """The rows, after checking that every version balances (``LedgerError`` otherwise)."""
        rows = self.rows(queued)
        for row in rows:
            if row["generated"] != row["trained"] + row["discarded"] + row["in_flight"]:
                raise LedgerError(f"the token ledger does not balance at policy version "
                                  f"{row['version']}: {row}", **row)
        return rows

    def state(self) -> dict[str, dict[str, int]]:
        return {kind: {str(v): n for v, n in getattr(self, kind).items()}
                for kind in ("generated", "trained", "discarded")}

    @classmethod
    def from_state(cls, state: Any) -> "TokenLedger":
        """Inverse of :meth:`state`; ``LedgerError`` for anything else (a damaged database)."""
        ledger = cls()
        if state is None:
            return ledger
        if not isinstance(state, dict):
            raise LedgerError(f"stored token ledger is not a mapping: {type(state).__name__}")
        for kind in ("generated", "trained", "discarded"):
            book = state.get(kind, {})
            if not isinstance(book, dict):
                raise LedgerError(f"stored token ledger: {kind} is not a mapping")
            for key, n in book.items():
                if not (isinstance(key, str) and key.isascii() and key.lstrip("-").isdigit()) or \
                        isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise LedgerError(f"stored token ledger: bad entry {kind}[{key!r}] = {n!r}")
                getattr(ledger, kind)[int(key)] = n
        return ledger
