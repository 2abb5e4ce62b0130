"""Asynchronous rollouts (``rollout.max_staleness >= 1``): round s generates while the
trainer updates on round s-1 (:func:`async_round`, called by ``SelfPlay._round``).

Guarantees (``docs/async.md`` has the design and the metrics): a batch is trained only while its
staleness is at most ``max_staleness`` (else cancelled: ``StaleWork``, ledger ``discarded``);
weights are pushed only between rounds, so every play of a round comes from one policy version;
the token ledger balances in every committed round (:class:`Pipeline`, else ``LedgerError``);
the queue, ledger and versions commit with the round and its checkpoint, so a killed process
resumes with the batch in training trained again exactly once; a resume that falls back to an
older checkpoint rolls the versions and ledger back with it (:meth:`Pipeline.fall_back`). With
``max_staleness = 0`` the synchronous round keeps the ledger (everything generated is trained).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from spadekit.common.errors import ConfigError
from spadekit.selfplay.staleness import (Batch, LedgerError, StaleWork, TokenLedger, partition,
                                         sample_tokens, staleness_parts)
from spadekit.train.sample import Sample

__all__ = ["BackgroundUpdate", "Pipeline", "StaleWork", "async_round", "check_async_setup"]


@dataclass
class Versions:
    """Policy versions: ``trainer`` counts the updates that changed the weights; ``generator``
    is the trainer version the generation engine's weights are (set by each successful push)."""

    trainer: int = 0
    generator: int = 0


class BackgroundUpdate:
    """``update()`` in a daemon thread; :meth:`join` waits and re-raises what it raised.

    ``on_done(stats)`` runs in the thread right after the update, under ``lock`` (the trainer's
    version moves there, so the generation side can read it exactly)."""

    def __init__(self, update: Callable[[], dict[str, Any]],
                 on_done: Callable[[dict[str, Any]], None], lock: threading.Lock):
        self._update, self._on_done, self._lock = update, on_done, lock
        self._error: BaseException | None = None
        self.stats: dict[str, Any] = {}
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="spadekit-update", daemon=True)

    def _run(self) -> None:
        try:
            stats = self._update()
            with self._lock:
                self.stats = stats
                self._on_done(stats)
        except BaseException as exc:  # re-raised in the loop's thread by join()
            self._error = exc
        finally:
            self.finished_at = time.perf_counter()

    def start(self) -> "BackgroundUpdate":
        self._thread.start()
        return self

    def join(self, *, raise_error: bool = True) -> None:
        self._thread.join()
        if self._error is not None and raise_error:
            raise self._error


class Pipeline:
    """The versions, the ledger and the queue of a run (one per ``SelfPlay``)."""

    def __init__(self, store: Any, max_staleness: int):
        self.store, self.max_staleness = store, max_staleness
        self.versions = Versions()
        self.ledger = TokenLedger()
        self.lock = threading.Lock()

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"trainer": self.versions.trainer, "generator": self.versions.generator,
                "ledger": self.ledger.state()}

    def load_state(self, state: Any) -> None:
        """The versions and ledger as :meth:`state` stored them; ``None`` (a run from before
        the pipeline, or a new one) leaves the defaults. Anything else that is not exactly
        that form (non-int or negative versions, a generator ahead of the trainer) is a
        damaged database: ``LedgerError``."""
        if state is None:
            return
        if not isinstance(state, dict) or set(state) - {"trainer", "generator", "ledger"}:
            raise LedgerError(f"stored pipeline state is not a versions mapping: {state!r:.200}")
        versions = []
        for key in ("trainer", "generator"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LedgerError(f"stored pipeline state: {key} version must be an int >= 0, "
                                  f"got {value!r}")
            versions.append(value)
        if versions[1] > versions[0]:
            raise LedgerError(f"stored pipeline state: the generator's version {versions[1]} is "
                              f"ahead of the trainer's {versions[0]}; a push never comes first")
        self.versions = Versions(*versions)
        self.ledger = TokenLedger.from_state(state.get("ledger"))

    def fall_back(self, state: Any, lost_after: int) -> list[int]:
        """A resume that loaded an older checkpoint than the last commit (the newest was
        damaged): the versions and ledger become those committed with the checkpoint that
        loaded (``state``, from its pointer), so the trainer's version is the weights' again.
        The batch that was queued then was trained only by the lost updates: its tokens become
        ``discarded``. What the queue holds now came from the lost rounds (their ledger went
        with them): dropped. Returns the dropped rounds (the caller records an event)."""
        if state is None:
            raise LedgerError(
                f"the checkpoint that loaded has no pipeline state (written before it was kept "
                f"with checkpoints), so the versions of rounds after {lost_after} cannot be "
                "rolled back; resume with the damaged checkpoint repaired, or start a new run")
        self.load_state(state)
        for row in self.ledger.rows(()):
            lost = row["generated"] - row["trained"] - row["discarded"]
            if lost < 0:
                raise LedgerError(f"stored pipeline state: version {row['version']} trained or "
                                  f"discarded more tokens than it generated ({row})")
            if lost:
                self.ledger.add("discarded", row["version"], lost)
        dropped = self.store.queued_steps()
        for step in dropped:
            self.store.drop_queued(step)
        self.save()
        return dropped

    def save(self) -> None:
        self.store.put_state("pipeline", self.state())

    # -- the queue -------------------------------------------------------------------------

    def queued(self) -> list[Batch]:
        """The batches in ``rollout_queue``, oldest first. Rows of one round must agree on
        where they came from (version, trainer start and end) and decode as samples;
        otherwise the database is damaged: ``LedgerError`` (nothing is trained from it)."""
        batches: dict[int, Batch] = {}
        for row in self.store.queued():
            origin = (row["version"], row["trainer_start"], row["trainer_end"])
            batch = batches.get(row["step"])
            if batch is None:
                batch = batches[row["step"]] = Batch(row["step"], origin[0], [], origin[1],
                                                     origin[2])
            elif origin != (batch.version, batch.trainer_start, batch.trainer_end):
                raise LedgerError(
                    f"rollout_queue: the samples of round {row['step']} disagree on their "
                    f"policy version (version, trainer start, end: {origin} vs "
                    f"{(batch.version, batch.trainer_start, batch.trainer_end)}): the run "
                    "database is damaged", step=row["step"])
            try:
                batch.samples.append(Sample(
                    role=row["role"], group_id=row["group_id"], token_ids=row["token_ids"],
                    loss_mask=row["loss_mask"], behaviour_logprobs=row["behaviour_logprobs"],
                    advantage=row["advantage"], weight=row["weight"],
                    generated_at_step=row["generated_at_step"], truncated=row["truncated"]))
            except (TypeError, ValueError) as exc:
                raise LedgerError(f"rollout_queue: a sample of round {row['step']} does not "
                                  f"decode ({exc}): the run database is damaged",
                                  step=row["step"]) from None
        return [batches[s] for s in sorted(batches)]

    def enqueue(self, batch: Batch) -> None:
        self.ledger.add("generated", batch.version, batch.tokens)
        self.store.queue_batch(
            {"step": batch.step, "version": batch.version, "trainer_start": batch.trainer_start,
             "trainer_end": batch.trainer_end},
            [{"role": s.role, "group_id": s.group_id, "token_ids": s.token_ids,
              "loss_mask": s.loss_mask, "behaviour_logprobs": s.behaviour_logprobs,
              "advantage": s.advantage, "weight": s.weight,
              "generated_at_step": s.generated_at_step, "truncated": s.truncated}
             for s in batch.samples])

    def take(self, metrics: dict[str, Any]) -> list[Sample]:
        """The queued batches the trainer may train on now (they leave the queue; the stale
        ones are cancelled: ledger ``discarded``, a ``cancelled`` event each); staleness
        metrics for the trained ones."""
        batches = self.queued()
        fresh, stale = partition(batches, self.versions.trainer, self.max_staleness)
        parts = [staleness_parts(b, self.versions.trainer) for b in fresh]
        for batch in fresh:
            self.ledger.add("trained", batch.version, batch.tokens)
            self.store.drop_queued(batch.step)
        for batch, why in stale:
            self.ledger.add("discarded", batch.version, batch.tokens)
            self.store.drop_queued(batch.step)
            self.store.append_event({"kind": "cancelled", "error": type(why).__name__,
                                     "message": str(why), **why.details})
        for key in ("staleness", "lag", "in_flight", "waiting"):
            values = [p[key] for p in parts]
            metrics[f"async/{key}_mean"] = sum(values) / len(values) if values else 0.0
            metrics[f"async/{key}_max"] = max(values) if values else 0
        metrics.update({"async/trained_batches": len(fresh),
                        "async/cancelled_batches": len(stale),
                        "async/cancelled_tokens": sum(b.tokens for b, _ in stale)})
        return [s for b in fresh for s in b.samples]

    # -- the synchronous loop's ledger -----------------------------------------------------

    def trained_now(self, samples: list[Sample], stats: dict[str, Any]) -> None:
        """``max_staleness = 0``: the round's samples are generated and trained at the trainer's
        version."""
        tokens = sum(sample_tokens(s) for s in samples)
        self.ledger.add("generated", self.versions.generator, tokens)
        self.ledger.add("trained", self.versions.generator, tokens)
        self.updated(stats)

    def updated(self, stats: dict[str, Any]) -> None:
        """An update finished: the trainer's version moves when it changed the weights."""
        if stats.get("optimizer_steps", 0):
            self.versions.trainer += 1

    # -- the record of a round -------------------------------------------------------------

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        """The ledger rows of round ``step`` (checked to balance) and its totals as metrics;
        the versions and ledger into the run's state."""
        queued = self.queued()
        rows = self.ledger.check(queued)  # LedgerError: never committed unbalanced
        self.store.record_ledger(step, rows)
        self.save()
        metrics.update({
            "async/ledger_balanced": 1,
            "async/tokens_generated": sum(r["generated"] for r in rows),
            "async/tokens_trained": sum(r["trained"] for r in rows),
            "async/tokens_discarded": sum(r["discarded"] for r in rows),
            "async/tokens_in_flight": sum(r["in_flight"] for r in rows),
            "async/policy_version": self.versions.trainer,
            "async/generator_version": self.versions.generator})


def train_metrics(stats: dict[str, Any]) -> dict[str, Any]:
    """The trainer's numeric statistics as ``train/*`` metrics."""
    return {f"train/{k}": v for k, v in stats.items() if isinstance(v, (int, float))}


def async_round(loop: Any, r: Any) -> dict[str, Any]:
    """The pipelined round ``r`` of ``loop`` (a ``SelfPlay``, its transaction open) from after
    ``begin_round`` to its commit: the update on round ``r.step - 1``'s queued samples beside
    this round's generation, then this round's batch queued and the loop's ``finish_round``."""
    pipe: Pipeline = loop.pipeline
    step = r.step
    samples = pipe.take(r.metrics)
    start, version = pipe.versions.trainer, pipe.versions.generator
    update = BackgroundUpdate(
        lambda: loop.trainer.train_step(samples) if samples else {}, pipe.updated, pipe.lock)
    t0 = time.perf_counter()
    update.start()
    failed = True
    try:
        produced = loop.generate_round(r)
        with pipe.lock:  # the trainer's version as this round's generation ended
            end = pipe.versions.trainer
        generated_at = time.perf_counter()
        failed = False
    finally:
        update.join(raise_error=not failed)  # a generation error goes first
    joined = time.perf_counter()
    finished = update.finished_at or joined
    r.timings["update"] = finished - t0
    r.metrics.update(train_metrics(update.stats))
    if loop.console is not None:
        loop.console.log(f"round {step}: update ({len(samples)} samples of round "
                         f"{step - 1}, beside generation) [dim]{finished - t0:.1f}s[/dim]")
    r.metrics.update({
        "async/trainer_wait_s": round(max(0.0, generated_at - finished), 4),
        "async/generator_wait_s": round(max(0.0, joined - generated_at), 4),
        "async/overlap_s": round(min(generated_at, finished) - t0, 4),
        "async/samples_trained": len(samples)})
    pipe.enqueue(Batch(step, version, produced, start, end))
    # the push runs every round, as in the synchronous loop (also with nothing new: a lost
    # engine is found there, whose generations only failed episode by episode)
    return loop.finish_round(r, None)


def check_async_setup(loop: Any, policy: Any, designer_policy: Any) -> None:
    """What ``max_staleness >= 1`` needs of a run (``loop``: its ``RunParts``), beyond the
    config's own checks; called once the model and the generation engine are loaded and before
    the run directory is written, so a refused run leaves nothing behind. ``designer_policy``
    is the one the caller passed (None: the designer samples from the frozen designer, the
    engine, or ``policy``)."""
    max_staleness = loop.config.rollout.max_staleness
    if not max_staleness:
        return
    if loop.gen_policy is None:
        raise ConfigError(f"rollout.max_staleness={max_staleness}: generation_model resolved "
                          "to none (auto without vLLM installed): set generation_model to an "
                          "engine (hf:PATH, tiny, vllm:PATH, openai:...) or rollout.max_staleness=0")
    if loop.dist.world_size > 1:
        raise ConfigError(f"rollout.max_staleness={max_staleness} runs in one process; under a "
                          f"launcher ({loop.dist.world_size} processes) use "
                          "rollout.max_staleness=0")
    designer = designer_policy or loop.frozen_designer or loop.gen_policy or policy
    if loop.curriculum is None and designer is policy:
        raise ConfigError(f"rollout.max_staleness={max_staleness}: the designer would sample "
                          "from the model the trainer is updating; it must use the generation "
                          "engine")
